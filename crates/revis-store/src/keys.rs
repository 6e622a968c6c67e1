//! Key encodings: big-endian integers, so sled's byte order is numeric order
//! and a conversation's messages are one contiguous, ordered key range.

use crate::{ConversationId, MessageId};

/// An 8-byte big-endian key (conversation and fact ids, counters).
pub(crate) fn u64_key(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

/// The inverse of [`u64_key`]; `None` when the length is wrong.
pub(crate) fn decode_u64(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.try_into().ok()?))
}

/// A message's key: conversation id ‖ seq, 16 bytes.
pub(crate) fn message_key(id: MessageId) -> [u8; 16] {
    let mut key = [0; 16];
    key[..8].copy_from_slice(&u64_key(id.conversation.0));
    key[8..].copy_from_slice(&u64_key(id.seq));
    key
}

/// The inverse of [`message_key`]; `None` when the length is wrong.
pub(crate) fn decode_message_key(bytes: &[u8]) -> Option<MessageId> {
    if bytes.len() != 16 {
        return None;
    }
    Some(MessageId { conversation: ConversationId(decode_u64(&bytes[..8])?), seq: decode_u64(&bytes[8..])? })
}

/// A key for error messages: hex, or the id when it decodes as one.
pub(crate) fn show(bytes: &[u8]) -> String {
    match bytes.len() {
        8 => decode_u64(bytes).map(|n| n.to_string()),
        16 => decode_message_key(bytes).map(|m| m.to_string()),
        _ => std::str::from_utf8(bytes).ok().map(|s| format!("{s:?}")),
    }
    .unwrap_or_else(|| bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn message_id() -> impl Strategy<Value = MessageId> {
        (any::<u64>(), any::<u64>()).prop_map(|(c, seq)| MessageId { conversation: ConversationId(c), seq })
    }

    proptest! {
        #[test]
        fn u64_keys_round_trip_and_keep_order(a: u64, b: u64) {
            prop_assert_eq!(decode_u64(&u64_key(a)), Some(a));
            prop_assert_eq!(a.cmp(&b), u64_key(a).cmp(&u64_key(b)));
        }

        #[test]
        fn message_keys_round_trip_and_keep_order(a in message_id(), b in message_id()) {
            prop_assert_eq!(decode_message_key(&message_key(a)), Some(a));
            prop_assert_eq!(a.cmp(&b), message_key(a).cmp(&message_key(b)));
            // A conversation's messages sit under its 8-byte prefix.
            prop_assert!(message_key(a).starts_with(&u64_key(a.conversation.0)));
        }
    }

    #[test]
    fn keys_show_readably() {
        assert_eq!(show(&u64_key(42)), "42");
        let m = MessageId { conversation: ConversationId(1), seq: 2 };
        assert_eq!(show(&message_key(m)), "1:2");
        assert_eq!(show(b"theme"), "\"theme\"");
        assert_eq!(show(&[0xff, 0x00, 0x01]), "ff0001");
        assert_eq!(decode_u64(&[1, 2, 3]), None);
        assert_eq!(decode_message_key(&[0; 15]), None);
    }
}
