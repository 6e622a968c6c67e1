//! `revis serve`: OpenAI's and Ollama's HTTP APIs on this machine
//! (revis-http), answered through the same dispatcher as `revis chat`: an
//! offloaded tier runs on its node and falls back like any other task.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use revis_client::Paths;
use revis_http::{Backend, Limits, Options};

#[derive(Args)]
pub struct ServeArgs {
    /// Where to listen. Loopback only (127.0.0.1 or ::1): beyond this machine would need TLS, not done yet.
    #[arg(long, default_value = revis_http::DEFAULT_ADDR)]
    addr: SocketAddr,
    /// Ask no API key (loopback addresses only). By default every request must send
    /// `Authorization: Bearer KEY`, OpenAI's and Ollama's alike.
    #[arg(long)]
    no_key: bool,
    /// Print the API key (made now if there is none yet) and exit.
    #[arg(long, conflicts_with = "no_key")]
    show_key: bool,
    /// Generations running at once; one more is refused with 429.
    #[arg(long, default_value_t = Limits::default().max_generations)]
    max_generations: usize,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = Limits::default().max_body_bytes)]
    max_body_bytes: usize,
    /// Connections open at once; more wait to be accepted.
    #[arg(long, default_value_t = Limits::default().max_connections)]
    max_connections: usize,
}

/// How long answers under way may take to end once a stop is asked.
const GRACE: Duration = Duration::from_secs(3);

pub async fn serve(paths: &Paths, node: Option<&str>, explicit_socket: bool, a: ServeArgs) -> anyhow::Result<ExitCode> {
    if a.show_key {
        println!("{}", revis_http::load_or_create_key(&paths.data)?);
        return Ok(ExitCode::SUCCESS);
    }
    revis_http::check_bind(a.addr, a.no_key)?;
    anyhow::ensure!(a.max_generations >= 1 && a.max_connections >= 1, "--max-generations and --max-connections must be at least 1");
    let key = if a.no_key { None } else { Some(revis_http::load_or_create_key(&paths.data)?) };
    let limits = Limits { max_body_bytes: a.max_body_bytes, max_generations: a.max_generations, max_connections: a.max_connections };
    let opts = Options { key, limits, loopback_host_only: a.addr.ip().is_loopback() };
    if let Some(n) = node {
        return run(crate::nodes::connect(paths, n).await?, a.addr, opts, paths).await;
    }
    let client = crate::session::connect_or_start(&paths.socket, explicit_socket).await?;
    // The tier settings (offload, ensembles), read once: the store is not held open while serving.
    let dispatcher = crate::nodes::dispatcher(paths, client, crate::nodes::TierSettings::read(paths)).await;
    let supervisor = dispatcher.spawn_supervisor(crate::nodes::HEALTH_EVERY);
    let r = run(dispatcher, a.addr, opts, paths).await;
    supervisor.abort();
    r
}

async fn run<B: Backend>(backend: B, addr: SocketAddr, opts: Options, paths: &Paths) -> anyhow::Result<ExitCode> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("listening on {addr}"))?;
    let local = listener.local_addr()?;
    let key = match &opts.key {
        Some(_) => {
            format!("API key required (`revis serve --show-key` prints it; kept in {})", paths.data.join(revis_http::KEY_FILE).display())
        }
        None => "no API key (--no-key)".to_owned(),
    };
    // The first line says where: tests and scripts read the port from it (with --addr 127.0.0.1:0).
    println!("revis serve: listening on http://{local} (OpenAI: http://{local}/v1, Ollama: http://{local}); {key}");
    let limits = opts.limits;
    let router = revis_http::router(backend, opts);
    revis_http::serve(listener, router, limits, stop_signal(), GRACE).await?;
    Ok(ExitCode::SUCCESS)
}

/// SIGTERM or SIGINT.
async fn stop_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("no SIGTERM handler ({e}); Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
