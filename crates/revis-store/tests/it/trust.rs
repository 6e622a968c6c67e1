//! Another user on the same machine and the shared database: run as root,
//! as CI does, with uid 65534 as the other user.

use std::io::{BufRead as _, BufReader};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};

use revis_store::{Store, StoreError};

const NOBODY: u32 = 65534;

/// The data folder on a path anyone may write (a 1777 folder): another
/// user made the database directory first and serves it. The owner's
/// revis neither joins it (which would send it the person's messages) nor
/// takes it, and says whose it is.
#[test]
fn a_database_another_user_made_and_serves_is_neither_joined_nor_held() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let dir = tmp.path().join("db");
    let mut squatter = Command::new(env!("CARGO_BIN_EXE_revis-store-crash-writer"));
    squatter.arg(&dir).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    // SAFETY: setgid and setuid are async-signal-safe.
    unsafe {
        squatter.pre_exec(|| {
            if libc::setgid(NOBODY) != 0 || libc::setuid(NOBODY) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut squatter = squatter.spawn().expect("start the other user's writer");
    // Its first acknowledged write: it holds the database and serves it.
    let mut first = String::new();
    BufReader::new(squatter.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.starts_with("ack conv"), "the other user's writer said {first:?}");

    let err = Store::open(&dir).map(|o| o.store.is_holder()).expect_err("another user's database was used");
    assert!(matches!(err, StoreError::Shared { .. }), "{err:?}");
    assert!(err.to_string().contains(&format!("belongs to uid {NOBODY}")), "{err}");
    squatter.kill().unwrap();
    squatter.wait().unwrap();
}

/// A holder stopped with Ctrl-Z (SIGSTOP here) is noticed within seconds
/// and named, not waited on for a minute and then called gone.
#[test]
fn a_stopped_holder_is_named_within_seconds() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let mut holder = Command::new(env!("CARGO_BIN_EXE_revis-store-crash-writer"))
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(holder.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.starts_with("ack conv"), "{first:?}");
    let pid = holder.id();
    // SAFETY: a signal to our own child.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
    let started = std::time::Instant::now();
    let outcome = Store::open(&dir).and_then(|o| o.store.conversations().map(|_| ()));
    let waited = started.elapsed();
    // SAFETY: as above.
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    holder.kill().unwrap();
    holder.wait().unwrap();
    let err = outcome.expect_err("a stopped holder answered");
    assert!(err.to_string().contains(&format!("(pid {pid}) is stopped")), "{err}");
    // Before, a guest waited a minute for the reply (REPLY_WAIT) and then
    // said no process held it.
    assert!(waited < std::time::Duration::from_secs(30), "noticed after {waited:?}");
}

/// A holder whose directory was removed while it was open (its socket file
/// with it) still closes: ending its accept loop needs no connection by path.
/// Were it to hang, the test runner's time limit would end this test.
#[test]
fn a_holder_whose_directory_was_removed_still_closes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let opened = Store::open(&dir).unwrap();
    assert!(opened.store.is_holder());
    std::fs::remove_dir_all(&dir).unwrap();
    drop(opened);
}
