//! Starting revisd in the background for a user whose first command finds
//! no daemon: pull the default model if missing, start `revisd`, and wait
//! until it says it serves (a readiness pipe, not a guess). Ending it, and
//! restarting it so it reads its configuration again. [`Client::connect_or_start`]
//! is the door: connect, else start one and connect.

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::target::Target;
use crate::{Client, ClientError};

/// How long to wait for a freshly started daemon to answer.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long [`restart_daemon`] waits for the old revisd to exit after its
/// SIGTERM (revisd itself exits within 5 s of it).
pub const RESTART_WAIT: Duration = Duration::from_secs(15);
/// How often [`restart_daemon`] looks whether the old revisd has exited.
const EXIT_POLL: Duration = Duration::from_millis(50);

#[derive(Clone, Debug, Default)]
pub struct SpawnOptions {
    /// The revisd binary; default: next to the current executable, else `revisd` on PATH.
    pub revisd: Option<PathBuf>,
    /// Where the daemon's log goes; default: `revisd.log` in the data dir.
    pub log: Option<PathBuf>,
    /// Pull the default model first when it is missing (unless another model
    /// was chosen as the default and is downloaded).
    pub pull_default_model: bool,
    /// Show download progress.
    pub progress: bool,
    /// revisd's configuration file, passed as `--config` when it exists
    /// (else revisd reads its default one, if any).
    pub config: Option<PathBuf>,
    /// revis's data directory (the models, the daemon's state, its log),
    /// passed to revisd as `REVIS_DATA_DIR`; None = the one
    /// [`revis_models::data_dir`] finds (and revisd inherits this process's
    /// environment).
    pub data_dir: Option<PathBuf>,
}

/// The data directory a daemon started with `opts` uses.
fn data_dir(opts: &SpawnOptions) -> Result<PathBuf, ClientError> {
    match &opts.data_dir {
        Some(d) => Ok(d.clone()),
        None => Ok(revis_models::data_dir()?),
    }
}

fn revisd_binary(opts: &SpawnOptions) -> PathBuf {
    revisd_program(opts.revisd.as_deref())
}

/// `chosen`, else the revisd beside this program, else the one on PATH.
pub(crate) fn revisd_program(chosen: Option<&Path>) -> PathBuf {
    if let Some(p) = chosen {
        return p.to_owned();
    }
    if let Some(sibling) = std::env::current_exe().ok().and_then(|e| e.parent().map(|d| d.join("revisd")))
        && sibling.is_file()
    {
        return sibling;
    }
    PathBuf::from("revisd")
}

