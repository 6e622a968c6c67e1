//! The on-disk layout (trees, keys, records), its version, and the
//! migrations from older versions.
//!
//! Layout, schema version 1. Keys are big-endian integers ([`crate::keys`]);
//! values are JSON (readable in a dump, and a field added with
//! `#[serde(default)]` needs no migration).
//!
//! | tree                     | key                          | value                   |
//! |--------------------------|------------------------------|-------------------------|
//! | sled's default tree      | `schema_version`             | `1`                     |
//! |                          | `next_conversation`, `next_fact` | the next id (from 1) |
//! | `conversations`          | conversation id              | [`ConversationRecord`]  |
//! | `messages`               | conversation id ‖ seq        | [`MessageRecord`]       |
//! | `facts`                  | fact id                      | [`FactRecord`]          |
//! | `summaries`              | conversation id              | [`SummaryRecord`]       |
//! | `settings`               | the setting's name, UTF-8    | any JSON value          |
//!
//! A reply's text and state live in one record, so no crash can leave a reply
//! marked complete with partial text. Besides sled's files the directory holds
//! [`MARKER`], written after the version is flushed: it lets [`crate::Store::open`]
//! tell "sled lost everything" from "new database", and refuse a newer
//! database before sled reads it.

use std::io::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{MessageId, MessageState, Role};

/// The schema version this build writes and reads. Older databases are
/// migrated on open; newer ones are refused.
///
/// Bump it for any change an older revis would misread, including a change
/// of sled's own on-disk format.
pub const SCHEMA_VERSION: u32 = 1;

/// Keys in sled's default tree.
pub(crate) const VERSION_KEY: &[u8] = b"schema_version";
pub(crate) const NEXT_CONVERSATION_KEY: &[u8] = b"next_conversation";
pub(crate) const NEXT_FACT_KEY: &[u8] = b"next_fact";

/// Tree names, also used in error messages.
pub(crate) const META: &str = "meta";
pub(crate) const CONVERSATIONS: &str = "conversations";
pub(crate) const MESSAGES: &str = "messages";
pub(crate) const FACTS: &str = "facts";
pub(crate) const SUMMARIES: &str = "summaries";
pub(crate) const SETTINGS: &str = "settings";
pub(crate) const TREES: [&str; 5] = [CONVERSATIONS, MESSAGES, FACTS, SUMMARIES, SETTINGS];

/// The file, inside the database directory, that records the schema version
/// outside sled.
pub(crate) const MARKER: &str = "revis-store.json";

/// A conversation; its id is the key.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ConversationRecord {
    pub title: String,
    pub created_ms: u64,
    pub updated_ms: u64,
    /// The seq the next message gets. It only grows: a seq is never given
    /// twice, even after [`crate::Store::rewind`] removed the messages that had it.
    pub next_seq: u64,
    /// How many messages a rewind removed, so the conversation holds
    /// `next_seq - removed`. Absent (0) in records that never had one,
    /// which is every record older revis wrote.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub removed: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A message; its id is the key.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct MessageRecord {
    pub role: Role,
    pub text: String,
    pub state: MessageState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    pub created_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_ms: Option<u64>,
}

/// A profile fact; its id is the key.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct FactRecord {
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<MessageId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub said: Option<String>,
    pub created_ms: u64,
}

/// A conversation's summary; the conversation id is the key.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct SummaryRecord {
    /// The seq of the last message covered.
    pub covers_up_to: u64,
    pub text: String,
    pub created_ms: u64,
}

/// The marker file's contents.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Marker {
    pub schema_version: u32,
}

/// A step from version `i` to `i + 1`. It must stamp `i + 1` itself, in the
/// same batch or transaction as its changes, or be safe to run again: a crash
/// can stop it anywhere and the next open runs it again.
pub(crate) type Migration = fn(&sled::Db) -> sled::Result<()>;

/// `MIGRATIONS[i]` migrates from version `i`.
pub(crate) const MIGRATIONS: [Migration; SCHEMA_VERSION as usize] = [v0_to_v1];

/// Version 0 is a database sled created that was never stamped: a new one,
/// or one whose first open was cut off. Version 1 creates the trees and the
/// id counters. Each step is idempotent and stamps last.
fn v0_to_v1(db: &sled::Db) -> sled::Result<()> {
    for tree in TREES {
        db.open_tree(tree)?;
    }
    for counter in [NEXT_CONVERSATION_KEY, NEXT_FACT_KEY] {
        // Set only when missing; a rerun keeps what an earlier run wrote.
        let _ = db.compare_and_swap(counter, None::<&[u8]>, Some(json(&1u64)))?;
    }
    db.insert(VERSION_KEY, json(&1u32))?;
    Ok(())
}

/// Runs `migrations[from..]` in order, flushing after each; returns the
/// version reached. Panics if a migration forgets to stamp its version: that
/// is a bug in this crate, caught by its tests.
pub(crate) fn migrate(db: &sled::Db, from: u32, migrations: &[Migration]) -> sled::Result<u32> {
    let mut version = from;
    for migration in migrations.iter().skip(from as usize) {
        tracing::info!(from = version, to = version + 1, "migrating the revis database");
        migration(db)?;
        db.flush()?;
        let stamped = db.get(VERSION_KEY)?.and_then(|v| serde_json::from_slice::<u32>(&v).ok());
        assert_eq!(stamped, Some(version + 1), "migration from {version} did not stamp its version");
        version += 1;
    }
    Ok(version)
}

/// A value as stored: JSON. Our records always serialize.
pub(crate) fn json<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("store records serialize to JSON")
}

