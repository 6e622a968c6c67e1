//! Which code each `revis` subcommand runs, with the daemon it talks to
//! (a paired node, else this machine's, started when needed), a daemon that
//! cannot be reached said with what to do, and `revis status`.

use std::process::ExitCode;

use revis_client::{Client, ClientError, Paths};
use serde_json::json;

use crate::chat::chat;
use crate::cli::{Cli, Cmd};
use crate::history::history;
use crate::profile::profile;
use crate::run::run_prompt;

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let explicit_socket = cli.socket.is_some();
    command(cli).await.map_err(|e| advise(e, explicit_socket))
}

/// A daemon that cannot be reached, said with what to do about it, in one
/// sentence: `revisd --socket PATH` starts one on a socket the user chose
/// (revis starts none there); on the default socket `revis run` and `revis
/// chat` start one.
fn advise(e: anyhow::Error, explicit: bool) -> anyhow::Error {
    let Some(ClientError::NotRunning { path, .. }) = e.downcast_ref::<ClientError>() else { return e };
    let todo = if explicit {
        format!(
            "to run one: revisd --socket '{}' (revis starts no daemon on a socket chosen with --socket or REVIS_SOCKET)",
            path.display()
        )
    } else {
        "is revisd running? `revis run` or `revis chat` start it".to_owned()
    };
    anyhow::anyhow!("{e:#}; {todo}")
}

