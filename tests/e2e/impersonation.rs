//! Another local user serving a fake revisd: the client refuses a socket in
//! a directory that is not the user's own (or that others may write), and a
//! socket whose listening process runs as another uid, before it sends a
//! byte. A PID reported by a daemon is signalled only if it is revisd. And
//! a daemon that cannot be reached reads as one sentence saying what to do.
//! These tests run as root, like the rest of the suite (another uid is
//! `nobody`, 65534).

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use revis_client::{Client, ClientError};
use revis_testkit::{TestDaemon, binary};

pub const NOBODY: u32 = 65534;

fn my_uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

/// Runs `f` on a new thread whose uids alone are `uid`: the raw syscall
/// changes the calling thread's credentials, not the whole process's (glibc's
/// `setresuid` would change every thread's).
pub fn as_uid<T: Send>(uid: u32, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setresuid only changes this thread's credentials, and the thread ends after `f`.
            let r = unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) };
            assert_eq!(r, 0, "setresuid({uid}): {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .unwrap()
    })
}

/// A fake daemon: a plain listener that accepts nothing until asked what
/// reached it.
struct Fake(UnixListener);

impl Fake {
    fn bind(path: &Path) -> Fake {
        let l = UnixListener::bind(path).unwrap();
        l.set_nonblocking(true).unwrap();
        Fake(l)
    }

    /// The bytes of each connection made so far (each closed by the client).
    fn received(&self) -> Vec<Vec<u8>> {
        let mut all = Vec::new();
        loop {
            match self.0.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    let mut bytes = Vec::new();
                    s.read_to_end(&mut bytes).unwrap();
                    all.push(bytes);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return all,
                Err(e) => panic!("accept: {e}"),
            }
        }
    }
}

/// `revis` and `revisd`'s admin command on `socket`: each fails at once,
/// and says `words`. (One that connected would wait on the fake daemon,
/// which never answers: hence the deadline.)
fn clis_refuse(socket: &Path, words: &str) {
    for (bin, args) in [("revis", &["status"][..]), ("revisd", &["devices"][..])] {
        let mut child = Command::new(binary(bin)).arg("--socket").arg(socket).args(args).stderr(Stdio::piped()).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                child.kill().unwrap();
                panic!("{bin} did not refuse within 10 s: it is talking to the fake daemon");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert!(!status.success() && err.contains(words), "{bin}: {err}");
        if bin == "revisd" {
            assert_eq!(status.code(), Some(77), "revisd's admin commands exit EX_NOPERM on a socket that is not ours: {err}");
        }
    }
}

/// A directory `/tmp/revis-$UID` as another user would make it, for us.
fn socket_dir(home: &Path, owner: u32, mode: u32) -> PathBuf {
    let dir = home.join(format!("revis-{}", my_uid()));
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(owner), Some(owner)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
    dir
}

#[tokio::test]
async fn a_socket_in_another_users_directory_is_refused() {
    let home = tempfile::tempdir().unwrap();
    let dir = socket_dir(home.path(), NOBODY, 0o700);
    let socket = dir.join("revisd.sock");
    // Root may bind there; the client must still see whose directory it is.
    let fake = Fake::bind(&socket);
    let err = Client::connect(&socket).await.err().expect("refused");
    assert!(matches!(err, ClientError::Untrusted { .. }), "{err:?}");
    let me = my_uid();
    let said = format!(
        "refusing {}: its directory {} is owned by uid {NOBODY}, not by you ({me}); another user may be impersonating revisd: have it removed, or choose another --socket",
        socket.display(),
        dir.display()
    );
    assert_eq!(err.to_string(), said);
    clis_refuse(&socket, &said);
    assert!(fake.received().is_empty(), "nothing reached the fake daemon, not even a connection");
}

#[tokio::test]
async fn a_socket_in_a_directory_others_may_write_is_refused() {
    let home = tempfile::tempdir().unwrap();
    let dir = socket_dir(home.path(), my_uid(), 0o777);
    let socket = dir.join("revisd.sock");
    let fake = Fake::bind(&socket);
    let err = Client::connect(&socket).await.err().expect("refused");
    let said = format!(
        "refusing {}: its directory {} is writable by other users (mode 777); make it private: chmod 700 '{}', or choose another --socket",
        socket.display(),
        dir.display(),
        dir.display()
    );
    assert_eq!(err.to_string(), said);
    clis_refuse(&socket, &said);
    assert!(fake.received().is_empty(), "nothing reached the fake daemon, not even a connection");
}

