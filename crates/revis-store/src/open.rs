//! Opening a database: where it lives, the schema check and migrations, and
//! what happens to a damaged one (moved aside, replaced, reported).

use std::ffi::OsString;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::error::{Result, StoreError};
use crate::schema::{self, MARKER, Marker, SCHEMA_VERSION, VERSION_KEY};
use crate::store::Db;

/// sled's page cache limit. sled's default is 1 GiB; a chat history needs far less.
const CACHE_CAPACITY: u64 = 64 * 1024 * 1024;

/// How long a fresh database, just moved aside from a damaged one, may take
/// to be let go by sled (it holds its lock a moment after the last handle
/// is dropped, longer while it flushes on a busy machine).
const LOCK_WAIT: Duration = Duration::from_secs(3);
pub(crate) const LOCK_POLL: Duration = Duration::from_millis(5);

/// A damaged database that was moved aside and replaced by an empty one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// The database directory (now holding the fresh database).
    pub path: PathBuf,
    /// Where the damaged database now is (`<dir>.damaged-<unix ms>`), kept as
    /// it was found, or as sled left it after failing to read it.
    pub damaged_path_moved_to: PathBuf,
    /// What was wrong with it.
    pub error: String,
}

impl fmt::Display for Recovered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the database at {} could not be read ({}); it was moved to {} and a new, empty \
             database was created",
            self.path.display(),
            self.error,
            self.damaged_path_moved_to.display()
        )
    }
}

/// Why an attempt to open failed: damage is repaired by moving it aside;
/// anything else (permissions, a lock, a newer version) is the caller's.
enum Failure {
    Fatal(StoreError),
    Damaged(String),
}

impl Db {
    /// Opens the database in `dir` for this process alone, creating it
    /// (mode 0700) if needed (see [`Store::open`](crate::Store::open) for what is done with an
    /// older, newer or damaged one). [`StoreError::Locked`] at once when
    /// another process holds it.
    pub(crate) fn open_exclusive(dir: &Path) -> Result<(Db, Option<Recovered>)> {
        match try_open(dir) {
            Ok(db) => Ok((db, None)),
            Err(Failure::Fatal(e)) => Err(e),
            Err(Failure::Damaged(error)) => {
                let moved = move_aside(dir)?;
                tracing::warn!(
                    path = %dir.display(),
                    moved_to = %moved.display(),
                    %error,
                    "the database was damaged; moved it aside and started a new one"
                );
                match try_open_waiting(dir) {
                    Ok(db) => Ok((db, Some(Recovered { path: dir.to_path_buf(), damaged_path_moved_to: moved, error }))),
                    Err(Failure::Fatal(e)) => Err(e),
                    Err(Failure::Damaged(reason)) => Err(StoreError::Damaged { path: dir.to_path_buf(), reason }),
                }
            }
        }
    }
}

/// [`try_open`], waiting up to [`LOCK_WAIT`] for a lock to be released.
///
/// sled 0.34 does not release its lock when the last handle is dropped but
/// when its background I/O threads let go of the file, a little later: without
/// the wait, closing and reopening in one process fails now and then.
fn try_open_waiting(dir: &Path) -> Result<Db, Failure> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match try_open(dir) {
            Err(Failure::Fatal(StoreError::Locked { .. })) if Instant::now() < deadline => {
                std::thread::sleep(LOCK_POLL);
            }
            other => return other,
        }
    }
}

fn try_open(dir: &Path) -> Result<Db, Failure> {
    let io = |source| Failure::Fatal(StoreError::Io { path: dir.to_path_buf(), source });
    let newer = |found| Failure::Fatal(StoreError::NewerSchema { path: dir.to_path_buf(), found, supported: SCHEMA_VERSION });

    create_dir(dir).map_err(io)?;
    // The marker first: a newer revis may have changed sled's format too,
    // so a newer database is refused before sled reads (and writes) it.
    let marker = schema::read_marker(dir).map_err(io)?;
    if let Some(Ok(Marker { schema_version })) = marker
        && schema_version > SCHEMA_VERSION
    {
        return Err(newer(schema_version));
    }
    make_private(dir).map_err(io)?;
    // sled reads its config before it takes its lock: check the lock first,
    // so a database another process has open is never taken for damaged
    // (and moved aside) because of what sled read without it.
    if in_use(dir).map_err(io)? {
        return Err(Failure::Fatal(StoreError::Locked { path: dir.to_path_buf() }));
    }

    let config = sled::Config::new().path(dir).cache_capacity(CACHE_CAPACITY);
    let db = match catch_unwind(AssertUnwindSafe(|| config.open())) {
        Ok(Ok(db)) => db,
        Ok(Err(e)) => return Err(classify(dir, e)),
        Err(panic) => {
            return Err(Failure::Damaged(format!("sled panicked: {}", panic_message(&panic))));
        }
    };
    // From here sled holds the directory's lock: no other process uses it.
    let marker = match marker {
        None => None,
        Some(Ok(marker)) => Some(marker.schema_version),
        Some(Err(e)) => return Err(Failure::Damaged(format!("{MARKER} is unreadable: {e}"))),
    };
    let stamped = match db.get(VERSION_KEY) {
        Ok(None) => None,
        Ok(Some(bytes)) => match serde_json::from_slice::<u32>(&bytes) {
            Ok(v) => Some(v),
            Err(e) => {
                return Err(Failure::Damaged(format!("the schema version is unreadable: {e}")));
            }
        },
        Err(e) => return Err(classify(dir, e)),
    };
    let version = match (stamped, marker) {
        (Some(v), _) if v > SCHEMA_VERSION => return Err(newer(v)),
        // The marker is written only after the stamp is flushed, so a stamp
        // behind it means sled lost flushed data (it opens some damaged logs
        // as an empty database).
        (stamped, Some(m)) if stamped.unwrap_or(0) < m => {
            return Err(Failure::Damaged(format!(
                "{MARKER} says schema version {m} but the database has {}: its contents are gone",
                stamped.map_or("none".to_owned(), |v| v.to_string())
            )));
        }
        (stamped, _) => stamped.unwrap_or(0),
    };

    // Read everything once, so damage anywhere is found now (and repaired)
    // rather than later as an error on some old conversation.
    let verified = catch_unwind(AssertUnwindSafe(|| verify(&db)));
    match verified {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(classify(dir, e)),
        Err(panic) => {
            return Err(Failure::Damaged(format!("sled panicked: {}", panic_message(&panic))));
        }
    }

    let version = schema::migrate(&db, version, &schema::MIGRATIONS).map_err(|e| classify(dir, e))?;
    debug_assert_eq!(version, SCHEMA_VERSION);
    let names = db.tree_names();
    if let Some(missing) = schema::TREES.iter().find(|t| !names.iter().any(|n| n == t.as_bytes())) {
        return Err(Failure::Damaged(format!("the {missing} tree is missing")));
    }
    if marker != Some(version) {
        schema::write_marker(dir, &Marker { schema_version: version }).map_err(io)?;
    }
    Db::from_db(Arc::from(dir), db).map_err(|e| classify(dir, e))
}

