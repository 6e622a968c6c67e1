//! `revis serve`'s command line: how it serves (the flags, checked before
//! anything binds, and written back as words into a service) and what it
//! does to the service (install, uninstall, status, logs).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use revis_client::Paths;
use revis_http::Limits;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ServeArgs {
    #[command(flatten)]
    pub(super) flags: Flags,
    /// Print the API key (made now if there is none yet) and exit.
    #[arg(long, conflicts_with = "no_key")]
    pub(super) show_key: bool,
    #[command(subcommand)]
    pub(super) action: Option<Action>,
}

/// How `revis serve` serves; what `revis serve install` writes into the service.
#[derive(Args, Clone, Debug, PartialEq, Eq)]
pub struct Flags {
    /// Where to listen. Beyond loopback (127.0.0.1, ::1) only with TLS and the API key.
    #[arg(long, default_value = revis_http::DEFAULT_ADDR)]
    pub(super) addr: SocketAddr,
    /// Serve HTTPS with a certificate made here for this machine's names and addresses, on first use:
    /// clients trust the authority file it prints (http-tls-ca.crt in the data dir).
    #[arg(long, conflicts_with = "tls_cert")]
    pub(super) tls: bool,
    /// Serve HTTPS with your own certificate (PEM, the chain after it).
    #[arg(long, requires = "tls_key")]
    pub(super) tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    pub(super) tls_key: Option<PathBuf>,
    /// Ask no API key (loopback addresses only). By default every request must send
    /// `Authorization: Bearer KEY`, OpenAI's and Ollama's alike.
    #[arg(long)]
    pub(super) no_key: bool,
    /// Generations running at once; one more is refused with 429.
    #[arg(long, default_value_t = Limits::default().max_generations)]
    pub(super) max_generations: usize,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = Limits::default().max_body_bytes)]
    pub(super) max_body_bytes: usize,
    /// Connections open at once; more wait to be accepted. One address may hold half of them
    /// (every program on this machine shares the loopback address).
    #[arg(long, default_value_t = Limits::default().max_connections)]
    pub(super) max_connections: usize,
    /// Milliseconds a client has to send a request's head, and a kept-alive connection may
    /// sit idle before its next request; then it is closed.
    #[arg(long, default_value_t = Limits::default().header_timeout.as_millis() as u64)]
    pub(super) header_timeout_ms: u64,
    /// Milliseconds a response may wait on a client that takes none of it (does not read,
    /// or pipelines requests and never reads the answers); then the connection is closed.
    #[arg(long, default_value_t = Limits::default().write_timeout.as_millis() as u64)]
    pub(super) write_timeout_ms: u64,
    /// A web page allowed to call, by its origin (`http://localhost:3000`); repeat for more.
    /// Requests from any other page (a browser names it in `Origin`) are refused, key or not.
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    pub(super) allow_origins: Vec<String>,
    /// Serve Ollama's /api/pull and /api/delete: callers may then download models to this
    /// machine (without your Hugging Face token) and delete them. Off by default.
    #[arg(long)]
    pub(super) allow_pull: bool,
    /// With --allow-pull: the largest file a pull over HTTP may fetch, in bytes.
    /// Default: half this machine's memory (what a model here can use).
    #[arg(long, value_name = "BYTES")]
    pub(super) max_pull_bytes: Option<u64>,
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
    pub(super) fn check(&self) -> anyhow::Result<()> {
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
    pub(super) fn check_installable(&self) -> anyhow::Result<()> {
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
    pub(super) fn https_identity(&self, paths: &Paths) -> anyhow::Result<Option<revis_http::HttpsIdentity>> {
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
    pub(super) fn tls_trust(&self, data: &std::path::Path) -> Option<PathBuf> {
        match &self.tls_cert {
            Some(cert) => std::path::absolute(cert).ok(),
            None => self.tls.then(|| data.join(revis_http::HTTPS_CA_FILE)),
        }
    }

    /// Every flag, as words: the service runs what was asked, whatever the
    /// defaults of a later revis.
    pub(super) fn words(&self) -> anyhow::Result<Vec<OsString>> {
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
pub(super) const EX_USAGE: u8 = 64;

#[cfg(test)]
mod tests {
    use super::*;

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
