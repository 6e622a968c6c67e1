//! Round trips: what is written is there, in order, after a reopen; and the
//! API's refusals.

use expect_test::expect;
use revis_store::{ConversationId, MessageId, MessageState, Role, StoreError};
use serde_json::json;

use crate::{dump, open, temp_db};

#[test]
fn everything_written_is_there_after_reopening() {
    let (_tmp, dir) = temp_db();
    let store = open(&dir);
    let trip = store.create_conversation("Trip to Lisbon").unwrap();
    let other = store.create_conversation("Tea").unwrap();

    let question = store.append_user(trip, "What should I pack?").unwrap();
    let reply = store.begin_reply(trip, "tier2").unwrap();
    store.update_reply(reply, "Light").unwrap();
    store.update_reply(reply, "Light clothes").unwrap();
    store.complete_reply(reply, "Light clothes and a jacket.").unwrap();
    store.append_user(trip, "Thanks — merci 🙏").unwrap();
    let cut = store.begin_reply(trip, "tier3").unwrap();
    store.update_reply(cut, "You're").unwrap();
    store.append_user(other, "Green or black?").unwrap();

    store.add_fact("Is travelling to Lisbon", Some(question)).unwrap();
    let tea = store.add_fact("Drinks tea", None).unwrap();
    store.add_fact("Prefers short answers", None).unwrap();
    assert!(store.remove_fact(tea).unwrap());
    assert!(!store.remove_fact(tea).unwrap());
    store.put_summary(trip, reply, "Packing for Lisbon.").unwrap();
    store.set_setting("theme", &json!("dark")).unwrap();
    store.set_setting("tiers", &json!({"tier2": {"offload": true}})).unwrap();
    store.set_setting("gone", &json!(1)).unwrap();
    assert!(store.remove_setting("gone").unwrap());
    let before = dump(&store);
    drop(store);

    let store = open(&dir);
    assert_eq!(dump(&store), before);
    // Most recently updated first: "Tea" got the last message.
    expect![[r#"
        conversation 2 "Tea" (1 messages)
          2:0 User: "Green or black?"
        conversation 1 "Trip to Lisbon" (4 messages)
          1:0 User: "What should I pack?"
          1:1 Assistant (tier2): "Light clothes and a jacket."
          1:2 User: "Thanks — merci 🙏"
          1:3 Assistant (tier3) [incomplete]: "You're"
          summary up to 1:1: "Packing for Lisbon."
        fact 1 "Is travelling to Lisbon" (from 1:0)
        fact 3 "Prefers short answers"
    "#]]
    .assert_eq(&before);
    assert_eq!(store.setting("theme").unwrap(), Some(json!("dark")));
    assert_eq!(store.setting("tiers").unwrap(), Some(json!({"tier2": {"offload": true}})));
    assert_eq!(store.setting("gone").unwrap(), None);

    let reply = store.message(reply).unwrap().unwrap();
    assert_eq!((reply.role, reply.state, reply.tier.as_deref()), (Role::Assistant, MessageState::Complete, Some("tier2")));
    assert!(reply.completed_ms.unwrap() >= reply.created_ms);
    let trip = store.conversation(trip).unwrap().unwrap();
    assert!(trip.updated_ms >= trip.created_ms && trip.created_ms > 1_700_000_000_000);
    // The unfinished reply can still be finished after the reopen.
    store.complete_reply(cut, "You're welcome.").unwrap();
    assert_eq!(store.message(cut).unwrap().unwrap().state, MessageState::Complete);
}

#[test]
fn messages_after_gives_what_a_summary_does_not_cover() {
    let (_tmp, dir) = temp_db();
    let store = open(&dir);
    let conv = store.create_conversation("c").unwrap();
    let ids: Vec<MessageId> = (0..5).map(|i| store.append_user(conv, &i.to_string()).unwrap()).collect();
    // A neighbour's messages must not leak into the range.
    let next = store.create_conversation("d").unwrap();
    store.append_user(next, "other").unwrap();

    let texts = |after| store.messages_after(after).unwrap().into_iter().map(|m| m.text).collect::<Vec<_>>();
    assert_eq!(texts(ids[1]), ["2", "3", "4"]);
    assert_eq!(texts(ids[4]), Vec::<String>::new());
    assert_eq!(texts(MessageId { conversation: conv, seq: u64::MAX }), Vec::<String>::new());
}

#[test]
fn deleting_a_conversation_takes_its_messages_and_summary() {
    let (_tmp, dir) = temp_db();
    let store = open(&dir);
    let gone = store.create_conversation("gone").unwrap();
    let kept = store.create_conversation("kept").unwrap();
    let m = store.append_user(gone, "secret").unwrap();
    store.begin_reply(gone, "tier2").unwrap();
    store.put_summary(gone, m, "a secret").unwrap();
    store.append_user(kept, "hello").unwrap();
    store.add_fact("knows a secret", Some(m)).unwrap();

    assert!(store.delete_conversation(gone).unwrap());
    assert!(!store.delete_conversation(gone).unwrap());
    drop(store);
    let store = open(&dir);
    assert_eq!(store.conversation(gone).unwrap(), None);
    assert_eq!(store.message(m).unwrap(), None);
    assert_eq!(store.summary(gone).unwrap(), None);
    expect![[r#"
        conversation 2 "kept" (1 messages)
          2:0 User: "hello"
        fact 1 "knows a secret" (from 1:0)
    "#]]
    .assert_eq(&dump(&store));
    // Ids are never reused.
    assert_eq!(store.create_conversation("new").unwrap(), ConversationId(3));
}

#[test]
fn refusals_say_what_is_wrong() {
    let (_tmp, dir) = temp_db();
    let store = open(&dir);
    let conv = store.create_conversation("c").unwrap();
    let user = store.append_user(conv, "hi").unwrap();
    let reply = store.begin_reply(conv, "tier2").unwrap();
    store.complete_reply(reply, "hello").unwrap();
    let missing = ConversationId(99);

    let errors = [
        store.append_user(missing, "x").unwrap_err(),
        store.begin_reply(missing, "tier2").unwrap_err(),
        store.messages(missing).unwrap_err(),
        store.set_title(missing, "x").unwrap_err(),
        store.update_reply(reply, "changed").unwrap_err(),
        store.complete_reply(reply, "changed").unwrap_err(),
        store.complete_reply(user, "x").unwrap_err(),
        store.update_reply(MessageId { conversation: conv, seq: 9 }, "x").unwrap_err(),
        store.put_summary(missing, user, "x").unwrap_err(),
        store.put_summary(conv, MessageId { conversation: conv, seq: 2 }, "x").unwrap_err(),
    ];
    let shown: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    expect![[r#"
        [
            "no conversation 99",
            "no conversation 99",
            "no conversation 99",
            "no conversation 99",
            "message 1:1 is not an open reply (it is a user message or already complete)",
            "message 1:1 is not an open reply (it is a user message or already complete)",
            "message 1:0 is not an open reply (it is a user message or already complete)",
            "no message 1:9",
            "message 1:0 is not in conversation 99",
            "no message 1:2",
        ]
    "#]]
    .assert_debug_eq(&shown);
    // A refused completion changed nothing.
    assert_eq!(store.message(reply).unwrap().unwrap().text, "hello");
}

#[test]
fn titles_and_listing_order() {
    let (_tmp, dir) = temp_db();
    let store = open(&dir);
    let a = store.create_conversation("a").unwrap();
    let b = store.create_conversation("b").unwrap();
    let c = store.create_conversation("c").unwrap();
    // Timestamps are milliseconds: let the clock move between updates.
    next_millisecond();
    store.append_user(a, "bump a").unwrap();
    next_millisecond();
    store.set_title(b, "b renamed").unwrap();
    let listed: Vec<(u64, String)> = store.conversations().unwrap().into_iter().map(|c| (c.id.0, c.title)).collect();
    // Updated last first; `c` was never touched after creation.
    assert_eq!(listed[0], (2, "b renamed".to_owned()));
    assert_eq!(listed[1].0, 1);
    assert_eq!(listed[2].0, c.0);
    assert_eq!(store.conversation(a).unwrap().unwrap().message_count, 1);
}

/// Waits (spinning, at most a millisecond) until the wall clock's millisecond changes.
pub(crate) fn next_millisecond() {
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    let start = now();
    while now() == start {
        std::hint::spin_loop();
    }
}

#[test]
fn clones_on_many_threads_append_without_losing_or_reusing_a_seq() {
    let (_tmp, dir) = temp_db();
    let store = open(&dir);
    let conv = store.create_conversation("busy").unwrap();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || (0..50).map(|i| store.append_user(conv, &format!("{t}/{i}")).unwrap()).collect::<Vec<_>>())
        })
        .collect();
    let mut ids: Vec<MessageId> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    ids.sort();
    let seqs: Vec<u64> = ids.iter().map(|id| id.seq).collect();
    assert_eq!(seqs, (0..200).collect::<Vec<_>>());
    assert_eq!(store.messages(conv).unwrap().len(), 200);
    assert_eq!(store.conversation(conv).unwrap().unwrap().message_count, 200);
}

/// A second opener (here the same process; `crash.rs` has two) shares the
/// database through the first, reads its writes and is read; when the
/// first closes, the second takes it over with everything in it.
#[test]
fn a_second_opener_shares_the_database_and_takes_it_over() {
    let (_tmp, dir) = temp_db();
    let first = open(&dir);
    let second = open(&dir);
    assert!(first.is_holder() && !second.is_holder());
    let mode = std::fs::metadata(revis_store::socket_path(&dir)).unwrap().permissions();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o600, "the socket is the user's alone");
    let a = first.create_conversation("from the first").unwrap();
    let b = second.create_conversation("from the second").unwrap();
    let m = second.append_user(a, "written by the second").unwrap();
    assert_eq!(first.message(m).unwrap().unwrap().text, "written by the second");
    assert_eq!(second.conversation(b).unwrap().unwrap().title, "from the second");
    // Errors keep their kind across the socket.
    let none = ConversationId(9999);
    assert!(matches!(second.append_user(none, "x"), Err(StoreError::NoConversation(c)) if c == none));
    drop(first);
    let m2 = second.append_user(b, "after the first closed").unwrap();
    assert!(second.is_holder(), "the second took the database over");
    assert_eq!(second.messages(a).unwrap().len(), 1);
    assert_eq!(second.message(m2).unwrap().unwrap().text, "after the first closed");
    drop(second);
    assert_eq!(open(&dir).conversations().unwrap().len(), 2);
}

#[cfg(unix)]
#[test]
fn the_directory_is_private() {
    use std::os::unix::fs::PermissionsExt as _;
    let (_tmp, dir) = temp_db();
    drop(open(&dir));
    assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
    // A directory others could read is narrowed.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    drop(open(&dir));
    assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
}

/// A reply cut short keeps exactly the text given (the text that was shown),
/// stays incomplete after a reopen, and a finished reply cannot be cut.
#[test]
fn a_cut_reply_keeps_what_was_shown_and_stays_incomplete() {
    let (_tmp, dir) = temp_db();
    let store = open(&dir);
    let conv = store.create_conversation("c").unwrap();
    let cut = store.begin_reply(conv, "tier2").unwrap();
    store.update_reply(cut, "Once").unwrap();
    store.cut_reply(cut, "Once upon a time, 🙂").unwrap();
    let done = store.begin_reply(conv, "tier2").unwrap();
    store.complete_reply(done, "whole").unwrap();
    assert!(matches!(store.cut_reply(done, "x").unwrap_err(), StoreError::NotAnOpenReply(id) if id == done));
    drop(store);

    let store = open(&dir);
    let m = store.message(cut).unwrap().unwrap();
    assert_eq!((m.text.as_str(), m.state, m.completed_ms), ("Once upon a time, 🙂", MessageState::Incomplete, None));
    assert_eq!(store.message(done).unwrap().unwrap().text, "whole");
}