async fn command(cli: Cli) -> anyhow::Result<ExitCode> {
    let explicit_socket = cli.socket.is_some();
    crate::models::set_assume_yes(cli.yes);
    let mut paths = Paths::from_env()?;
    if let Some(s) = cli.socket {
        paths.socket = s;
    }
    let paths = &paths;
    match cli.command {
        Cmd::Pull { name, verify, default } => crate::models::pull(paths, name, verify, default).await,
        Cmd::Models => crate::models::models(paths).await,
        Cmd::Status { json } => status(paths, &target(paths, cli.node.as_deref(), explicit_socket, true).await?, json).await,
        Cmd::Load { tier } => {
            let r = target(paths, cli.node.as_deref(), explicit_socket, true).await?.load_model(tier).await?;
            let t = r.tier;
            println!("{}: {} ready in {} ms ({} MiB)", t.tier, t.model, r.elapsed_ms, t.memory_bytes >> 20);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Unload { tier } => {
            let r = target(paths, cli.node.as_deref(), explicit_socket, true).await?.unload_model(tier).await?;
            let t = r.tier;
            println!("{}: {} unloaded; daemon memory {} MiB -> {} MiB", t.tier, t.model, r.rss_before_bytes >> 20, r.rss_after_bytes >> 20);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Run(args) => {
            let client = target(paths, cli.node.as_deref(), explicit_socket, false).await?;
            if cli.node.is_some() {
                return run_prompt(&client, args).await;
            }
            // This machine's daemon, or a node for an offloaded tier; an ensemble for a tier that has one on.
            let dispatcher = crate::nodes::dispatcher(paths, client, crate::nodes::TierSettings::read(paths)).await;
            run_prompt(&dispatcher, args).await
        }
        Cmd::Chat(args) => {
            let client = target(paths, cli.node.as_deref(), explicit_socket, false).await?;
            let store = crate::session::open_store(paths)?;
            if cli.node.is_some() {
                return chat(client, store, args).await;
            }
            let dispatcher = crate::nodes::dispatcher(paths, client, crate::nodes::TierSettings::load(&store)).await;
            // Keep the nodes' health current while the chat runs.
            let _supervisor = SupervisorGuard(dispatcher.spawn_supervisor(crate::nodes::HEALTH_EVERY));
            chat(dispatcher, store, args).await
        }
        Cmd::Offload(a) => crate::nodes::offload(paths, explicit_socket, a).await,
        Cmd::Ensemble(a) => crate::ensemble::ensemble(paths, explicit_socket, a).await,
        Cmd::History { show } => history(paths, show),
        Cmd::Profile { cmd } => profile(paths, cmd),
        Cmd::Nodes(a) => crate::nodes::nodes(paths, a).await,
        Cmd::Pair(a) => crate::nodes::pair(paths, a).await,
        Cmd::Unpair { node } => crate::nodes::unpair(paths, &node),
        Cmd::Serve(a) => crate::serve::serve(paths, cli.node.as_deref(), explicit_socket, *a).await,
    }
}

/// Stops the node health checks when the chat ends.
struct SupervisorGuard(tokio::task::JoinHandle<()>);

impl Drop for SupervisorGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The daemon a command talks to: a paired node (`--node`), else the local
/// one (started when none answers, unless `only_connect`).
async fn target(paths: &Paths, node: Option<&str>, explicit: bool, only_connect: bool) -> anyhow::Result<Client> {
    match node {
        Some(n) => crate::nodes::connect(paths, n).await,
        None if only_connect => crate::session::connect(&paths.socket).await,
        None => crate::session::connect_or_start(&paths.socket, explicit).await,
    }
}

async fn status(paths: &Paths, client: &Client, as_json: bool) -> anyhow::Result<ExitCode> {
    let s = client.status().await?;
    if as_json {
        let tiers: Vec<_> = s
            .tiers
            .iter()
            .map(|t| {
                json!({
                    "tier": t.tier.as_str(), "model": t.model, "model_path": t.model_path, "state": t.state.as_str(),
                    "memory_bytes": t.memory_bytes, "cached_prefixes": t.cached_prefixes, "cache_bytes": t.cache_bytes,
                    "context_tokens": t.context_tokens, "shared_with": t.shared_with.iter().map(|t| t.as_str()).collect::<Vec<_>>(),
                    "split": t.split, "threads": t.threads, "threads_auto": t.threads_auto,
                })
            })
            .collect();
        let v = json!({
            "version": s.version, "pid": s.pid, "uptime_s": s.uptime_s, "daemon": client.target().to_string(),
            "rss_bytes": s.rss_bytes, "busy": s.busy, "queue_depth": s.queue_depth,
            "queue_capacity": s.queue_capacity, "tiers": tiers,
            "device_id": s.device_id, "name": s.name, "ensembles": crate::ensemble::status_json(paths, client),
            "server": s.server.as_ref().map(|m| json!({
                "enabled": m.enabled, "listen_address": m.listen_address, "advertised": m.advertised,
                "remote_connections": m.remote_connections, "paired_devices": m.paired_devices, "pairing_open": m.pairing_open,
                "lending": m.lending, "lending_sessions": m.lending_sessions, "lending_refused": m.lending_refused,
            })),
            "memory_free_bytes": s.memory_free_bytes,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("revisd {} (pid {}, up {}s) on {}", s.version, s.pid, s.uptime_s, client.target());
    println!("memory {} MiB, queue {}/{}, {}", s.rss_bytes >> 20, s.queue_depth, s.queue_capacity, if s.busy { "busy" } else { "idle" });
    if let Some(line) = crate::nodes::server_line(&s) {
        println!("{line}");
    }
    if let Some(lines) = crate::nodes::placement_lines(paths, client).await {
        for l in lines {
            println!("{l}");
        }
    }
    for t in &s.tiers {
        let shared = if t.shared_with.is_empty() {
            String::new()
        } else {
            format!(" (shared with {})", t.shared_with.iter().map(|t| t.as_str()).collect::<Vec<_>>().join(", "))
        };
        let shared = if t.split.is_empty() { shared } else { format!("{shared}; {}", t.split) };
        // "auto" threads are chosen for the load of the moment: say what they are now.
        let threads = match (t.threads, t.threads_auto) {
            (0, true) => ", threads auto".to_owned(),
            (n, true) => format!(", threads auto ({n} now)"),
            (0, false) => String::new(),
            (n, false) => format!(", {n} threads"),
        };
        println!(
            "  {}: {:<22} {:<9} {:>4} MiB, ctx {}{threads}, {} cached prefixes{shared}",
            t.tier,
            t.model,
            t.state.as_str(),
            t.memory_bytes >> 20,
            t.context_tokens,
            t.cached_prefixes
        );
    }
    Ok(ExitCode::SUCCESS)
}
