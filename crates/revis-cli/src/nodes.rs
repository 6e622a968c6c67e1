//! `revis nodes`, `revis pair`, `revis unpair` and `--node`: other machines' daemons.

use std::io::{BufRead, IsTerminal, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use revis_client::{Client, DeviceId, Discovered, Keyring, Node, PairingCode, interfaces_from_env, v1 as pb};
use serde_json::json;

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
pub async fn connect(what: &str) -> anyhow::Result<Client> {
    let keyring = Keyring::open_default()?;
    let node = revis_client::resolve(&keyring, what, interfaces_from_env().as_ref(), RESOLVE_WAIT).await?;
    Ok(Client::connect_node(&keyring, &node).await?)
}

pub async fn nodes(a: NodesArgs) -> anyhow::Result<ExitCode> {
    let keyring = Keyring::open_default()?;
    let seen = browse(Duration::from_millis(a.wait_ms), |_| false).await;
    let (seen, browse_error) = match seen {
        Ok(s) => (s, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let mut rows = Vec::new();
    // Paired nodes first, each probed over mutual TLS.
    for d in keyring.store.devices() {
        let ad = seen.iter().find(|s| s.device_id == d.device_id);
        let addr = ad.and_then(|s| s.addresses.first().copied()).or_else(|| d.address.as_deref().and_then(|a| a.parse().ok()));
        let mut row = json!({
            "name": d.name, "device_id": d.device_id.to_string(), "paired": true, "discovered": ad.is_some(),
            "address": addr.map(|a| a.to_string()),
        });
        if let Some(addr) = addr {
            let node = Node { name: d.name.clone(), device_id: d.device_id, addr };
            let t0 = Instant::now();
            match Client::connect_node(&keyring, &node).await {
                Ok(mut c) => {
                    let connect_ms = t0.elapsed().as_secs_f64() * 1e3;
                    let t1 = Instant::now();
                    let s = c.status().await?;
                    row["health"] = json!("ok");
                    row["connect_ms"] = json!(round1(connect_ms));
                    row["latency_ms"] = json!(round1(t1.elapsed().as_secs_f64() * 1e3));
                    row["version"] = json!(s.version);
                    row["tiers"] = json!(s.tiers.iter().map(|t| json!({"tier": t.tier, "model": t.model, "state": crate::commands::state_name(t.state)})).collect::<Vec<_>>());
                    row["queue"] = json!(format!("{}/{}", s.queue_depth, s.queue_capacity));
                }
                Err(e) => row["health"] = json!(e.to_string()),
            }
        } else {
            row["health"] = json!("not found on the network; no known address");
        }
        rows.push(row);
    }
    // Then what is advertised and not paired.
    for s in &seen {
        if keyring.store.get(&s.device_id).is_some() {
            continue;
        }
        let mut row = json!({
            "name": s.name, "device_id": s.device_id.to_string(), "paired": false, "discovered": true,
            "address": s.addresses.first().map(|a| a.to_string()), "version": s.version, "tiers": s.tiers,
        });
        // A stranger using a paired node's name: shown, never trusted.
        if keyring.store.devices().iter().any(|d| d.name == s.name) {
            row["warning"] = json!(format!(
                "uses the name of a paired node but has another device ID: not that node, ignored"
            ));
        }
        rows.push(row);
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
                    .map(|ts| ts.iter().map(|t| format!("{}={} ({})", t["tier"].as_str().unwrap_or(""), t["model"].as_str().unwrap_or(""), t["state"].as_str().unwrap_or(""))).collect())
                    .unwrap_or_default();
                println!(
                    "{name}  paired, {addr}, ok: connect {} ms, status {} ms, queue {}\n    {}",
                    r["connect_ms"], r["latency_ms"], r["queue"].as_str().unwrap_or(""), tiers.join(", ")
                );
            } else {
                println!("{name}  paired, {addr}: {health}");
            }
        } else {
            let tiers = r["tiers"].as_array().map(|t| t.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(",")).unwrap_or_default();
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

pub async fn pair(a: PairArgs) -> anyhow::Result<ExitCode> {
    let mut keyring = Keyring::open_default()?;
    let (addr, server_name) = find_unpaired(&a.node, a.as_name.as_deref()).await?;
    let code: PairingCode = match a.code {
        Some(c) => c.parse()?,
        None => ask_code(&server_name)?,
    };
    let my_name = a.name.unwrap_or_else(|| revis_client::host_name("revis-client"));
    let id = revis_client::pair(&mut keyring, addr, &server_name, &code, &my_name).await?;
    println!("Paired with {server_name} ({id}) at {addr}. Use it with `revis run --node {server_name} ...`.");
    Ok(ExitCode::SUCCESS)
}

/// Where to pair: an address as given, or the advertisement whose name or
/// device ID is `what` (exactly one).
async fn find_unpaired(what: &str, as_name: Option<&str>) -> anyhow::Result<(SocketAddr, String)> {
    if let Ok(addr) = what.parse::<SocketAddr>() {
        return Ok((addr, as_name.map_or_else(|| addr.ip().to_string(), str::to_owned)));
    }
    let id = what.parse::<DeviceId>().ok();
    let matches = |d: &Discovered| id.map_or(d.name == what, |id| d.device_id == id);
    let seen = browse(RESOLVE_WAIT, |s| s.iter().any(matches)).await?;
    let found: Vec<&Discovered> = seen.iter().filter(|d| matches(d)).collect();
    match found.as_slice() {
        [] => bail!(
            "no node called {what:?} answered on the network within {}s; is its server mode on (`revisd server on`)? You can also give HOST:PORT",
            RESOLVE_WAIT.as_secs()
        ),
        [d] => {
            let addr = d.addresses.first().copied().with_context(|| format!("{what} advertised no IPv4 address"))?;
            Ok((addr, as_name.unwrap_or(&d.name).to_owned()))
        }
        several => {
            let ids: Vec<String> = several.iter().map(|d| d.device_id.to_string()).collect();
            bail!("several nodes are called {what:?}; pair by device ID instead (compare with `revisd pair` on the machine you mean): {}", ids.join(", "))
        }
    }
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
pub fn unpair(what: &str) -> anyhow::Result<ExitCode> {
    let mut keyring = Keyring::open_default()?;
    let Some(d) = keyring.store.find(what)?.cloned() else { bail!("no paired node is called or has the ID {what:?}") };
    keyring.store.revoke(&d.device_id)?;
    println!("Forgot {} ({}). It may still list this machine: run `revisd revoke` there too.", d.name, d.device_id);
    Ok(ExitCode::SUCCESS)
}

/// Server mode as `revis status` shows it (local daemon only).
pub fn server_line(s: &pb::StatusResponse) -> Option<String> {
    let server = s.server.as_ref()?;
    Some(if server.enabled {
        format!(
            "server mode on: {} (mutual TLS){}, {} paired, {} connected; device ID {}",
            server.listen_address,
            if server.advertised { ", advertised" } else { "" },
            server.paired_devices,
            server.remote_connections,
            s.device_id
        )
    } else {
        format!("server mode off ({} paired); device ID {}", server.paired_devices, s.device_id)
    })
}
