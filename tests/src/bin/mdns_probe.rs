//! `mdns-probe`: advertises or browses revis over mDNS for the end-to-end tests, which run it inside their own network namespaces (never in the root one).
//!
//! - `advertise`: prints `advertising` once started, then advertises until
//!   stdin closes or SIGTERM; withdraws, prints `withdrawn`, exits 0.
//! - `browse`: prints one JSON line per device found when it stops. With
//!   `--id`, stops as soon as that device is found. With `--until-gone`,
//!   prints `{"seen": ..}` when that device is found, stops once it is
//!   withdrawn, and exits 3 if that did not happen within `--wait-ms`.
//!
//! Errors (a missing interface, say) go to stderr, exit code 1.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use revis_trust::{Advertisement, Advertiser, DeviceId, Discovered, Identity, Interfaces};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Advertise {
        #[arg(long)]
        name: String,
        /// Default: a fresh identity's.
        #[arg(long)]
        id: Option<DeviceId>,
        #[arg(long)]
        port: u16,
        #[arg(long)]
        interface: String,
        #[arg(long, value_delimiter = ',', default_value = "fast,smart")]
        tiers: Vec<String>,
    },
    Browse {
        #[arg(long)]
        interface: String,
        #[arg(long)]
        wait_ms: u64,
        #[arg(long, conflicts_with = "until_gone")]
        id: Option<DeviceId>,
        #[arg(long)]
        until_gone: Option<DeviceId>,
    },
}

fn main() -> ExitCode {
    run().unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        ExitCode::FAILURE
    })
}

fn run() -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match Args::parse().command {
        Command::Advertise { name, id, port, interface, tiers } => {
            let device_id = match id {
                Some(id) => id,
                None => Identity::generate()?.device_id(),
            };
            let version = env!("CARGO_PKG_VERSION").to_owned();
            let ad = Advertisement { name, device_id, port, version, tiers };
            runtime.block_on(advertise(&ad, interface))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Browse { interface, wait_ms, id, until_gone } => {
            let wait = Duration::from_millis(wait_ms);
            runtime.block_on(browse(interface, wait, id, until_gone))
        }
    }
}

async fn advertise(ad: &Advertisement, interface: String) -> anyhow::Result<()> {
    // Before anything is advertised, so a SIGTERM always withdraws.
    let mut terminate = signal(SignalKind::terminate())?;
    let (closed, stdin_closed) = tokio::sync::oneshot::channel();
    // A plain thread: a blocked read must not keep the runtime from ending.
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        let _ = closed.send(());
    });
    let advertiser = Advertiser::start(ad, &Interfaces::Named(vec![interface]))?;
    say("advertising");
    tokio::select! {
        _ = terminate.recv() => {}
        _ = stdin_closed => {}
    }
    advertiser.withdraw()?;
    say("withdrawn");
    Ok(())
}

async fn browse(interface: String, wait: Duration, id: Option<DeviceId>, until_gone: Option<DeviceId>) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let (mut seen, mut gone) = (false, false);
    let done = |found: &[Discovered]| {
        if let Some(id) = id {
            return found.iter().any(|d| d.device_id == id);
        }
        let Some(id) = until_gone else {
            return false;
        };
        match found.iter().find(|d| d.device_id == id) {
            Some(d) if !seen => {
                seen = true;
                let ms = start.elapsed().as_millis();
                say(&serde_json::json!({ "seen": json(d), "ms": ms }).to_string());
            }
            Some(_) => {}
            None => gone = seen,
        }
        gone
    };
    let found = revis_trust::browse(&Interfaces::Named(vec![interface]), wait, done).await?;
    for d in &found {
        say(&json(d).to_string());
    }
    if until_gone.is_some() && !gone {
        let what = if seen { "still advertised" } else { "never seen" };
        eprintln!("after {wait:?} the device is {what}");
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}

fn json(d: &Discovered) -> serde_json::Value {
    serde_json::json!({
        "name": d.name,
        "id": d.device_id.to_string(),
        "addresses": d.addresses.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "version": d.version,
        "tiers": d.tiers,
    })
}

/// One line on stdout, flushed (the test reads it while this runs).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
