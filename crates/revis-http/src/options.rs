//! What `revis serve` is told: its default address, the limits it keeps,
//! the options it runs with, how peers are grouped for the connection
//! shares, and which addresses it may listen on at all.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::error::HttpError;

/// Where `revis serve` listens unless told otherwise: loopback, next to
/// Ollama's 11434.
pub const DEFAULT_ADDR: &str = "127.0.0.1:11435";

/// What the server bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// A request body larger than this is refused (413).
    pub max_body_bytes: usize,
    /// Generations running at once; one more is refused with 429.
    pub max_generations: usize,
    /// Connections open at once; more wait to be accepted. One address may
    /// hold [`Limits::per_address`] of them.
    pub max_connections: usize,
    /// How long a client has to send a request's head, and how long a
    /// kept-alive connection may sit idle before its next request.
    pub header_timeout: Duration,
    /// How long a response write may make no progress (a client that does
    /// not read, or pipelines requests and never reads their answers)
    /// before the connection is closed.
    pub write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 4 << 20,
            max_generations: 16,
            max_connections: 64,
            header_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(60),
        }
    }
}

impl Limits {
    /// Connections without a keyed request one peer ([`peer_group`]) may
    /// hold at once: half of `max_connections` (at least one), so clients
    /// of one other address cannot take every place.
    pub fn per_address(&self) -> usize {
        (self.max_connections / 2).max(1)
    }

    /// Connections without a keyed request all peers together may hold: the
    /// rest (a quarter, at least one) is kept for connections that show the
    /// key, as the owner's do.
    pub fn unkeyed(&self) -> usize {
        (self.max_connections - self.max_connections / 4).max(1)
    }
}

/// How long a connection past its peer's share, or past the places kept
/// for keyed connections, has to send a request that passes the key check
/// (any request, under `--no-key`) before it is closed.
pub const PROBATION: Duration = Duration::from_secs(2);

/// The peer a connection is counted under: every loopback address is one
/// (any local process may bind any 127.x), an IPv6 address by its /64 (one
/// host holds a whole /64), an IPv4 address as it is.
pub fn peer_group(ip: IpAddr) -> IpAddr {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    match ip {
        _ if ip.is_loopback() => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        v4 => v4,
    }
}

/// How the server runs.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The API key every request must carry; `None`: none is asked (loopback only, see [`check_bind`]).
    pub key: Option<String>,
    pub limits: Limits,
    /// Requests must name this machine in `Host` (set for loopback addresses).
    pub loopback_host_only: bool,
    /// The web pages (an `Origin`, e.g. `http://localhost:3000`) allowed to
    /// call; a request from any other page is refused, key or not.
    pub allowed_origins: Vec<String>,
    /// Ollama's `/api/pull` and `/api/delete` are served (`--allow-pull`):
    /// off by default, since they write to the owner's disk. A pull never
    /// sends the owner's Hugging Face token.
    pub allow_pull: bool,
    /// The largest file a pull may fetch (`--max-pull-bytes`; 0 = none may).
    pub max_pull_bytes: u64,
}

/// Refuses an address the server may not listen on: `--no-key` anywhere
/// but loopback, and any address but loopback without TLS (the key would
/// cross the network in the clear).
pub fn check_bind(addr: SocketAddr, no_key: bool, tls: bool) -> Result<(), HttpError> {
    if addr.ip().is_loopback() {
        return Ok(());
    }
    if no_key {
        return Err(HttpError::Refused(format!(
            "--no-key is allowed on loopback addresses only (127.0.0.1, ::1), not on {addr}: anyone who can reach it could use your models"
        )));
    }
    if !tls {
        return Err(HttpError::Refused(format!(
            "{addr} is not a loopback address: serving beyond this machine needs TLS (--tls for a certificate made here, or --tls-cert and --tls-key for your own); or listen on 127.0.0.1 or ::1"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_one_peer_and_ipv6_counts_by_its_64() {
        let g = |s: &str| peer_group(s.parse().unwrap()).to_string();
        for local in ["127.0.0.1", "127.0.0.2", "127.255.0.9", "::1", "::ffff:127.0.0.3"] {
            assert_eq!(g(local), "127.0.0.1", "{local}");
        }
        assert_eq!(g("192.168.1.7"), "192.168.1.7");
        assert_eq!(g("::ffff:192.168.1.7"), "192.168.1.7");
        assert_eq!(g("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), "2001:db8:1:2::");
        assert_eq!(g("2001:db8:1:2::9"), g("2001:db8:1:2:ffff::1"), "one /64, one peer");
        assert_ne!(g("2001:db8:1:2::9"), g("2001:db8:1:3::9"));
    }

    #[test]
    fn no_key_and_non_loopback_addresses_are_refused_with_the_reason() {
        let any: SocketAddr = "0.0.0.0:11435".parse().unwrap();
        assert!(check_bind("127.0.0.1:0".parse().unwrap(), true, false).is_ok());
        assert!(check_bind("[::1]:0".parse().unwrap(), false, false).is_ok());
        assert!(check_bind(any, true, true).unwrap_err().to_string().contains("--no-key is allowed on loopback addresses only"));
        assert!(check_bind(any, false, false).unwrap_err().to_string().contains("needs TLS"));
        assert!(check_bind(any, false, true).is_ok(), "beyond loopback: the key and TLS");
    }
}