/// Reads the marker: `Ok(None)` when there is none; `Err` with the
/// operating system's error when it cannot be read; `Ok(Some(Err))` when it
/// is there but is not a marker.
pub(crate) fn read_marker(dir: &Path) -> std::io::Result<Option<Result<Marker, serde_json::Error>>> {
    match std::fs::read(dir.join(MARKER)) {
        Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes the marker atomically (temporary file, fsync, rename, fsync the
/// directory), so it is either the old one or the new one.
pub(crate) fn write_marker(dir: &Path, marker: &Marker) -> std::io::Result<()> {
    let tmp = dir.join(format!("{MARKER}.tmp"));
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(&json(marker))?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, dir.join(MARKER))?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;
    use crate::ConversationId;

    /// The on-disk encoding is the schema: a change here needs a new version
    /// (or a `#[serde(default)]` field) and a migration.
    #[test]
    fn records_encode_as_documented() {
        let show = |bytes: Vec<u8>| String::from_utf8(bytes).unwrap();
        let conversation = ConversationRecord { title: "Trip".into(), created_ms: 1, updated_ms: 2, next_seq: 3, removed: 0 };
        expect![[r#"{"title":"Trip","created_ms":1,"updated_ms":2,"next_seq":3}"#]].assert_eq(&show(json(&conversation)));
        let rewound = ConversationRecord { removed: 2, ..conversation };
        expect![[r#"{"title":"Trip","created_ms":1,"updated_ms":2,"next_seq":3,"removed":2}"#]].assert_eq(&show(json(&rewound)));
        // A record written before rewinds existed reads as one that never had one.
        let old: ConversationRecord = serde_json::from_slice(br#"{"title":"Trip","created_ms":1,"updated_ms":2,"next_seq":3}"#).unwrap();
        assert_eq!(old.removed, 0);
        let reply = MessageRecord {
            role: Role::Assistant,
            text: "Hi".into(),
            state: MessageState::Incomplete,
            tier: Some("tier2".into()),
            created_ms: 5,
            completed_ms: None,
        };
        expect![[r#"{"role":"assistant","text":"Hi","state":"incomplete","tier":"tier2","created_ms":5}"#]].assert_eq(&show(json(&reply)));
        let user = MessageRecord {
            role: Role::User,
            text: "Hello".into(),
            state: MessageState::Complete,
            tier: None,
            created_ms: 4,
            completed_ms: Some(4),
        };
        expect![[r#"{"role":"user","text":"Hello","state":"complete","created_ms":4,"completed_ms":4}"#]].assert_eq(&show(json(&user)));
        let fact = FactRecord {
            text: "Likes tea".into(),
            source: Some(MessageId { conversation: ConversationId(1), seq: 0 }),
            said: None,
            created_ms: 6,
        };
        expect![[r#"{"text":"Likes tea","source":{"conversation":1,"seq":0},"created_ms":6}"#]].assert_eq(&show(json(&fact)));
        let summary = SummaryRecord { covers_up_to: 7, text: "They planned".into(), created_ms: 8 };
        expect![[r#"{"covers_up_to":7,"text":"They planned","created_ms":8}"#]].assert_eq(&show(json(&summary)));
        expect![[r#"{"schema_version":1}"#]].assert_eq(&show(json(&Marker { schema_version: SCHEMA_VERSION })));
    }

    fn stamp(db: &sled::Db, version: u32) -> sled::Result<()> {
        db.insert(VERSION_KEY, json(&version)).map(drop)
    }

    fn version(db: &sled::Db) -> Option<u32> {
        db.get(VERSION_KEY).unwrap().map(|v| serde_json::from_slice(&v).unwrap())
    }

    #[test]
    fn migrations_run_in_order_from_the_stored_version() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::open(dir.path()).unwrap();
        // A chain of three, the last two test-only: each appends its number.
        fn step(db: &sled::Db, n: u32) -> sled::Result<()> {
            let mut log = db.get("log")?.map(|v| v.to_vec()).unwrap_or_default();
            log.push(b'0' + n as u8);
            db.insert("log", log)?;
            stamp(db, n + 1)
        }
        let chain: [Migration; 3] = [v0_to_v1, |db| step(db, 1), |db| step(db, 2)];

        assert_eq!(migrate(&db, 0, &chain).unwrap(), 3);
        assert_eq!(version(&db), Some(3));
        assert_eq!(db.get("log").unwrap().as_deref(), Some(&b"12"[..]));
        assert_eq!(db.tree_names().len(), 1 + TREES.len());

        // From version 2 only the last step runs.
        stamp(&db, 2).unwrap();
        assert_eq!(migrate(&db, 2, &chain).unwrap(), 3);
        assert_eq!(db.get("log").unwrap().as_deref(), Some(&b"122"[..]));
        // Already current: nothing runs.
        assert_eq!(migrate(&db, 3, &chain).unwrap(), 3);
        assert_eq!(db.get("log").unwrap().as_deref(), Some(&b"122"[..]));
    }

    #[test]
    fn v0_to_v1_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::open(dir.path()).unwrap();
        v0_to_v1(&db).unwrap();
        db.insert(NEXT_CONVERSATION_KEY, json(&9u64)).unwrap();
        // As if a crash had cut the first run short: running again keeps the counter.
        v0_to_v1(&db).unwrap();
        assert_eq!(db.get(NEXT_CONVERSATION_KEY).unwrap().as_deref(), Some(&b"9"[..]));
        assert_eq!(db.get(NEXT_FACT_KEY).unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(version(&db), Some(1));
    }

    #[test]
    #[should_panic(expected = "did not stamp")]
    fn a_migration_that_forgets_to_stamp_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::open(dir.path()).unwrap();
        let chain: [Migration; 1] = [|_| Ok(())];
        let _ = migrate(&db, 0, &chain);
    }
}