/// Whether another process (or another [`Db`] here) holds sled's lock on the
/// database: the same `flock` on its `db` file that sled takes.
fn in_use(dir: &Path) -> std::io::Result<bool> {
    let file = match std::fs::OpenOptions::new().read(true).write(true).open(dir.join("db")) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    match file.try_lock() {
        Ok(()) => Ok(false), // released when `file` closes, before sled opens
        Err(std::fs::TryLockError::WouldBlock) => Ok(true),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// Reads every key and value of every tree.
fn verify(db: &sled::Db) -> sled::Result<()> {
    for name in db.tree_names() {
        for entry in db.open_tree(&name)?.iter() {
            entry?;
        }
    }
    Ok(())
}

/// Damage or not? Only what says "the data is bad" is damage; an I/O error
/// may be a permission or a full disk, and moving the database aside would
/// not help.
fn classify(dir: &Path, e: sled::Error) -> Failure {
    match e {
        // sled's lock: `Io(Other, "could not acquire lock on ...")`.
        sled::Error::Io(io) if io.to_string().contains("could not acquire lock") => {
            Failure::Fatal(StoreError::Locked { path: dir.to_path_buf() })
        }
        sled::Error::Io(io) if matches!(io.kind(), std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::InvalidData) => {
            Failure::Damaged(format!("sled: {io}"))
        }
        sled::Error::Io(source) => Failure::Fatal(StoreError::Io { path: dir.to_path_buf(), source }),
        // Corruption, Unsupported (sled cannot parse its own config or log
        // header), ReportableBug (sled tripped over its data).
        other => Failure::Damaged(format!("sled: {other}")),
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// Creates the directory, 0700 (it holds private conversations).
fn create_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)?;
    if !std::fs::metadata(dir)?.is_dir() {
        return Err(std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory"));
    }
    Ok(())
}

/// Narrows an existing directory that others could read to 0700.
fn make_private(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        if std::fs::metadata(dir)?.permissions().mode() & 0o077 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
    }
    Ok(())
}

/// Renames the damaged directory to `<dir>.damaged-<unix ms>[-n]`, never over
/// anything.
fn move_aside(dir: &Path) -> Result<PathBuf> {
    let io = |source| StoreError::Io { path: dir.to_path_buf(), source };
    let millis = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let mut name = dir.file_name().map(OsString::from).unwrap_or_else(|| "db".into());
    name.push(format!(".damaged-{millis}"));
    let base = dir.with_file_name(&name);
    let mut target = base.clone();
    let mut n = 1;
    while target.symlink_metadata().is_ok() {
        let mut numbered = name.clone();
        numbered.push(format!("-{n}"));
        target = base.with_file_name(numbered);
        n += 1;
    }
    std::fs::rename(dir, &target).map_err(io)?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moving_aside_never_overwrites() {
        let tmp = tempfile::tempdir().unwrap();
        let mut moved = Vec::new();
        for i in 0..3 {
            let dir = tmp.path().join("db");
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join("db"), format!("copy {i}")).unwrap();
            moved.push(move_aside(&dir).unwrap());
            assert!(!dir.exists());
        }
        // Same millisecond or not, three distinct places, each with its own content.
        for (i, path) in moved.iter().enumerate() {
            let name = path.file_name().unwrap().to_str().unwrap();
            assert!(name.starts_with("db.damaged-"), "{name}");
            assert_eq!(std::fs::read_to_string(path.join("db")).unwrap(), format!("copy {i}"));
        }
    }
}
