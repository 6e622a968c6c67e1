//! `revis nodes`, `revis pair`, `revis unpair` and `--node`: other machines' daemons.

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use revis_client::dispatch::{Deadlines, Dispatcher, Offload, Placement};
use revis_client::ensemble::EnsembleSpec;
use revis_client::nodes::{Health, find_unpaired, names, node_rows, probe};
use revis_client::{Client, Discovered, Keyring, PairingCode, interfaces_from_env};
use revis_client::{DaemonStatus, Paths, Tier};
use revis_store::Store;
use serde_json::json;

/// How often a running chat checks its nodes' health.
pub const HEALTH_EVERY: Duration = Duration::from_secs(2);

/// How long `--node` looks for the node on the LAN before it tries the
/// address it last reached it at.
const RESOLVE_WAIT: Duration = Duration::from_secs(3);

#[derive(Args)]
pub struct NodesArgs {
    /// How long to listen for advertisements, in milliseconds.
    #[arg(long, default_value_t = 1500)]
    wait_ms: u64,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct OffloadArgs {
    /// tier1, tier2 or tier3.
    tier: Tier,
    #[arg(value_enum)]
    switch: OnOff,
    /// Only this paired node (default: any healthy node that serves the tier, least loaded first).
    #[arg(long)]
    node: Option<String>,
    /// Keep the model loaded here too, and share background tasks with this machine.
    #[arg(long)]
    keep_local: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

#[derive(Args)]
pub struct PairArgs {
    /// The node: its name as `revis nodes` shows it, its device ID, or HOST:PORT.
    node: String,
    /// The code the node shows (`revisd pair` there). Asked for when not given.
    #[arg(long, env = "REVIS_PAIRING_CODE")]
    code: Option<String>,
    /// The name the node will list this machine under. Default: this machine's host name.
    #[arg(long)]
    name: Option<String>,
    /// The name to list the node under here, when NODE is an address.
    #[arg(long = "as")]
    as_name: Option<String>,
}

/// Connects to the paired node a person named.
pub async fn connect(paths: &Paths, what: &str) -> anyhow::Result<Client> {
    let keyring = Keyring::open(&paths.keyring())?;
    let node = revis_client::resolve(&keyring, what, interfaces_from_env().as_ref(), RESOLVE_WAIT).await?;
    Ok(Client::connect_node(&keyring, &node).await?)
}

pub async fn nodes(paths: &Paths, a: NodesArgs) -> anyhow::Result<ExitCode> {
    let keyring = Keyring::open(&paths.keyring())?;
    let seen = browse(Duration::from_millis(a.wait_ms), |_| false).await;
    let (seen, browse_error) = match seen {
        Ok(s) => (s, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    // Paired nodes first, each probed over mutual TLS; then what is advertised and not paired.
    let mut rows = Vec::new();
    for mut row in node_rows(&keyring, &seen) {
        if row.paired {
            row.health = probe(&keyring, &row).await;
        }
        let mut v = json!({
            "name": row.name, "device_id": row.device_id, "paired": row.paired, "discovered": row.discovered,
            "address": row.address, "warning": row.warning,
        });
        match row.health {
            Health::Ok { connect_ms, latency_ms, tiers, queue } => {
                v["health"] = json!("ok");
                v["connect_ms"] = json!(round1(connect_ms));
                v["latency_ms"] = json!(round1(latency_ms));
                v["tiers"] = json!(tiers.iter().map(|(t, m, st)| json!({"tier": t, "model": m, "state": st})).collect::<Vec<_>>());
                v["queue"] = json!(queue);
            }
            Health::Failed(why) => v["health"] = json!(why),
            Health::Unknown => {
                // Not paired: what its advertisement says.
                if let Some(ad) = seen.iter().find(|d| d.device_id.to_string() == row.device_id) {
                    v["tiers"] = json!(ad.tiers);
                    v["version"] = json!(ad.version);
                }
            }
        }
        rows.push(v);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&json!({"nodes": rows, "browse_error": browse_error}))?);
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(e) = &browse_error {
        eprintln!("revis: {e}");
    }
    if rows.is_empty() {
        println!("No nodes found. On the other machine run `revisd server on`, then `revisd pair`.");
    }
    for r in &rows {
        let name = r["name"].as_str().unwrap_or("");
        let addr = r["address"].as_str().unwrap_or("no address");
        if r["paired"] == json!(true) {
            let health = r["health"].as_str().unwrap_or("");
            if health == "ok" {
                let tiers: Vec<String> = r["tiers"]
                    .as_array()
                    .map(|ts| {
                        ts.iter()
                            .map(|t| {
                                format!(
                                    "{}={} ({})",
                                    t["tier"].as_str().unwrap_or(""),
                                    t["model"].as_str().unwrap_or(""),
                                    t["state"].as_str().unwrap_or("")
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                println!(
                    "{name}  paired, {addr}, ok: connect {} ms, status {} ms, queue {}\n    {}",
                    r["connect_ms"],
                    r["latency_ms"],
                    r["queue"].as_str().unwrap_or(""),
                    tiers.join(", ")
                );
            } else {
                println!("{name}  paired, {addr}: {health}");
            }
        } else {
            let tiers =
                r["tiers"].as_array().map(|t| t.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(",")).unwrap_or_default();
            println!("{name}  not paired, {addr}, serves {tiers}; pair with `revis pair {name}`");
            if let Some(w) = r["warning"].as_str() {
                println!("    warning: {w}");
            }
        }
        println!("    device ID {}", r["device_id"].as_str().unwrap_or(""));
    }
    Ok(ExitCode::SUCCESS)
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Browses for `wait`, or until `done` says enough was found.
async fn browse(wait: Duration, done: impl FnMut(&[Discovered]) -> bool) -> anyhow::Result<Vec<Discovered>> {
    let Some(interfaces) = interfaces_from_env() else {
        bail!("mDNS is off (REVIS_MDNS_INTERFACES=none): nothing is discovered; pair with HOST:PORT")
    };
    Ok(revis_client::browse(&interfaces, wait, done).await?)
}

pub async fn pair(paths: &Paths, a: PairArgs) -> anyhow::Result<ExitCode> {
    let mut keyring = Keyring::open(&paths.keyring())?;
    let (addr, server_name) = find(&a.node, a.as_name.as_deref()).await?;
    let code: PairingCode = match a.code {
        Some(c) => c.parse()?,
        None => ask_code(&server_name)?,
    };
    let my_name = a.name.unwrap_or_else(|| revis_client::host_name("revis-client"));
    let id = revis_client::pair(&mut keyring, addr, &server_name, &code, &my_name).await?;
    println!("Paired with {server_name} ({id}) at {addr}. Use it with `revis run --node {server_name} ...`.");
    Ok(ExitCode::SUCCESS)
}

/// Where to pair: an address as given, or the one advertisement whose name
/// or device ID is `what` (looked for until it shows, for up to [`RESOLVE_WAIT`]).
async fn find(what: &str, as_name: Option<&str>) -> anyhow::Result<(SocketAddr, String)> {
    let seen =
        if what.parse::<SocketAddr>().is_ok() { Vec::new() } else { browse(RESOLVE_WAIT, |s| s.iter().any(|d| names(d, what))).await? };
    let (addr, name) = find_unpaired(what, &seen).map_err(anyhow::Error::msg)?;
    Ok((addr, as_name.map_or(name, str::to_owned)))
}

fn ask_code(server: &str) -> anyhow::Result<PairingCode> {
    if !std::io::stdin().is_terminal() {
        bail!("give the code with --code (stdin is not a terminal)");
    }
    eprint!("The code {server} shows (run `revisd pair` there): ");
    std::io::stderr().flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(line.trim().parse()?)
}

/// Forgets a paired node here (the node itself still lists this machine
/// until it revokes it with `revisd revoke`).
pub fn unpair(paths: &Paths, what: &str) -> anyhow::Result<ExitCode> {
    let mut keyring = Keyring::open(&paths.keyring())?;
    let Some(d) = keyring.store.find(what)?.cloned() else { bail!("no paired node is called or has the ID {what:?}") };
    keyring.store.revoke(&d.device_id)?;
    println!("Forgot {} ({}). It may still list this machine: run `revisd revoke` there too.", d.name, d.device_id);
    Ok(ExitCode::SUCCESS)
}

/// Server mode as `revis status` shows it (local daemon only).
pub fn server_line(s: &DaemonStatus) -> Option<String> {
    let server = s.server.as_ref()?;
    Some(if server.enabled {
        format!(
            "server mode on: {} (mutual TLS){}, {} paired, {} connected{}; device ID {}",
            server.listen_address,
            if server.advertised { ", advertised" } else { "" },
            server.paired_devices,
            server.remote_connections,
            match (server.lending, server.lending_refused.as_str()) {
                (false, _) => String::new(),
                (true, "") => format!(", lending ({} session(s))", server.lending_sessions),
                (true, why) => format!(", lending on, but {why}"),
            },
            s.device_id
        )
    } else {
        format!("server mode off ({} paired); device ID {}", server.paired_devices, s.device_id)
    })
}

/// What the user chose for each tier, as the store keeps it: where it runs
/// (offload) and which models answer it together (ensembles).
#[derive(Default)]
pub struct TierSettings {
    pub offload: BTreeMap<Tier, Offload>,
    pub ensembles: BTreeMap<Tier, EnsembleSpec>,
}

impl TierSettings {
    pub fn load(store: &Store) -> TierSettings {
        TierSettings { offload: revis_orchestrator::offload::load_all(store), ensembles: revis_orchestrator::ensemble::load_all(store) }
    }

    /// Read once from the store, which is not held open afterwards (`revis
    /// chat` may need it); none when it cannot be opened.
    pub fn read(paths: &Paths) -> TierSettings {
        match crate::session::open_store(paths) {
            Ok(store) => TierSettings::load(&store),
            Err(e) => {
                tracing::warn!("the store is not available ({e:#}); every tier runs here, alone");
                TierSettings::default()
            }
        }
    }
}

/// A dispatcher over this machine's daemon and the paired nodes, following
/// the user's tier settings; the nodes are probed once when a tier is
/// offloaded or an ensemble has a member on one.
pub async fn dispatcher(paths: &Paths, local: Client, settings: TierSettings) -> Dispatcher {
    let keyring = match Keyring::open(&paths.keyring()) {
        Ok(k) => Some(std::sync::Arc::new(k)),
        Err(e) => {
            tracing::warn!("no keyring ({e}); running here");
            None
        }
    };
    let any = settings.offload.values().any(|o| o.enabled)
        || settings.ensembles.values().any(|e| e.enabled && e.members.iter().any(|m| m.node.is_some()));
    let d = Dispatcher::new(local, keyring, interfaces_from_env(), settings.offload, Deadlines::default());
    revis_orchestrator::ensemble::apply(&d, settings.ensembles);
    if any {
        d.refresh().await;
    }
    d
}

pub async fn offload(paths: &Paths, explicit: bool, a: OffloadArgs) -> anyhow::Result<ExitCode> {
    let keyring = Keyring::open(&paths.keyring())?;
    if let Some(n) = &a.node
        && keyring.store.find(n)?.is_none()
    {
        bail!("no paired node is called or has the ID {n:?}; `revis nodes` lists them, `revis pair NODE` pairs one");
    }
    if a.switch == OnOff::On && keyring.store.devices().is_empty() {
        bail!("no node is paired yet; pair one first (`revis pair NODE`)");
    }
    drop(keyring);
    let store = crate::session::open_store(paths)?;
    let setting = Offload { enabled: a.switch == OnOff::On, node: a.node.clone(), keep_local: a.keep_local };
    revis_orchestrator::offload::save(&store, a.tier, &setting)?;
    let local = crate::session::connect_or_start(&paths.socket, explicit).await?;
    let d = dispatcher(paths, local, TierSettings::load(&store)).await;
    d.refresh().await;
    if a.switch == OnOff::Off || a.keep_local {
        // Home now, or kept here too: its model is loaded here (again, if an offload unloaded it).
        d.local().load_model(a.tier).await?;
    }
    let placements = d.placements();
    match placements.get(&a.tier) {
        Some(Placement::Node(n)) => {
            // Placement keeps a model here that a tier still running here uses: say which.
            let runs_here = |t: &Tier| !matches!(placements.get(t), Some(Placement::Node(_))) || d.offload(*t).keep_local;
            let users: Vec<String> = match d.local().status().await?.tier(a.tier) {
                Some(t) if t.state != revis_client::ModelState::Unloaded => {
                    t.shared_with.iter().filter(|o| runs_here(o)).map(Tier::to_string).collect()
                }
                _ => Vec::new(),
            };
            let here = match (a.keep_local, users.is_empty()) {
                (true, _) => " (and here)".to_owned(),
                (false, true) => "; its model was unloaded here".to_owned(),
                (false, false) => format!("; its model stays loaded here for {}", users.join(" and ")),
            };
            println!("{} runs on {n} now{here}.", a.tier)
        }
        Some(Placement::FallenBack) => {
            println!("{} is offloaded, but no paired node that serves it answers now: it runs here until one does.", a.tier)
        }
        _ => println!("{} runs here.", a.tier),
    }
    Ok(ExitCode::SUCCESS)
}

/// Where each offloaded tier runs and which tiers an ensemble answers, for
/// `revis status`; None when no tier is offloaded and no ensemble is on.
pub async fn placement_lines(paths: &Paths, local: &Client) -> Option<Vec<String>> {
    if !matches!(local.target(), revis_client::Target::Socket(_)) {
        return None;
    }
    let settings = TierSettings::load(&crate::session::open_store(paths).ok()?);
    let ensembles = crate::ensemble::status_lines(&settings.ensembles);
    let mut lines = Vec::new();
    if settings.offload.values().any(|o| o.enabled) {
        let d = dispatcher(paths, local.clone(), settings).await;
        let nodes = d.nodes();
        lines.extend(d.placements().into_iter().filter(|(t, _)| d.offload(*t).enabled).map(|(tier, p)| match p {
            Placement::Node(name) => {
                let n = nodes.iter().find(|n| n.name == name);
                format!(
                    "  {tier}: offloaded to {name} ({} ms, queue {})",
                    n.map_or(0.0, |n| round1(n.latency_ms)),
                    n.map_or(0, |n| n.queue_depth)
                )
            }
            _ => format!("  {tier}: offloaded, but no node that serves it answers: running here"),
        }));
    }
    lines.extend(ensembles);
    (!lines.is_empty()).then_some(lines)
}