#[tokio::test]
async fn a_daemon_of_another_uid_is_refused() {
    let home = tempfile::tempdir().unwrap();
    // Our own private directory: the directory check passes.
    let dir = socket_dir(home.path(), my_uid(), 0o700);
    let socket = dir.join("revisd.sock");
    let fake = Fake::bind(&socket);
    // A client sees the credentials in effect when the socket was put to
    // listen (unix(7), SO_PEERCRED): listen again as nobody.
    let fd = std::os::fd::AsRawFd::as_raw_fd(&fake.0);
    // SAFETY: listen on a socket this test owns.
    as_uid(NOBODY, || assert_eq!(unsafe { libc::listen(fd, 16) }, 0));
    let probe = tokio::net::UnixStream::connect(&socket).await.unwrap();
    assert_eq!(probe.peer_cred().unwrap().uid(), NOBODY, "the fake daemon listens as nobody");
    drop(probe);
    assert_eq!(fake.received().len(), 1);

    let err = Client::connect(&socket).await.err().expect("refused");
    let said = format!(
        "refusing {}: the process listening on it runs as uid {NOBODY}, not as you ({}); another user may be impersonating revisd: stop that process, or choose another --socket",
        socket.display(),
        my_uid()
    );
    assert_eq!(err.to_string(), said);
    clis_refuse(&socket, &said);
    let received = fake.received();
    assert_eq!(received.len(), 3, "one connection each: the client, revis, revisd");
    assert!(received.iter().all(|b| b.is_empty()), "not a byte was sent: {received:?}");
}

/// A PID that the daemon reports about itself ends that daemon (the
/// refusals are unit tests in revis-client).
#[test]
fn end_daemon_ends_a_real_revisd() {
    let mut d = TestDaemon::new().start();
    revis_client::end_daemon(d.pid()).unwrap();
    let status = d.wait_exit(Duration::from_secs(15)).expect("revisd exited after SIGTERM");
    assert!(status.success(), "revisd drains and exits cleanly on SIGTERM: {status:?}");
}

/// A socket file left behind with nothing listening (a revisd that was
/// killed): `revis` says so in one line, with what to do, not tonic's dump.
#[test]
fn a_stale_socket_reads_as_one_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("revisd.sock");
    drop(UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    for args in [&["status"][..], &["load", "tier1"], &["run", "Hi"]] {
        let out = Command::new(binary("revis")).arg("--socket").arg(&socket).args(args).output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        let s = socket.display();
        assert_eq!(
            err,
            format!(
                "revis: no revisd answers on {s}: nothing listens on it (a revisd that stopped left it behind); \
                 to run one: revisd --socket '{s}' (revis starts no daemon on a socket chosen with --socket or REVIS_SOCKET)\n"
            ),
            "{args:?}"
        );
    }
}

/// The same when the daemon goes away under a connected client: the call
/// after it fails with where and why, not with the transport's status.
#[tokio::test]
async fn a_daemon_gone_under_a_client_reads_as_not_running() {
    let mut d = TestDaemon::new().start();
    let client = Client::connect(&d.socket).await.unwrap();
    client.status().await.unwrap();
    d.signal(libc::SIGKILL);
    d.wait_exit(Duration::from_secs(10)).expect("revisd was killed");
    assert!(d.socket.exists(), "kill -9 leaves the socket file");
    let err = client.status().await.unwrap_err();
    assert!(matches!(err, ClientError::NotRunning { .. }), "{err:?}");
    let said = format!("no revisd answers on {}: nothing listens on it (a revisd that stopped left it behind)", d.socket.display());
    assert_eq!(err.to_string(), said);
    assert!(std::error::Error::source(&err).is_none(), "nothing more to print under it");
}

/// On the default socket `revis run` starts a daemon when none answers,
/// but not where the socket may not be the user's: it says why at once and
/// starts nothing (a revisd started there would have opened its log in the
/// data directory).
#[test]
fn no_daemon_is_started_on_a_default_socket_that_is_not_ours() {
    let models = revis_testkit::smollm2().parent().unwrap().to_path_buf();
    let home = tempfile::tempdir().unwrap();
    // The default socket is $XDG_RUNTIME_DIR/revis/revisd.sock.
    let runtime = home.path().join("runtime");
    std::fs::create_dir(&runtime).unwrap();
    let dir = runtime.join("revis");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    // The models are there, so nothing is downloaded before the daemon would start.
    let data = home.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::os::unix::fs::symlink(&models, data.join("models")).unwrap();

    let out = Command::new(binary("revis"))
        .args(["run", "Hi"])
        .env("XDG_RUNTIME_DIR", &runtime)
        .env("REVIS_DATA_DIR", &data)
        .env_remove("REVIS_SOCKET")
        .env_remove("REVIS_NODE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let socket = dir.join("revisd.sock");
    let said = format!(
        "revis: refusing {}: its directory {} is owned by uid {NOBODY}, not by you ({}); another user may be impersonating revisd: have it removed, or choose another --socket\n",
        socket.display(),
        dir.display(),
        my_uid()
    );
    assert!(!out.status.success());
    assert_eq!(err, said);
    assert!(!data.join("revisd.log").exists(), "no revisd was started");
}