/// Starts revisd on `socket` and returns once it serves requests.
pub async fn spawn_daemon(socket: &Path, opts: &SpawnOptions) -> Result<u32, ClientError> {
    if opts.pull_default_model {
        let progress = opts.progress;
        let dir = data_dir(opts)?.join("models");
        tokio::task::spawn_blocking(move || -> Result<(), ClientError> {
            let entry = revis_models::find(revis_models::DEFAULT_MODEL).expect("the default model is in the catalog");
            // A default chosen and recorded for this machine (`revis_models::default_model`) is already here.
            if revis_models::default_model(&dir) == entry.name && !entry.is_present(&dir) {
                eprintln!("revis: the default model {} is not here yet; downloading it once", entry.name);
                let progress = if progress { revis_models::Progress::Bar } else { revis_models::Progress::Quiet };
                revis_models::pull(entry, &dir, &revis_models::PullOptions { progress, ..Default::default() })?;
            }
            Ok(())
        })
        .await
        .map_err(|e| ClientError::Spawn(e.to_string()))??;
    }
    let log_path = match &opts.log {
        Some(p) => p.clone(),
        None => data_dir(opts)?.join("revisd.log"),
    };
    if let Some(dir) = log_path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| ClientError::Spawn(format!("{}: {e}", dir.display())))?;
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| ClientError::Spawn(format!("{}: {e}", log_path.display())))?;
    let (read_end, write_end) = readiness_pipe().map_err(|e| ClientError::Spawn(format!("pipe: {e}")))?;
    let binary = revisd_binary(opts);
    let mut cmd = Command::new(&binary);
    if let Some(config) = opts.config.as_ref().filter(|c| c.is_file()) {
        cmd.arg("--config").arg(config);
    }
    if let Some(dir) = &opts.data_dir {
        cmd.env("REVIS_DATA_DIR", dir);
    }
    cmd.arg("--socket")
        .arg(socket)
        .env("REVIS_READY_FD", write_end.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| ClientError::Spawn(e.to_string()))?)
        .stderr(log);
    // Its own process group: a Ctrl-C in this terminal must not stop the daemon.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().map_err(|e| ClientError::Spawn(format!("{}: {e}", binary.display())))?;
    drop(write_end); // only the child holds it now: EOF means it exited
    let pid = child.id();
    // Reaped when it exits, so a long-lived caller (the GUI) keeps no zombie.
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    let wait = tokio::task::spawn_blocking(move || {
        let mut f = std::fs::File::from(read_end);
        let mut buf = String::new();
        let _ = f.read_to_string(&mut buf);
        buf
    });
    match tokio::time::timeout(START_TIMEOUT, wait).await {
        Ok(Ok(s)) if s.starts_with("ready") => Ok(pid),
        Ok(_) => Err(ClientError::Spawn(format!("revisd exited before it was ready; see its log at {}", log_path.display()))),
        Err(_) => {
            Err(ClientError::Spawn(format!("revisd did not become ready within {}s; see {}", START_TIMEOUT.as_secs(), log_path.display())))
        }
    }
}

impl Client {
    /// Connects to the daemon at `path`; if none answers, starts one (pulling
    /// the default model first if it is missing) and connects to it. A
    /// socket that may not be this user's ([`ClientError::Untrusted`]) is
    /// refused at once: no daemon is started there.
    pub async fn connect_or_start(path: &Path, opts: &SpawnOptions) -> Result<Client, ClientError> {
        match Self::answering(path).await {
            Ok(Some(c)) => return Ok(c),
            Err(e @ ClientError::Untrusted { .. }) => return Err(e),
            _ => {}
        }
        match spawn_daemon(path, opts).await {
            Ok(_) => Self::connect(path).await,
            // Another client may have started one at the same moment: use it.
            Err(e) => match Self::answering(path).await {
                Ok(Some(c)) => Ok(c),
                Err(untrusted @ ClientError::Untrusted { .. }) => Err(untrusted),
                _ => Err(e),
            },
        }
    }
}

/// Runs `revisd --check-config` with the configuration [`spawn_daemon`]
/// would start it with; Err holds revisd's own words (it names the field).
pub async fn check_config(opts: &SpawnOptions) -> Result<(), String> {
    let mut cmd = tokio::process::Command::new(revisd_binary(opts));
    cmd.arg("--check-config");
    if let Some(config) = opts.config.as_ref().filter(|c| c.is_file()) {
        cmd.arg("--config").arg(config);
    }
    if let Some(dir) = &opts.data_dir {
        cmd.env("REVIS_DATA_DIR", dir);
    }
    let out = cmd.stdin(Stdio::null()).output().await.map_err(|e| format!("{}: {e}", revisd_binary(opts).display()))?;
    if out.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stderr);
    Err(said.trim().trim_start_matches("revisd: ").to_owned())
}

/// A readiness pipe for starting revisd: the read end is close-on-exec, the
/// write end is inherited (pass its number in `REVIS_READY_FD`); revisd
/// writes "ready\n" to it once it serves, and EOF means it exited.
pub fn readiness_pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    // std's pipe makes both ends close-on-exec; the write end is cleared of it.
    let (r, w) = std::io::pipe()?;
    let w = OwnedFd::from(w);
    // SAFETY: clearing a flag on a descriptor this function owns.
    if unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETFD, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((OwnedFd::from(r), w))
}

