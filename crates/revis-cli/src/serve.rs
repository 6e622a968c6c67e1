//! `revis serve`: OpenAI's and Ollama's HTTP APIs on this machine
//! (revis-http), answered through the same dispatcher as `revis chat`: an
//! offloaded tier runs on its node and falls back like any other task.
//! `revis serve install | uninstall | status | logs` runs it as a user
//! service next to revisd's, handed to revis-service.

use std::ffi::OsString;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use revis_client::{Paths, Runner};
use revis_http::{Limits, Options};
use revis_service::{InstallOptions, Layout, LogOptions};

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ServeArgs {
    #[command(flatten)]
    flags: Flags,
    /// Print the API key (made now if there is none yet) and exit.
    #[arg(long, conflicts_with = "no_key")]
    show_key: bool,
    #[command(subcommand)]
    action: Option<Action>,
}

/// How `revis serve` serves; what `revis serve install` writes into the service.
#[derive(Args, Clone, Debug, PartialEq, Eq)]
pub struct Flags {
    /// Where to listen. Beyond loopback (127.0.0.1, ::1) only with TLS and the API key.
    #[arg(long, default_value = revis_http::DEFAULT_ADDR)]
    addr: SocketAddr,
    /// Serve HTTPS with a certificate made here for this machine's names and addresses, on first use:
    /// clients trust the authority file it prints (http-tls-ca.crt in the data dir).
    #[arg(long, conflicts_with = "tls_cert")]
    tls: bool,
    /// Serve HTTPS with your own certificate (PEM, the chain after it).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Ask no API key (loopback addresses only). By default every request must send
    /// `Authorization: Bearer KEY`, OpenAI's and Ollama's alike.
    #[arg(long)]
    no_key: bool,
    /// Generations running at once; one more is refused with 429.
    #[arg(long, default_value_t = Limits::default().max_generations)]
    max_generations: usize,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = Limits::default().max_body_bytes)]
    max_body_bytes: usize,
    /// Connections open at once; more wait to be accepted. One address may hold half of them
    /// (every program on this machine shares the loopback address).
    #[arg(long, default_value_t = Limits::default().max_connections)]
    max_connections: usize,
    /// Milliseconds a client has to send a request's head, and a kept-alive connection may
    /// sit idle before its next request; then it is closed.
    #[arg(long, default_value_t = Limits::default().header_timeout.as_millis() as u64)]
    header_timeout_ms: u64,
    /// Milliseconds a response may wait on a client that takes none of it (does not read,
    /// or pipelines requests and never reads the answers); then the connection is closed.
    #[arg(long, default_value_t = Limits::default().write_timeout.as_millis() as u64)]
    write_timeout_ms: u64,
    /// A web page allowed to call, by its origin (`http://localhost:3000`); repeat for more.
    /// Requests from any other page (a browser names it in `Origin`) are refused, key or not.
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    allow_origins: Vec<String>,
    /// Serve Ollama's /api/pull and /api/delete: callers may then download models to this
    /// machine (without your Hugging Face token) and delete them. Off by default.
    #[arg(long)]
    allow_pull: bool,
    /// With --allow-pull: the largest file a pull over HTTP may fetch, in bytes.
    /// Default: half this machine's memory (what a model here can use).
    #[arg(long, value_name = "BYTES")]
    max_pull_bytes: Option<u64>,
}

impl Default for Flags {
    fn default() -> Flags {
        let limits = Limits::default();
        Flags {
            addr: revis_http::DEFAULT_ADDR.parse().expect("the default address parses"),
            tls: false,
            tls_cert: None,
            tls_key: None,
            no_key: false,
            max_generations: limits.max_generations,
            max_body_bytes: limits.max_body_bytes,
            max_connections: limits.max_connections,
            header_timeout_ms: limits.header_timeout.as_millis() as u64,
            write_timeout_ms: limits.write_timeout.as_millis() as u64,
            allow_origins: Vec::new(),
            allow_pull: false,
            max_pull_bytes: None,
        }
    }
}

