//! revisd: logging, config (validated before anything binds), bind the
//! socket, serve until SIGTERM/SIGINT, drain with a deadline.

use std::io::Write;
use std::os::fd::FromRawFd;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use revis_daemon::{Config, bind, default_socket_path};

/// The revis inference daemon: serves the models of each tier over gRPC on a Unix socket.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Config file (TOML). Default: $REVIS_CONFIG, else revisd.toml in the user's config dir if it exists.
    #[arg(long, env = "REVIS_CONFIG")]
    config: Option<PathBuf>,
    /// Socket path. Default: the config's daemon.socket, else $REVIS_SOCKET, else the user's runtime dir.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Check the config and exit.
    #[arg(long)]
    check_config: bool,
}

/// sysexits.h: a bad config is a usage error.
const EX_USAGE: u8 = 64;
const EX_CANTCREAT: u8 = 73;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("REVIS_LOG").unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    let config = match load_config(args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("revisd: {e:#}");
            return ExitCode::from(EX_USAGE);
        }
    };
    if args.check_config {
        println!("config ok");
        return ExitCode::SUCCESS;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    runtime.block_on(serve(config, args.socket))
}

fn load_config(path: Option<PathBuf>) -> anyhow::Result<Config> {
    let models = revis_models::models_dir()?;
    let default = directories::ProjectDirs::from("", "", "revis").map(|d| d.config_dir().join("revisd.toml"));
    match path.or_else(|| default.filter(|p| p.is_file())) {
        Some(p) => Ok(Config::load(&p, &models)?),
        None => Ok(Config::default_for(&models)?),
    }
}

async fn serve(config: Config, socket: Option<PathBuf>) -> ExitCode {
    let path = socket.or_else(|| config.socket.clone()).unwrap_or_else(default_socket_path);
    let listener = match bind(&path).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("revisd: {e}");
            return ExitCode::from(EX_CANTCREAT);
        }
    };
    tracing::info!(socket = %path.display(), pid = std::process::id(), "revisd {} listening", env!("CARGO_PKG_VERSION"));
    let result = revis_daemon::run(config, listener, signal(), notify_ready).await;
    let _ = std::fs::remove_file(&path);
    match result {
        Ok(()) => {
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("revisd: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = int.recv() => tracing::info!("SIGINT"),
    }
}

/// Tells whoever started us that requests are served: writes "ready\n" to
/// the file descriptor named by REVIS_READY_FD, then closes it.
fn notify_ready() {
    let Some(fd) = std::env::var("REVIS_READY_FD").ok().and_then(|v| v.parse::<i32>().ok()) else { return };
    // SAFETY: the parent passed this descriptor to us for exactly this; we own it from here on.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
        return;
    }
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    let _ = f.write_all(b"ready\n");
}