/// Ends the revisd whose process ID is `pid` (SIGTERM: it drains and exits),
/// as a restart does. `pid` is what a daemon said about itself, so it is
/// believed only when it names a process of this user that runs the revisd
/// binary; anything else (0, 1, a value that is negative as a `pid_t`, which
/// `kill` would take for every process or a process group, or another
/// program) is refused with [`ClientError::NotDaemon`] and nothing is
/// signalled.
pub fn end_daemon(pid: u32) -> Result<(), ClientError> {
    let refuse = |reason: String| ClientError::NotDaemon { pid, reason };
    let target = daemon_pid(pid).map_err(refuse)?;
    // SAFETY: kill only sends a signal, to a process checked to be this user's revisd.
    if unsafe { libc::kill(target, libc::SIGTERM) } != 0 {
        return Err(refuse(format!("it could not be signalled: {}", std::io::Error::last_os_error())));
    }
    Ok(())
}

/// A daemon started again by [`restart_daemon`].
pub struct Restarted {
    /// Connected to the new daemon.
    pub client: Client,
    /// Its process ID, as it says.
    pub pid: u32,
}

/// Ends the revisd `client` talks to on this machine's socket (SIGTERM, by
/// the PID it reports), waits up to [`RESTART_WAIT`] for that process to
/// exit, and connects to revisd on the same socket again, starting it with
/// `opts` when none answers, so it reads its configuration again. The
/// configuration is checked first (`revisd --check-config`): a typo in a
/// model leaves the running daemon alone. A service manager or socket
/// activation may start the new daemon first; then that one is used.
///
/// `ended` is called once the old daemon was told to stop: a failure after
/// it leaves no daemon answering. Err holds what went wrong, in words a
/// person can act on.
pub async fn restart_daemon(client: &Client, opts: &SpawnOptions, ended: impl FnOnce()) -> Result<Restarted, String> {
    let Target::Socket(socket) = client.target() else { return Err("only this machine's revisd can be restarted from here".into()) };
    check_config(opts).await.map_err(|e| format!("revisd was not restarted: {e}"))?;
    let old = client.status().await.map_err(|e| e.words())?.pid;
    if old == 0 {
        return Err("revisd did not say its process ID, so it was not restarted".into());
    }
    // The PID is only what the daemon said: end_daemon signals it only if it is this user's revisd.
    end_daemon(old).map_err(|e| format!("revisd was not restarted: {e}"))?;
    ended();
    let deadline = Instant::now() + RESTART_WAIT;
    while running(old) {
        if Instant::now() >= deadline {
            return Err(format!("revisd (pid {old}) did not stop within {}s", RESTART_WAIT.as_secs()));
        }
        tokio::time::sleep(EXIT_POLL).await;
    }
    let client = Client::connect_or_start(socket, opts).await.map_err(|e| e.words())?;
    let pid = client.status().await.map_err(|e| e.words())?.pid;
    Ok(Restarted { client, pid })
}