impl Flags {
    /// Flags that could only fail again at every start.
    fn check(&self) -> anyhow::Result<()> {
        revis_http::check_bind(self.addr, self.no_key, self.https())?;
        anyhow::ensure!(
            self.max_generations >= 1 && self.max_connections >= 1 && self.header_timeout_ms >= 1 && self.write_timeout_ms >= 1,
            "--max-generations, --max-connections, --header-timeout-ms and --write-timeout-ms must be at least 1"
        );
        anyhow::ensure!(self.max_pull_bytes != Some(0), "--max-pull-bytes must be at least 1");
        anyhow::ensure!(
            self.max_pull_bytes.is_none() || self.allow_pull,
            "--max-pull-bytes bounds pulls, which only --allow-pull lets callers make"
        );
        Ok(())
    }

    /// Flags that could only fail again at every start of a service.
    fn check_installable(&self) -> anyhow::Result<()> {
        self.check()?;
        anyhow::ensure!(self.addr.port() != 0, "--addr {}: a service needs a port of its own, not 0 (any free one)", self.addr);
        Ok(())
    }

    /// Whether it serves HTTPS.
    fn https(&self) -> bool {
        self.tls || self.tls_cert.is_some()
    }

    /// The certificate and key it serves HTTPS with: the user's own, or
    /// the one made in the data directory (on first use).
    fn https_identity(&self, paths: &Paths) -> anyhow::Result<Option<revis_http::HttpsIdentity>> {
        Ok(match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(revis_http::HttpsIdentity::from_files(cert, key)?),
            _ if self.tls => {
                let id = revis_http::HttpsIdentity::load_or_create(&paths.data, &revis_http::https_names(self.addr.ip()))?;
                let ip = self.addr.ip().to_string();
                if id.missing.contains(&ip) {
                    anyhow::bail!(
                        "the certificate made in {} earlier is not valid for {ip}, the address asked; remove {}, {} and {} there \
                         to make new ones (clients then trust the new {})",
                        paths.data.display(),
                        revis_http::HTTPS_CERT_FILE,
                        revis_http::HTTPS_KEY_FILE,
                        revis_http::HTTPS_CA_FILE,
                        revis_http::HTTPS_CA_FILE
                    );
                }
                if !id.missing.is_empty() {
                    eprintln!(
                        "revis: the HTTPS certificate made earlier is not valid for {} (this machine's addresses changed since): \
                         clients reaching it by those get a certificate error",
                        id.missing.join(", ")
                    );
                }
                Some(id)
            }
            _ => None,
        })
    }

    /// The certificate a client (and `status`) trusts, where it is known without reading it.
    fn tls_trust(&self, data: &std::path::Path) -> Option<PathBuf> {
        match &self.tls_cert {
            Some(cert) => std::path::absolute(cert).ok(),
            None => self.tls.then(|| data.join(revis_http::HTTPS_CA_FILE)),
        }
    }

    /// Every flag, as words: the service runs what was asked, whatever the
    /// defaults of a later revis.
    fn words(&self) -> anyhow::Result<Vec<OsString>> {
        let mut w: Vec<OsString> = vec!["--addr".into(), self.addr.to_string().into()];
        if self.tls {
            w.push("--tls".into());
        }
        for (flag, path) in [("--tls-cert", &self.tls_cert), ("--tls-key", &self.tls_key)] {
            if let Some(p) = path {
                w.extend([flag.into(), std::path::absolute(p).with_context(|| format!("{}", p.display()))?.into_os_string()]);
            }
        }
        if self.no_key {
            w.push("--no-key".into());
        }
        for (flag, n) in [
            ("--max-generations", self.max_generations),
            ("--max-body-bytes", self.max_body_bytes),
            ("--max-connections", self.max_connections),
            ("--header-timeout-ms", self.header_timeout_ms as usize),
            ("--write-timeout-ms", self.write_timeout_ms as usize),
        ] {
            w.extend([flag.into(), n.to_string().into()]);
        }
        for origin in &self.allow_origins {
            w.extend(["--allow-origin".into(), origin.into()]);
        }
        if let Some(n) = self.max_pull_bytes {
            w.extend(["--max-pull-bytes".into(), n.to_string().into()]);
        }
        if self.allow_pull {
            w.push("--allow-pull".into());
        }
        Ok(w)
    }
}

