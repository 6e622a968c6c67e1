//! `revis serve`: OpenAI's and Ollama's HTTP APIs on this machine
//! (revis-http), answered through the same dispatcher as `revis chat`: an
//! offloaded tier runs on its node and falls back like any other task.
//! `revis serve install | uninstall | status | logs` runs it as a user
//! service next to revisd's, handed to revis-service.
//!
//! One job a file: here the server run in the foreground; `flags.rs`, the
//! command line (how it serves, checked before anything binds);
//! `service.rs`, the service that runs it in the background.

mod flags;
mod service;

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use revis_client::{Paths, Runner};
use revis_http::{Limits, Options};

use self::flags::EX_USAGE;
pub use self::flags::ServeArgs;
use self::service::{Globals, service};

/// How long answers under way may take to end once a stop is asked.
const GRACE: Duration = Duration::from_secs(3);

pub async fn serve(paths: &Paths, node: Option<&str>, explicit_socket: bool, a: ServeArgs) -> anyhow::Result<ExitCode> {
    if let Some(action) = a.action {
        let globals =
            Globals { socket: explicit_socket.then(|| paths.socket.clone()), node: node.map(str::to_owned), data: paths.data.clone() };
        // systemctl, launchctl and the status probe block.
        return tokio::task::spawn_blocking(move || service(&globals, action)).await?;
    }
    if a.show_key {
        println!("{}", revis_http::load_or_create_key(&paths.data)?);
        return Ok(ExitCode::SUCCESS);
    }
    let a = a.flags;
    if let Err(e) = a.check() {
        eprintln!("revis: {e:#}");
        return Ok(ExitCode::from(EX_USAGE));
    }
    let key = if a.no_key { None } else { Some(revis_http::load_or_create_key(&paths.data)?) };
    let tls = match a.https_identity(paths) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("revis: the HTTPS certificate: {e:#}");
            return Ok(ExitCode::from(EX_USAGE));
        }
    };
    let limits = Limits {
        max_body_bytes: a.max_body_bytes,
        max_generations: a.max_generations,
        max_connections: a.max_connections,
        header_timeout: Duration::from_millis(a.header_timeout_ms),
        write_timeout: Duration::from_millis(a.write_timeout_ms),
    };
    let opts = Options {
        key,
        limits,
        loopback_host_only: a.addr.ip().is_loopback(),
        allowed_origins: a.allow_origins.clone(),
        allow_pull: a.allow_pull,
        max_pull_bytes: a.max_pull_bytes.unwrap_or_else(|| revis_models::machine::memory_bytes() / 2),
    };
    if let Some(n) = node {
        return run(crate::nodes::connect(paths, n).await?, a.addr, opts, tls, paths).await;
    }
    let client = crate::session::connect_or_start(&paths.socket, explicit_socket).await?;
    // The tier settings (offload, ensembles), read once: the store is not held open while serving.
    let dispatcher = crate::nodes::dispatcher(paths, client, crate::nodes::TierSettings::read(paths)).await;
    let supervisor = dispatcher.spawn_supervisor(crate::nodes::HEALTH_EVERY);
    let r = run(dispatcher, a.addr, opts, tls, paths).await;
    supervisor.abort();
    r
}

async fn run<R: Runner>(
    runner: R,
    addr: SocketAddr,
    opts: Options,
    tls: Option<revis_http::HttpsIdentity>,
    paths: &Paths,
) -> anyhow::Result<ExitCode> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("listening on {addr}"))?;
    let local = listener.local_addr()?;
    let key = match &opts.key {
        Some(_) => {
            format!("API key required (`revis serve --show-key` prints it; kept in {})", paths.data.join(revis_http::KEY_FILE).display())
        }
        None => "no API key (--no-key)".to_owned(),
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    // The first line says where: tests and scripts read the port from it (with --addr 127.0.0.1:0).
    let mut said =
        format!("revis serve: listening on {scheme}://{local} (OpenAI: {scheme}://{local}/v1, Ollama: {scheme}://{local}); {key}\n");
    if let Some(t) = &tls {
        let names = if t.names.is_empty() { String::new() } else { format!(", valid for {}", t.names.join(", ")) };
        said += &format!("revis serve: HTTPS; clients trust {} (SHA-256 {}){names}\n", t.cert_path.display(), t.fingerprint);
    }
    announce(&said);
    let limits = opts.limits;
    let router = revis_http::router(runner, opts);
    revis_http::serve(listener, router, limits, tls, stop_signal(), GRACE).await?;
    Ok(ExitCode::SUCCESS)
}

/// Says where the server listens, in one write, and goes on serving when
/// nobody reads it: a reader that takes the first line and closes the pipe
/// (`revis serve | head -1`, a script after the port) must not end the server.
fn announce(said: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(said.as_bytes()).and_then(|()| out.flush()) {
        tracing::info!("stdout closed ({e}); serving on");
    }
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
