//! revisd: logging, config (validated before anything binds), bind the
//! socket (or take the one systemd or launchd holds), serve until
//! SIGTERM/SIGINT, drain with a deadline. `revisd service ...` installs it
//! as a background service (see service.rs).

mod admin;
mod exit;
mod service;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use revis_daemon::transport::socket::{Inherited, take_inherited, take_ready_pipe};
use revis_daemon::{Config, bind, default_socket_path};

use crate::exit::{EX_CANTCREAT, EX_USAGE};

/// The revis inference daemon: serves the models of each tier over gRPC on a Unix socket.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Config file (TOML). Default: $REVIS_CONFIG, else revisd.toml in the user's config dir if it exists.
    #[arg(long, env = "REVIS_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Socket path. Default: the config's daemon.socket, else $REVIS_SOCKET, else the user's runtime dir.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Check the config and exit.
    #[arg(long)]
    check_config: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Run revisd in the background: a LaunchAgent on macOS, a systemd user service on Linux.
    #[command(subcommand)]
    Service(service::Action),
    #[command(flatten)]
    Admin(admin::Action),
    /// (started by revisd) llama.cpp's RPC server lending this machine's CPU, on a private loopback.
    #[command(hide = true)]
    RpcWorker {
        #[arg(long)]
        cache_dir: PathBuf,
        #[arg(long)]
        threads: u32,
        /// Bytes of address space it may take (`server.lend_memory_mb`).
        #[arg(long)]
        memory_limit: u64,
        /// Listen on the shared loopback where no private one can be made
        /// (`server.allow_shared_loopback`); otherwise it refuses.
        #[arg(long)]
        allow_shared_loopback: bool,
    },
    /// (started by revisd) renders chat templates, bounded in memory (`daemon.render_memory_mb`).
    #[command(hide = true)]
    RenderWorker {
        /// Bytes of address space it may take.
        #[arg(long)]
        memory_limit: u64,
    },
    /// Decode a few tokens of a model with revisd's defaults and print its speed as JSON (revis and the GUI run it
    /// before they estimate how fast the other models would be here).
    MeasureSpeed {
        /// The model file (GGUF).
        model: PathBuf,
    },
    /// (started by revisd) a split tier's engine, serving it on a private socket.
    #[command(hide = true)]
    SplitEngine(revis_daemon::remote::split::EngineFlags),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("REVIS_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    if let Some(Command::RpcWorker { cache_dir, threads, memory_limit, allow_shared_loopback }) = &args.command {
        // SAFETY: no other thread exists yet.
        let start = match unsafe { revis_daemon::remote::lend::WorkerStart::take() } {
            Ok(s) => s,
            Err(e) => {
                eprintln!("revisd rpc-worker: {e}");
                return ExitCode::from(EX_USAGE);
            }
        };
        revis_daemon::remote::child::exit_with_parent();
        let e = revis_daemon::remote::lend::run_worker(start, cache_dir, *threads, *memory_limit, *allow_shared_loopback);
        eprintln!("revisd rpc-worker: {e}");
        return ExitCode::FAILURE;
    }
    if let Some(Command::RenderWorker { memory_limit }) = &args.command {
        return match revis_engine::render::serve(*memory_limit) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("revisd render-worker: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(Command::MeasureSpeed { model }) = &args.command {
        return match revis_daemon::speed::measure(model) {
            Ok(m) => {
                println!("{}", m.to_json());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("revisd measure-speed: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(Command::SplitEngine(flags)) = args.command {
        return split_engine(flags);
    }
    if let Some(Command::Admin(action)) = args.command {
        let socket = match args.socket.clone() {
            Some(s) => s,
            None => match load_config(args.config.clone()) {
                Ok(c) => c.socket.unwrap_or_else(default_socket_path),
                Err(_) => default_socket_path(),
            },
        };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
        return runtime.block_on(admin::run(action, &socket));
    }
    if let Some(Command::Service(action)) = args.command {
        if args.socket.is_some() || args.check_config {
            eprintln!("revisd: --socket and --check-config do not apply to `revisd service`");
            return ExitCode::from(EX_USAGE);
        }
        // A service that would only exit 64 again and again is not installed.
        if matches!(action, service::Action::Install { .. })
            && let Err(e) = load_config(args.config.clone())
        {
            eprintln!("revisd: {e:#}");
            return ExitCode::from(EX_USAGE);
        }
        return service::run(action, args.config.as_deref());
    }
    let config = match load_config(args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("revisd: {e:#}");
            return ExitCode::from(EX_USAGE);
        }
    };
    if args.check_config {
        println!("config ok");
        for (tier, m) in &config.tiers {
            println!("  {tier}: {} (context {} tokens)", m.name, m.context);
        }
        return ExitCode::SUCCESS;
    }
    // SAFETY: no other thread exists yet (the runtime is built below), and
    // descriptor 3 is ours when LISTEN_PID says so.
    let inherited = match unsafe { take_inherited() } {
        Ok(i) => i,
        Err(e) => {
            eprintln!("revisd: {e}");
            return ExitCode::from(EX_CANTCREAT);
        }
    };
    // SAFETY: still single-threaded, as above.
    let ready = unsafe { take_ready_pipe() };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    runtime.block_on(serve(config, args.socket, inherited, ready))
}

/// `revisd split-engine`: one split tier, on the socket its revisd gave.
fn split_engine(flags: revis_daemon::remote::split::EngineFlags) -> ExitCode {
    // SAFETY: no other thread exists yet (for all three).
    let ready = unsafe { take_ready_pipe() };
    let Some(tunnels) = (unsafe { revis_daemon::transport::socket::take_inherited_socket(revis_daemon::remote::split::TUNNELS_FD) }) else {
        eprintln!(
            "revisd split-engine: started without {} (revisd starts it; it is not run by hand)",
            revis_daemon::remote::split::TUNNELS_FD
        );
        return ExitCode::from(EX_USAGE);
    };
    if let Err(why) = unsafe { revis_daemon::remote::private_net::enter() } {
        if !flags.allow_shared_loopback {
            // revisd reads this in place of "ready" and names the cause.
            if let Some(mut r) = ready {
                let _ = writeln!(r, "{} {why}", revis_daemon::remote::lend::REFUSED);
            }
            eprintln!("revisd split-engine: no private loopback ({why}), and server.allow_shared_loopback is off: not starting");
            return ExitCode::FAILURE;
        }
        tracing::warn!("no private loopback for the split engine ({why}): other local processes can reach its tunnels");
    }
    revis_daemon::remote::child::exit_with_parent();
    let Ok(tier) = flags.tier.parse() else {
        eprintln!("revisd split-engine: {:?} is not a tier", flags.tier);
        return ExitCode::from(EX_USAGE);
    };
    let nodes = match revis_daemon::remote::split::engine_endpoints(&flags.nodes, tunnels) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("revisd split-engine: the RPC endpoints: {e}");
            return ExitCode::FAILURE;
        }
    };
    let socket = flags.socket.clone();
    let a = revis_daemon::remote::split::EngineArgs { flags, tier, rpc: nodes };
    let models = match revis_models::models_dir() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("revisd split-engine: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let config = match revis_daemon::remote::split::engine_config(&a, &models) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("revisd split-engine: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    runtime.block_on(serve(config, Some(socket), None, ready))
}

fn load_config(path: Option<PathBuf>) -> anyhow::Result<Config> {
    let models = revis_models::models_dir()?;
    let default = directories::ProjectDirs::from("", "", "revis").map(|d| d.config_dir().join("revisd.toml"));
    match path.or_else(|| default.filter(|p| p.is_file())) {
        Some(p) => Ok(Config::load(&p, &models)?),
        None => Ok(Config::default_for(&models)?),
    }
}

async fn serve(config: Config, socket: Option<PathBuf>, inherited: Option<Inherited>, ready: Option<std::fs::File>) -> ExitCode {
    let asked = socket.or_else(|| config.socket.clone());
    // A socket the service manager holds stays its own: we neither bind nor remove it.
    let activated = inherited.is_some();
    let (listener, path) = match inherited {
        Some(i) => {
            if let Some(asked) = asked.filter(|a| *a != i.path) {
                tracing::warn!(asked = %asked.display(), "serving the socket {} handed over instead", i.from);
            }
            match tokio::net::UnixListener::from_std(i.listener) {
                Ok(l) => (l, i.path),
                Err(e) => {
                    eprintln!("revisd: the socket handed over by {}: {e}", i.from);
                    return ExitCode::from(EX_CANTCREAT);
                }
            }
        }
        None => {
            let path = asked.unwrap_or_else(default_socket_path);
            match bind(&path).await {
                Ok(l) => (l, path),
                Err(e) => {
                    eprintln!("revisd: {e}");
                    return ExitCode::from(EX_CANTCREAT);
                }
            }
        }
    };
    // The socket file we bound, to remove on exit only if it is still there:
    // a service manager that took the path over since then keeps its socket.
    let bound = if activated { None } else { file_id(&path) };
    tracing::info!(socket = %path.display(), pid = std::process::id(), activated, "revisd {} listening", env!("CARGO_PKG_VERSION"));
    // Handlers go in before anything can announce readiness: a SIGTERM sent
    // right after "ready" must drain, not kill the process.
    let shutdown = signal();
    let result = revis_daemon::run(config, listener, shutdown, move || notify_ready(ready)).await;
    if bound.is_some() && file_id(&path) == bound {
        let _ = std::fs::remove_file(&path);
    }
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

/// Which file is at `path`: its device and inode.
fn file_id(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Installs the SIGTERM and SIGINT handlers now and returns a future that
/// resolves on the first of them.
fn signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM"),
            _ = int.recv() => tracing::info!("SIGINT"),
        }
    }
}

/// Tells whoever started us that requests are served: writes "ready\n" to
/// the readiness pipe (`REVIS_READY_FD`, checked by `take_ready_pipe`), then closes it.
fn notify_ready(pipe: Option<std::fs::File>) {
    if let Some(mut f) = pipe {
        let _ = f.write_all(b"ready\n");
    }
}