/// Run `revis serve` in the background, next to revisd: a systemd user service on Linux, a LaunchAgent on macOS.
#[derive(Subcommand)]
pub enum Action {
    /// Install and start `revis serve` with these flags (and --socket or --node, if given) as a service. Safe to run again.
    Install {
        #[command(flatten)]
        flags: Flags,
        /// Write the service file but do not load, enable or start it.
        #[arg(long)]
        no_start: bool,
        /// Print the file and the commands; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Stop the service and remove its file; the API key, models and data stay.
    Uninstall {
        /// Print what would be done; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Whether the service is installed and running, and whether it answers HTTP on its address (exit 3 if not).
    Status,
    /// Show its log (the user journal on Linux, ~/Library/Logs/revis/serve.log on macOS).
    Logs {
        /// Keep showing new lines.
        #[arg(short, long)]
        follow: bool,
        /// How many of the last lines to show.
        #[arg(short = 'n', long, default_value_t = 100)]
        lines: u32,
    },
}

/// BSD's EX_USAGE, as revisd exits on a bad config: flags that cannot
/// work. The service manager does not start it again for that.
const EX_USAGE: u8 = 64;
/// LSB's "program is not running", as `systemctl status` answers.
const EX_NOT_RUNNING: u8 = 3;

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

/// revis's own flags that the service keeps: where revisd is.
struct Globals {
    /// `--socket` (or REVIS_SOCKET), when given.
    socket: Option<PathBuf>,
    /// `--node` (or REVIS_NODE), when given.
    node: Option<String>,
    /// The data directory (where the HTTPS certificate made here is).
    data: PathBuf,
}

fn service(globals: &Globals, action: Action) -> anyhow::Result<ExitCode> {
    let out = &mut std::io::stdout();
    Ok(match action {
        Action::Install { flags, no_start, dry_run } => {
            // A service that would only exit 64 again and again is not installed.
            if let Err(e) = flags.check_installable() {
                eprintln!("revis: {e:#}");
                return Ok(ExitCode::from(EX_USAGE));
            }
            revis_service::install(&layout(globals, &flags)?, InstallOptions { no_start, dry_run }, out)?;
            if let Some(trust) = flags.tls_trust(&globals.data) {
                let _ =
                    writeln!(out, "HTTPS clients trust {} (made at the service's first start when it is not there yet)", trust.display());
            }
            ExitCode::SUCCESS
        }
        // What uninstall and logs touch (the unit, the agent, the journal) does not depend on the flags.
        Action::Uninstall { dry_run } => {
            revis_service::uninstall(&layout(globals, &Flags::default())?, dry_run, out)?;
            ExitCode::SUCCESS
        }
        Action::Status => {
            let layout = installed(globals, out)?;
            let answers = revis_service::status(&layout, out)?;
            if answers { ExitCode::SUCCESS } else { ExitCode::from(EX_NOT_RUNNING) }
        }
        Action::Logs { follow, lines } => {
            let code = revis_service::logs(&layout(globals, &Flags::default())?, LogOptions { lines, follow })?;
            ExitCode::from(u8::try_from(code).unwrap_or(1))
        }
    })
}

/// The service that runs `revis [--socket S] [--node N] serve FLAGS`.
fn layout(globals: &Globals, flags: &Flags) -> anyhow::Result<Layout> {
    let mut args: Vec<OsString> = Vec::new();
    if let Some(s) = &globals.socket {
        args.extend(["--socket".into(), std::path::absolute(s).with_context(|| format!("{}", s.display()))?.into_os_string()]);
    }
    if let Some(n) = &globals.node {
        args.extend(["--node".into(), n.into()]);
    }
    args.push("serve".into());
    args.extend(flags.words()?);
    Ok(Layout::serve(args, flags.addr, flags.tls_trust(&globals.data))?)
}

/// The service as installed: its flags read back from its file, so that
/// `status` asks the address it listens on and compares its file with the
/// one an install with the same flags would write. The defaults when
/// nothing is installed.
fn installed(globals: &Globals, out: &mut dyn Write) -> anyhow::Result<Layout> {
    let default = layout(globals, &Flags::default())?;
    let Some(words) = default.installed_arguments()? else { return Ok(default) };
    match parse_service_words(&words, &globals.data) {
        Ok((globals, flags)) => layout(&globals, &flags),
        Err(why) => {
            let _ =
                writeln!(out, "the installed service runs `{}`, which is not what `revis serve install` writes ({why})", words.join(" "));
            Ok(default)
        }
    }
}

/// The global flags and serve's flags in the words after the program of
/// an installed service.
fn parse_service_words(words: &[String], data: &std::path::Path) -> Result<(Globals, Flags), String> {
    let cli = crate::Cli::try_parse_from(std::iter::once("revis").chain(words.iter().map(String::as_str)))
        .map_err(|e| e.kind().as_str().unwrap_or("it does not parse").to_owned())?;
    match cli.command {
        crate::Cmd::Serve(a) if matches!(*a, ServeArgs { show_key: false, action: None, .. }) => {
            Ok((Globals { socket: cli.socket, node: cli.node, data: data.to_owned() }, a.flags))
        }
        _ => Err("not `revis serve` with flags".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `install` writes after `serve` is read back as the same
    /// flags, the global ones too: `status` finds the address the service listens on.
    #[test]
    fn the_flags_written_into_the_service_read_back_the_same() {
        let flags = Flags {
            addr: "[::1]:8080".parse().unwrap(),
            tls: false,
            tls_cert: Some("/etc/my certs/revis.pem".into()),
            tls_key: Some("/etc/my certs/revis.key".into()),
            no_key: true,
            max_generations: 3,
            max_body_bytes: 1000,
            max_connections: 7,
            header_timeout_ms: 2500,
            write_timeout_ms: 7000,
            allow_origins: vec!["http://localhost:3000".into(), "https://my app.example".into()],
            allow_pull: true,
            max_pull_bytes: Some(5 << 30),
        };
        let data = std::path::Path::new("/home/ada/.local/share/revis");
        let globals =
            Globals { socket: Some("/run/user/1000/my revis/revisd.sock".into()), node: Some("desk".into()), data: data.to_owned() };
        let mut words: Vec<String> = vec!["--socket".into(), "/run/user/1000/my revis/revisd.sock".into(), "--node".into(), "desk".into()];
        words.push("serve".into());
        words.extend(flags.words().unwrap().into_iter().map(|w| w.into_string().unwrap()));
        let (g, f) = parse_service_words(&words, data).unwrap();
        assert_eq!(f, flags);
        assert_eq!((g.socket, g.node), (globals.socket, globals.node));
        let (_, f) = parse_service_words(&["serve".into()], data).unwrap();
        assert_eq!(f, Flags::default(), "clap's defaults and Flags::default agree");
        assert!(parse_service_words(&["serve".into(), "--frobnicate".into()], data).is_err());
        assert!(parse_service_words(&["serve".into(), "status".into()], data).is_err());
        assert!(parse_service_words(&["status".into()], data).is_err());
    }

    /// A bad address or limit is refused before it reaches a service.
    #[test]
    fn flags_that_cannot_work_are_refused() {
        let ok = Flags::default();
        ok.check().unwrap();
        for bad in [
            Flags { addr: "0.0.0.0:11435".parse().unwrap(), ..Flags::default() },
            Flags { addr: "0.0.0.0:11435".parse().unwrap(), no_key: true, ..Flags::default() },
            Flags { addr: "0.0.0.0:11435".parse().unwrap(), no_key: true, tls: true, ..Flags::default() },
            Flags { max_generations: 0, ..Flags::default() },
            Flags { max_connections: 0, ..Flags::default() },
            Flags { header_timeout_ms: 0, ..Flags::default() },
            Flags { write_timeout_ms: 0, ..Flags::default() },
            Flags { max_pull_bytes: Some(0), allow_pull: true, ..Flags::default() },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
        Flags { addr: "0.0.0.0:11435".parse().unwrap(), tls: true, ..Flags::default() }.check().unwrap();
        // Port 0 (any free port) serves in the foreground, but a service must be found again.
        let any = Flags { addr: "127.0.0.1:0".parse().unwrap(), ..Flags::default() };
        any.check().unwrap();
        assert!(any.check_installable().unwrap_err().to_string().contains("a port of its own"));
    }
}
