//! `revisd pair`, `revisd server`, `revisd lend`, `revisd devices`, `revisd revoke`: the
//! server-mode controls, run on the daemon's machine against the running
//! daemon over its local socket (the only place these calls are accepted).

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use revis_client::{Client, ClientError, PairingEvent};

/// What to do with server mode.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Switch {
    On,
    Off,
    Status,
}

#[derive(clap::Subcommand)]
pub enum Action {
    /// Show a single-use pairing code for another machine's `revis pair` (server mode must be on).
    Pair {
        /// How long the code stays valid, in seconds (10..=600). Default: the config's server.pairing_window_s.
        #[arg(long)]
        window_s: Option<u32>,
    },
    /// Server mode: let paired machines use this daemon over mutual TLS, advertised on the LAN.
    Server {
        #[arg(value_enum)]
        switch: Switch,
    },
    /// Lending: let paired machines run the later layers of a model too big for them here (server mode must be on too).
    Lend {
        #[arg(value_enum)]
        switch: Switch,
    },
    /// List the devices paired with this daemon.
    Devices,
    /// Unpair a device (by device ID or name): its open calls are cut and it cannot connect again.
    Revoke { device: String },
}

pub async fn run(action: Action, socket: &Path) -> ExitCode {
    let client = match Client::connect(socket).await {
        Ok(c) => c,
        Err(e @ ClientError::NotRunning { .. }) => {
            eprintln!("revisd: {e}; start it first (`revisd`, or `revisd service install`)");
            return ExitCode::from(crate::exit::EX_UNAVAILABLE);
        }
        Err(e @ ClientError::Untrusted { .. }) => {
            eprintln!("revisd: {e}");
            return ExitCode::from(crate::exit::EX_NOPERM);
        }
        Err(e) => {
            eprintln!("revisd: {e}");
            return ExitCode::from(crate::exit::EX_UNAVAILABLE);
        }
    };
    let result = match action {
        Action::Pair { window_s } => pair(&client, window_s.unwrap_or(0)).await,
        Action::Server { switch } => server(&client, switch).await,
        Action::Lend { switch } => lend(&client, switch).await,
        Action::Devices => devices(&client).await,
        Action::Revoke { device } => revoke(&client, &device).await,
    };
    // A daemon gone in the middle reads as the client says it everywhere
    // ("no revisd answers on ..."), not as a transport error.
    result.unwrap_or_else(|e| match e {
        ClientError::Call(c) => {
            eprintln!("revisd: {}", c.message);
            ExitCode::FAILURE
        }
        e @ ClientError::Untrusted { .. } => {
            eprintln!("revisd: {e}");
            ExitCode::from(crate::exit::EX_NOPERM)
        }
        e => {
            eprintln!("revisd: {e}");
            ExitCode::from(crate::exit::EX_UNAVAILABLE)
        }
    })
}

async fn pair(client: &Client, window_s: u32) -> Result<ExitCode, ClientError> {
    let status = client.status().await?;
    let mut events = client.open_pairing(window_s).await?;
    while let Some(e) = events.next().await? {
        match e {
            PairingEvent::Opened { code, expires_in_s, listen_address, device_id } => {
                println!("Pairing is open on {} for {} s.", status.name, expires_in_s);
                println!("  Code:       {code}");
                println!("  Device ID:  {device_id}");
                println!("  Listening:  {listen_address}");
                println!("On the other machine, run `revis pair {}` and type the code.", status.name);
                println!("Waiting (Ctrl-C closes the window)...");
            }
            PairingEvent::Paired { name, device_id } => {
                println!("Paired with {name} ({device_id}).");
                return Ok(ExitCode::SUCCESS);
            }
            PairingEvent::Closed { reason } => {
                eprintln!("revisd: pairing closed: {reason}");
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    eprintln!("revisd: the daemon closed the pairing window without saying why");
    Ok(ExitCode::FAILURE)
}

async fn server(client: &Client, switch: Switch) -> Result<ExitCode, ClientError> {
    let s = match switch {
        Switch::Status => client.status().await?.server.unwrap_or_default(),
        Switch::On | Switch::Off => client.set_server_mode(matches!(switch, Switch::On)).await?,
    };
    if s.enabled {
        println!(
            "Server mode is on: listening on {} (mutual TLS){}; {} paired device(s), {} connected.",
            s.listen_address,
            if s.advertised { ", advertised on the LAN" } else { ", not advertised (server.advertise = false)" },
            s.paired_devices,
            s.remote_connections
        );
    } else {
        println!("Server mode is off: no TCP port is open; {} paired device(s).", s.paired_devices);
    }
    Ok(ExitCode::SUCCESS)
}

async fn lend(client: &Client, switch: Switch) -> Result<ExitCode, ClientError> {
    let s = match switch {
        Switch::Status => client.status().await?.server.unwrap_or_default(),
        Switch::On | Switch::Off => client.set_lending(matches!(switch, Switch::On)).await?,
    };
    if s.lending && !s.lending_refused.is_empty() {
        println!("Lending is on, but {}.", s.lending_refused.trim_end_matches('.'));
        return Ok(ExitCode::from(crate::exit::EX_UNAVAILABLE));
    }
    match (s.lending, s.enabled) {
        (true, true) => println!(
            "Lending is on: paired devices may run layers of their models here, through {} ({} session(s) now).",
            s.listen_address, s.lending_sessions
        ),
        (true, false) => println!("Lending is on, but server mode is off, so no device can reach it; `revisd server on` opens the port."),
        (false, _) => println!("Lending is off: no paired device runs layers here."),
    }
    Ok(ExitCode::SUCCESS)
}

async fn devices(client: &Client) -> Result<ExitCode, ClientError> {
    let list = client.list_devices().await?;
    if list.is_empty() {
        println!("No paired devices. Pair one with `revisd pair` here and `revis pair` there.");
    }
    for d in list {
        let seen = if d.last_seen == 0 { "never connected".to_owned() } else { format!("last seen {}", ago(d.last_seen)) };
        println!("{}  {}\n    paired {}, {}, {} open connection(s)", d.name, d.device_id, ago(d.paired_at), seen, d.connections);
    }
    Ok(ExitCode::SUCCESS)
}

async fn revoke(client: &Client, device: &str) -> Result<ExitCode, ClientError> {
    let r = client.revoke_device(device).await?;
    let d = r.device.unwrap_or_default();
    println!("Unpaired {} ({}); cut {} open connection(s).", d.name, d.device_id, r.cut_connections);
    Ok(ExitCode::SUCCESS)
}

/// "3 min ago", from seconds since the epoch.
fn ago(unix_s: u64) -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_secs();
    let d = now.saturating_sub(unix_s);
    match d {
        0..60 => format!("{d} s ago"),
        60..3600 => format!("{} min ago", d / 60),
        3600..86_400 => format!("{} h ago", d / 3600),
        _ => format!("{} days ago", d / 86_400),
    }
}