/// Whether process `pid` is still running. An exited child of this process
/// that nobody has reaped yet (a zombie) counts as gone: it holds nothing.
fn running(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    // Linux says so in /proc; elsewhere revis reaps the daemons it starts.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

/// `pid` as a `pid_t` when it is a process of this user running revisd;
/// else why not.
fn daemon_pid(pid: u32) -> Result<libc::pid_t, String> {
    let target = libc::pid_t::try_from(pid).ok().filter(|&p| p > 1).ok_or("no daemon has that process ID")?;
    let process = inspect(target)?;
    // SAFETY: getuid cannot fail.
    let me = unsafe { libc::getuid() };
    if let Some(uid) = [process.real_uid, process.effective_uid].into_iter().find(|&u| u != me) {
        return Err(format!("that process belongs to uid {uid}, not to you ({me})"));
    }
    // A binary replaced since it started (an upgrade) is still revisd.
    let exe = process.exe.to_string_lossy();
    let exe = exe.strip_suffix(" (deleted)").unwrap_or(&exe);
    if Path::new(exe).file_name() != Some("revisd".as_ref()) {
        return Err(format!("that process runs {exe}, not revisd"));
    }
    Ok(target)
}

/// Who runs a process, and which binary.
struct Process {
    real_uid: u32,
    effective_uid: u32,
    exe: PathBuf,
}

#[cfg(target_os = "linux")]
fn inspect(pid: libc::pid_t) -> Result<Process, String> {
    let gone = |e: std::io::Error| format!("that process cannot be inspected ({e})");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(gone)?;
    // "Uid:	real	effective	saved	filesystem"
    let uids: Vec<u32> = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .map(|l| l.split_whitespace().filter_map(|u| u.parse().ok()).collect())
        .unwrap_or_default();
    let [real_uid, effective_uid, ..] = uids[..] else { return Err("its owner cannot be read from /proc".into()) };
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map_err(gone)?;
    Ok(Process { real_uid, effective_uid, exe })
}

// Not run by this project's tests (they run on Linux); written from the
// libproc API.
#[cfg(target_os = "macos")]
fn inspect(pid: libc::pid_t) -> Result<Process, String> {
    use std::os::unix::ffi::OsStrExt;
    let gone = || format!("that process cannot be inspected ({})", std::io::Error::last_os_error());
    // SAFETY: proc_bsdinfo is plain data; proc_pidinfo writes at most `size` bytes into it.
    let mut info: libc::proc_bsdinfo = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::proc_bsdinfo>() as libc::c_int;
    let n = unsafe { libc::proc_pidinfo(pid, libc::PROC_PIDTBSDINFO, 0, (&raw mut info).cast(), size) };
    if n != size {
        return Err(gone());
    }
    let mut buf = vec![0u8; libc::PROC_PIDPATHINFO_MAXSIZE as usize];
    // SAFETY: proc_pidpath writes at most `buf.len()` bytes into buf.
    let n = unsafe { libc::proc_pidpath(pid, buf.as_mut_ptr().cast(), buf.len() as u32) };
    if n <= 0 {
        return Err(gone());
    }
    let exe = PathBuf::from(std::ffi::OsStr::from_bytes(&buf[..n as usize]));
    Ok(Process { real_uid: info.pbi_ruid, effective_uid: info.pbi_uid, exe })
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn inspect(_: libc::pid_t) -> Result<Process, String> {
    Err("this system offers no way to check which program a process runs".into())
}

#[cfg(test)]
mod tests {
    //! Which process IDs `end_daemon` believes: each refusal is checked to
    //! have signalled nothing (the process ends by our SIGKILL, not by a
    //! SIGTERM before it).

    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::process::Child;

    use super::*;

    /// `sleep`, or a copy of it named `name` (in a directory anyone may read).
    fn sleeper(name: Option<&str>, uid: Option<u32>) -> (Child, Option<tempfile::TempDir>) {
        let mut dir = None;
        let binary = match name {
            None => PathBuf::from("sleep"),
            Some(name) => {
                let d = tempfile::tempdir().unwrap();
                std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
                // A probe that lives until it is read (a `sleep 0` may be
                // gone before its /proc entry is, as CI once found).
                let mut probe = Command::new("sleep").arg("60").spawn().unwrap();
                let sleep = std::fs::read_link(format!("/proc/{}/exe", probe.id())).unwrap();
                probe.kill().unwrap();
                probe.wait().unwrap();
                let copy = d.path().join(name);
                std::fs::copy(sleep, &copy).unwrap();
                dir = Some(d);
                copy
            }
        };
        let mut cmd = Command::new(binary);
        cmd.arg("60");
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        (cmd.spawn().unwrap(), dir)
    }

    /// Ends `child` with SIGKILL and says which signal ended it.
    fn kill_and_reap(mut child: Child) -> Option<i32> {
        // SAFETY: signals our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait().unwrap().signal()
    }

    fn refused(pid: u32) -> String {
        match end_daemon(pid) {
            Err(e @ ClientError::NotDaemon { .. }) => e.to_string(),
            other => panic!("pid {pid} was not refused: {other:?}"),
        }
    }

    #[test]
    fn what_is_not_a_process_id_is_refused() {
        // As a pid_t, u32::MAX is -1 (every process of the user) and 2^31 a
        // process group; 0 is our own group, 1 init.
        for pid in [0, 1, u32::MAX, u32::MAX - 1, 1 << 31, i32::MAX as u32 + 7] {
            assert_eq!(refused(pid), format!("refusing to signal process {pid}: no daemon has that process ID"));
        }
    }

    #[test]
    fn another_program_is_not_signalled() {
        let (child, _) = sleeper(None, None);
        let said = refused(child.id());
        assert!(said.ends_with("sleep, not revisd"), "{said}");
        assert_eq!(kill_and_reap(child), Some(libc::SIGKILL), "the refused process got no SIGTERM");
    }

    #[test]
    fn a_revisd_of_another_user_is_not_signalled() {
        let (child, _dir) = sleeper(Some("revisd"), Some(65534));
        let said = refused(child.id());
        // SAFETY: getuid cannot fail.
        let me = unsafe { libc::getuid() };
        assert!(said.ends_with(&format!("that process belongs to uid 65534, not to you ({me})")), "{said}");
        assert_eq!(kill_and_reap(child), Some(libc::SIGKILL), "the refused process got no SIGTERM");
    }

    #[tokio::test]
    async fn revisd_gets_the_data_dir_it_is_given() {
        // A stand-in for revisd that says which data dir it was given, then that it is ready.
        let dir = tempfile::tempdir().unwrap();
        let (data, seen) = (dir.path().join("data"), dir.path().join("seen"));
        let fake = dir.path().join("revisd");
        let script = format!(
            "#!/bin/sh\nprintf '%s' \"$REVIS_DATA_DIR\" > '{}'\n\
             [ \"$1\" = --check-config ] && exit 0\n\
             echo ready > /proc/self/fd/$REVIS_READY_FD\n",
            seen.display()
        );
        std::fs::write(&fake, script).unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let opts = SpawnOptions { revisd: Some(fake), data_dir: Some(data.clone()), ..Default::default() };
        let said = || std::fs::read_to_string(&seen).unwrap();

        check_config(&opts).await.unwrap();
        assert_eq!(said(), data.display().to_string(), "revisd --check-config reads the same data dir");
        spawn_daemon(&dir.path().join("revisd.sock"), &opts).await.unwrap();
        assert_eq!(said(), data.display().to_string());
        assert!(data.join("revisd.log").is_file(), "its log is in that data dir");
    }

    #[test]
    fn an_exited_child_not_yet_reaped_is_not_running() {
        let (mut child, _) = sleeper(None, None);
        let pid = child.id();
        assert!(running(pid));
        // SAFETY: signals our own child.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        // Waits for its exit without reaping it (WNOWAIT): it stays a zombie, which holds nothing.
        // SAFETY: waitid on our own child, into a zeroed siginfo_t it fills.
        let rc = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT)
        };
        assert_eq!(rc, 0, "waitid: {}", std::io::Error::last_os_error());
        assert!(!running(pid), "pid {pid} still counts as running after it exited");
        assert!(std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok(), "the zombie is still there");
        child.wait().unwrap();
        assert!(!running(pid));
    }

    #[test]
    fn a_revisd_of_this_user_is_ended() {
        let (mut child, _dir) = sleeper(Some("revisd"), None);
        end_daemon(child.id()).unwrap();
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGTERM));
    }
}
