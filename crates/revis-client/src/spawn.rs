//! Starting revisd in the background for a user whose first command finds
//! no daemon: pull the default model if missing, start `revisd`, and wait
//! until it says it serves (a readiness pipe, not a guess).

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{ClientError, START_TIMEOUT};

#[derive(Clone, Debug, Default)]
pub struct SpawnOptions {
    /// The revisd binary; default: next to the current executable, else `revisd` on PATH.
    pub revisd: Option<PathBuf>,
    /// Where the daemon's log goes; default: `revisd.log` in the data dir.
    pub log: Option<PathBuf>,
    /// Pull the default model first when it is missing.
    pub pull_default_model: bool,
    /// Show download progress.
    pub progress: bool,
    /// revisd's configuration file, passed as `--config` when it exists
    /// (else revisd reads its default one, if any).
    pub config: Option<PathBuf>,
}

fn revisd_binary(opts: &SpawnOptions) -> PathBuf {
    if let Some(p) = &opts.revisd {
        return p.clone();
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
        tokio::task::spawn_blocking(move || -> Result<(), ClientError> {
            let dir = revis_models::models_dir()?;
            let entry = revis_models::find(revis_models::DEFAULT_MODEL).expect("the default model is in the catalog");
            if !entry.is_present(&dir) {
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
        None => revis_models::data_dir()?.join("revisd.log"),
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

/// Runs `revisd --check-config` with the configuration [`spawn_daemon`]
/// would start it with; Err holds revisd's own words (it names the field).
pub async fn check_config(opts: &SpawnOptions) -> Result<(), String> {
    let mut cmd = tokio::process::Command::new(revisd_binary(opts));
    cmd.arg("--check-config");
    if let Some(config) = opts.config.as_ref().filter(|c| c.is_file()) {
        cmd.arg("--config").arg(config);
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
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into the array.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and owned by us from here on.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    unsafe { libc::fcntl(r.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    Ok((r, w))
}
