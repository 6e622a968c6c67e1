//! Rewinding a conversation (an edit or a regeneration): the tail goes, the
//! rest stays, seqs are never given twice, a summary of removed text goes
//! with it; the same through a guest.

use expect_test::expect;
use revis_store::{ConversationId, MessageId, Store, StoreError};

use crate::{dump, open, temp_db};

/// A conversation of `n` messages, user and reply in turn, the replies complete.
fn conversation(store: &Store, title: &str, n: usize) -> (ConversationId, Vec<MessageId>) {
    let conv = store.create_conversation(title).unwrap();
    let ids = (0..n)
        .map(|i| {
            if i % 2 == 0 {
                store.append_user(conv, &format!("question {i}")).unwrap()
            } else {
                let reply = store.begin_reply(conv, "tier2").unwrap();
                store.complete_reply(reply, &format!("answer {i}")).unwrap();
                reply
            }
        })
        .collect();
    (conv, ids)
}

fn texts(store: &Store, conv: ConversationId) -> Vec<String> {
    store.messages(conv).unwrap().into_iter().map(|m| m.text).collect()
}

#[test]
fn rewinding_removes_exactly_the_tail_and_never_gives_a_seq_twice() {
    let (_tmp, dir) = temp_db();
    let store = open(&dir);
    let (conv, ids) = conversation(&store, "edited", 6);
    let (other, _) = conversation(&store, "neighbour", 2);
    let before = store.conversation(conv).unwrap().unwrap();
    crate::roundtrip::next_millisecond();

    let removed = store.rewind(ids[3]).unwrap();
    assert_eq!(removed.iter().map(|m| m.id).collect::<Vec<_>>(), ids[3..]);
    assert_eq!(removed.iter().map(|m| m.text.as_str()).collect::<Vec<_>>(), ["answer 3", "question 4", "answer 5"]);
    assert_eq!(texts(&store, conv), ["question 0", "answer 1", "question 2"]);
    assert_eq!(texts(&store, other), ["question 0", "answer 1"], "another conversation is left alone");
    let after = store.conversation(conv).unwrap().unwrap();
    assert_eq!(after.message_count, 3);
    assert!(after.updated_ms > before.updated_ms, "a rewind is a change");

    // The next message comes after every removed one.
    let next = store.append_user(conv, "question 2, edited").unwrap();
    assert_eq!(next.seq, 6);
    let reply = store.begin_reply(conv, "tier2").unwrap();
    store.update_reply(reply, "cut").unwrap();
    for gone in &ids[3..] {
        assert_eq!(store.message(*gone).unwrap(), None);
    }
    assert_eq!(store.messages_after(ids[2]).unwrap().iter().map(|m| m.id.seq).collect::<Vec<_>>(), [6, 7], "across the gap");

    // Rewinding from a gap takes what comes after it.
    assert_eq!(store.rewind(ids[4]).unwrap().iter().map(|m| m.id.seq).collect::<Vec<_>>(), [6, 7]);
    // From past the end: nothing, and nothing changes.
    let unchanged = store.conversation(conv).unwrap().unwrap();
    assert!(store.rewind(MessageId { conversation: conv, seq: 8 }).unwrap().is_empty());
    assert!(store.rewind(MessageId { conversation: conv, seq: u64::MAX }).unwrap().is_empty());
    assert_eq!(store.conversation(conv).unwrap().unwrap(), unchanged);
    assert_eq!(store.append_user(conv, "again").unwrap().seq, 8);

    let shown = dump(&store);
    drop(store);
    let store = open(&dir);
    assert_eq!(dump(&store), shown, "on disk");
    expect![[r#"
        conversation 1 "edited" (4 messages)
          1:0 User: "question 0"
          1:1 Assistant (tier2): "answer 1"
          1:2 User: "question 2"
          1:8 User: "again"
        conversation 2 "neighbour" (2 messages)
          2:0 User: "question 0"
          2:1 Assistant (tier2): "answer 1"
    "#]]
    .assert_eq(&shown);

    // The whole of it, and a conversation with gaps still deletes whole.
    assert_eq!(store.rewind(ids[0]).unwrap().len(), 4);
    assert_eq!(store.conversation(conv).unwrap().unwrap().message_count, 0);
    assert_eq!(store.append_user(conv, "fresh").unwrap().seq, 9);
    assert!(store.delete_conversation(conv).unwrap());
    assert_eq!(store.message(MessageId { conversation: conv, seq: 9 }).unwrap(), None);

    let missing = ConversationId(99);
    assert!(matches!(store.rewind(MessageId { conversation: missing, seq: 0 }), Err(StoreError::NoConversation(c)) if c == missing));
}

#[test]
fn a_summary_goes_only_when_it_covered_a_removed_message() {
    let (_tmp, dir) = temp_db();
    let store = open(&dir);
    let (conv, ids) = conversation(&store, "c", 6);

    store.put_summary(conv, ids[1], "the first turn").unwrap();
    store.rewind(ids[4]).unwrap();
    assert_eq!(store.summary(conv).unwrap().map(|s| s.text).as_deref(), Some("the first turn"), "it covers nothing removed");

    store.put_summary(conv, ids[3], "two turns").unwrap();
    store.rewind(ids[3]).unwrap();
    assert_eq!(store.summary(conv).unwrap(), None, "it summarised a removed reply");

    // A removed message cannot be summarised any more, though its seq is below the next.
    let err = store.put_summary(conv, ids[3], "stale").unwrap_err();
    assert!(matches!(err, StoreError::NoMessage(id) if id == ids[3]), "{err}");
    store.put_summary(conv, ids[2], "kept").unwrap();
    drop(store);
    assert_eq!(open(&dir).summary(conv).unwrap().map(|s| s.covers_up_to), Some(ids[2]));
}

/// A guest (a second process; here a second opener) rewinds through the
/// holder: the holder sees it at once, the removed messages cross the socket
/// whole, errors keep their kind.
#[test]
fn a_guest_rewinds_through_the_holder() {
    let (_tmp, dir) = temp_db();
    let holder = open(&dir);
    let guest = open(&dir);
    assert!(holder.is_holder() && !guest.is_holder());
    let (conv, ids) = conversation(&holder, "shared", 4);
    holder.put_summary(conv, ids[2], "most of it").unwrap();
    let before = holder.messages(conv).unwrap();

    assert_eq!(guest.rewind(ids[2]).unwrap(), before[2..]);
    assert_eq!(texts(&holder, conv), ["question 0", "answer 1"]);
    assert_eq!(holder.summary(conv).unwrap(), None);
    assert_eq!(guest.append_user(conv, "edited").unwrap().seq, 4);
    assert_eq!(holder.conversation(conv).unwrap().unwrap().message_count, 3);
    assert!(guest.rewind(MessageId { conversation: conv, seq: 5 }).unwrap().is_empty());
    let missing = ConversationId(99);
    assert!(matches!(guest.rewind(MessageId { conversation: missing, seq: 0 }), Err(StoreError::NoConversation(c)) if c == missing));
}
