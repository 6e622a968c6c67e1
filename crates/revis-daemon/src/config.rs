//! revisd's configuration: a TOML file mapping tiers to models, validated
//! into a [`Config`] before anything binds. Every error names its field.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use revis_proto::Tier;
use serde::Deserialize;

/// The file as written. Unknown keys are errors, so a typo is not ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    daemon: RawDaemon,
    #[serde(default)]
    tiers: BTreeMap<String, RawTier>,
    #[serde(default)]
    server: RawServer,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    enabled: Option<bool>,
    listen: Option<String>,
    name: Option<String>,
    advertise: Option<bool>,
    interfaces: Option<Vec<String>>,
    state_dir: Option<PathBuf>,
    pairing_window_s: Option<u64>,
    max_connections: Option<u32>,
    peer_timeout_ms: Option<u64>,
    lend: Option<bool>,
    lend_memory_mb: Option<u64>,
    rpc_cache_mb: Option<u64>,
    allow_shared_loopback: Option<bool>,
    keyring: Option<PathBuf>,
    /// Only here to refuse `tls = false` with a message of its own.
    tls: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDaemon {
    socket: Option<PathBuf>,
    load_at_start: Option<bool>,
    keep_alive_s: Option<u64>,
    queue_capacity: Option<u32>,
    stall_timeout_s: Option<u64>,
    render_timeout_s: Option<u64>,
    render_memory_mb: Option<u64>,
    max_tokens_limit: Option<u32>,
    default_max_tokens: Option<u32>,
    context: Option<u32>,
    threads: Option<RawThreads>,
    batch: Option<u32>,
    cache_slots: Option<u32>,
    cache_budget_mb: Option<u64>,
    speculate: Option<String>,
    streams: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTier {
    model: Option<String>,
    context: Option<u32>,
    threads: Option<RawThreads>,
    cache_budget_mb: Option<u64>,
    split: Option<Vec<String>>,
    split_local: Option<f64>,
}

/// `threads = "auto"` or `threads = 2`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawThreads {
    Count(i64),
    Word(String),
}

/// The most threads a model's calls may get.
const MAX_THREADS: u32 = 256;

/// `threads` as written: "auto" (chosen by measurement, at most the
/// machine's `cores`) or a fixed count; unset: `default`.
fn threads_setting(raw: Option<&RawThreads>, default: revis_engine::Threads, cores: u32) -> Result<revis_engine::Threads, String> {
    match raw {
        None => Ok(default),
        Some(RawThreads::Word(w)) if w == "auto" => Ok(revis_engine::Threads::Auto { most: cores }),
        Some(RawThreads::Word(w)) if w == "cycle" => Ok(revis_engine::Threads::Cycle { most: cores }),
        Some(RawThreads::Count(n)) if (1..=i64::from(MAX_THREADS)).contains(n) => Ok(revis_engine::Threads::Fixed(*n as u32)),
        Some(RawThreads::Count(n)) => Err(format!("is {n}; it must be \"auto\" or a number of threads between 1 and {MAX_THREADS}")),
        Some(RawThreads::Word(w)) => Err(format!(
            "is \"{}\"; it must be \"auto\" (chosen by measurement while revisd runs) or a number of threads between 1 and {MAX_THREADS}",
            w.chars().take(64).collect::<String>()
        )),
    }
}

/// A validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// None = the default socket path.
    pub socket: Option<PathBuf>,
    pub load_at_start: bool,
    /// None = never unload an idle model.
    pub keep_alive: Option<Duration>,
    pub queue_capacity: usize,
    /// A Generate whose caller takes none of its text for this long is
    /// cancelled, so one caller that stops reading cannot hold up the rest.
    pub stall_timeout: Duration,
    /// The longest one prompt's rendering (the model's chat template) and
    /// tokenizing may take; past it the request fails and the model's
    /// template is not used again until the model is loaded again.
    pub render_timeout: Duration,
    /// The memory (address space) one chat template rendering process may
    /// hold; a rendering that needs more fails its request, and the model's
    /// template is not used again until the model is loaded again.
    pub render_memory_bytes: u64,
    pub max_tokens_limit: u32,
    pub default_max_tokens: u32,
    /// Draft tokens from the context and verify them in one batch (prompt
    /// lookup decoding; revis_engine::lookup). Same greedy text, same
    /// sampled distribution. "auto" (the default) drafts only where it is
    /// expected to pay, "always" wherever a draft is found, "off" never.
    pub speculate: revis_engine::Speculate,
    /// Generations one model decodes together in one batch (`daemon.streams`);
    /// each has a KV cache of the whole context, so a model's cache takes
    /// this many times the memory of one. 1: one at a time.
    pub streams: u32,
    /// tier name → the model it uses.
    pub tiers: BTreeMap<Tier, TierModel>,
    pub server: ServerConfig,
}

/// Server mode: mutual TLS on the LAN, mDNS, pairing (`[server]`).
#[derive(Clone, Debug, PartialEq)]
pub struct ServerConfig {
    /// The switch's position at start when the file sets it; None = the
    /// position it was left in (saved in `state_dir`), else off.
    pub enabled: Option<bool>,
    pub listen: SocketAddr,
    /// How paired clients and mDNS name this machine.
    pub name: String,
    /// Advertise over mDNS while server mode is on.
    pub advertise: bool,
    /// Interfaces mDNS uses; empty = every non-loopback interface.
    pub interfaces: Vec<String>,
    /// Identity (key, certificate), paired devices, the saved switch.
    pub state_dir: PathBuf,
    pub pairing_window: Duration,
    pub max_connections: usize,
    /// A paired connection whose peer answers nothing (no HTTP/2 ping
    /// acknowledged) for this long is closed: a laptop that went to sleep
    /// gives its slot back. See `remote::http2_keepalive`.
    pub peer_timeout: Duration,
    /// `server.lend`: lending on or off at start; None: as it was last left (off at first).
    pub lend: Option<bool>,
    /// `server.lend_memory_mb`: the most memory (address space) the RPC
    /// worker may take, lent layers and buffers together; a paired device
    /// asking for more gets its session ended, and the worker goes on.
    pub lend_memory: u64,
    /// `server.rpc_cache_mb`: the most the lent layers' weight cache
    /// (`state_dir/rpc-cache`) may hold; the least recently used go first.
    pub rpc_cache: u64,
    /// `server.allow_shared_loopback`: where no network namespace can be
    /// made (macOS; a Linux that refuses this user namespaces), the RPC
    /// worker and split engines run on the machine's shared loopback only
    /// when this says so; otherwise lending and split tiers refuse to
    /// start, naming the cause. Off by default.
    pub allow_shared_loopback: bool,
    /// The user's client keyring (`$REVIS_DATA_DIR/client`, as `revis pair`
    /// writes it): the identity and the nodes a split tier borrows from.
    pub keyring: PathBuf,
}

/// `daemon.streams` unless told otherwise: four generations of a model
/// decode together (a reply and the facts, audit and summary after it).
pub const DEFAULT_STREAMS: u32 = 4;

/// `server.rpc_cache_mb` unless told otherwise.
pub const DEFAULT_RPC_CACHE_MB: u64 = 8192;

/// This machine's memory, in bytes (0 when the system will not say).
pub fn physical_memory() -> u64 {
    // SAFETY: sysconf reads system constants only.
    let (pages, size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    if pages <= 0 || size <= 0 { 0 } else { pages as u64 * size as u64 }
}

/// The TCP port server mode listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 47470;
/// `server.peer_timeout_ms` unless told otherwise: a paired device that
/// went silent (asleep, off the network) is dropped within 20 s.
pub const DEFAULT_PEER_TIMEOUT_MS: u64 = 20_000;

/// One tier's model and how to load it.
#[derive(Clone, Debug, PartialEq)]
pub struct TierModel {
    /// Catalog name, or the path as written.
    pub name: String,
    pub path: PathBuf,
    pub context: u32,
    /// `threads`: "auto" (the default) or a fixed count.
    pub threads: revis_engine::Threads,
    /// Prompt tokens per batch (`daemon.batch`): where a prompt's batches
    /// end, and so the most prompt tokens a step evaluates while other
    /// answers wait for their next token.
    pub batch: u32,
    pub cache_slots: usize,
    pub cache_budget_bytes: usize,
    /// `daemon.speculate` (the same for every tier): whether the model is
    /// probed at load for drafting.
    pub speculate: revis_engine::Speculate,
    /// `daemon.streams` (the same for every tier).
    pub streams: u32,
    /// What a request that leaves a sampling setting unset gets: the model
    /// file's own (GGUF metadata), else the catalog's (`revis_models::sampling_defaults`).
    pub sampling: revis_models::SamplingDefaults,
    /// `tiers.X.split`: the paired nodes (names in this user's client
    /// keyring) that run the model's later layers; empty: all of it here.
    pub split: Vec<String>,
    /// `tiers.X.split_local`: the share of layers kept here (0 < s < 1);
    /// None: in proportion to free memory here and on the nodes.
    pub split_local: Option<f64>,
    /// Set only inside a split engine (`revisd split-engine`): the devices
    /// the layers go to. Never read from a file.
    pub engine_split: Option<EngineSplit>,
}

/// A split engine's placement of its model's layers.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineSplit {
    pub split: revis_engine::Split,
    /// As a person reads it: "layers 1-15 here, 16-30 on desktop".
    pub note: String,
}

/// The most nodes one tier may be split across (llama.cpp's limit on RPC servers is 16).
pub const MAX_SPLIT_NODES: usize = 8;

/// Gives each tier whose context nobody set (0 here) its model's own: as
/// long as the model was trained for, within its share of the memory the
/// catalog allows models ([`revis_models::kv_budget`], the distinct models
/// of every tier counted as loaded together) for `streams` caches
/// ([`revis_models::auto_context`]). A model file that is not there yet,
/// or whose header cannot be read, gets [`revis_models::choose::CONTEXT_TOKENS`].
fn auto_contexts(tiers: &mut BTreeMap<Tier, TierModel>, memory_bytes: u64) {
    let mut files: Vec<&Path> = tiers.values().map(|m| m.path.as_path()).collect();
    files.sort();
    files.dedup();
    let sizes: Vec<u64> = files
        .iter()
        .map(|p| match std::fs::metadata(p) {
            Ok(m) => m.len(),
            Err(_) => p.file_name().and_then(|n| revis_models::find_file(&n.to_string_lossy())).map_or(0, |e| e.size),
        })
        .collect();
    let budget = revis_models::kv_budget(memory_bytes, &sizes);
    for m in tiers.values_mut().filter(|m| m.context == 0) {
        m.context = match revis_models::shape(&m.path) {
            Ok(shape) => revis_models::auto_context(shape, m.streams, budget),
            Err(_) => revis_models::choose::CONTEXT_TOKENS as u32,
        };
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    // Not a `source`: the message says it, and `{:#}` would say it twice.
    #[error("cannot read config {path}: {error}")]
    Read { path: PathBuf, error: std::io::Error },
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config {path}: `{field}` {message}")]
    Field { path: PathBuf, field: String, message: String },
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path, models_dir: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read { path: path.into(), error })?;
        Self::parse(&text, path, models_dir)
    }

    /// The configuration used when there is no file: every tier uses the default catalog model.
    pub fn default_for(models_dir: &Path) -> Result<Config, ConfigError> {
        Self::parse("", Path::new("(defaults)"), models_dir)
    }

    pub fn parse(text: &str, path: &Path, models_dir: &Path) -> Result<Config, ConfigError> {
        let raw: RawConfig =
            toml::from_str(text).map_err(|e| ConfigError::Parse { path: path.into(), message: e.to_string().trim().to_owned() })?;
        let field = |field: &str, message: String| ConfigError::Field { path: path.into(), field: field.into(), message };
        let d = raw.daemon;
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get() as u32);

        let range = |name: &str, v: Option<u64>, default: u64, lo: u64, hi: u64| -> Result<u64, ConfigError> {
            let v = v.unwrap_or(default);
            if v < lo || v > hi {
                return Err(field(name, format!("is {v}; it must be between {lo} and {hi}")));
            }
            Ok(v)
        };
        // Unset: each model's own (see `auto_contexts` below).
        let context = d.context.map(|c| range("daemon.context", Some(c.into()), 0, 256, 131_072).map(|c| c as u32)).transpose()?;
        let threads = threads_setting(d.threads.as_ref(), revis_engine::Threads::Auto { most: cores }, cores)
            .map_err(|m| field("daemon.threads", m))?;
        let batch = range("daemon.batch", d.batch.map(u64::from), 512, 32, 8192)? as u32;
        let cache_slots = range("daemon.cache_slots", d.cache_slots.map(u64::from), 4, 0, 64)? as usize;
        let cache_mb = range("daemon.cache_budget_mb", d.cache_budget_mb, 256, 0, 1 << 20)?;
        let queue_capacity = range("daemon.queue_capacity", d.queue_capacity.map(u64::from), 16, 1, 1024)? as usize;
        let stall_timeout = Duration::from_secs(range("daemon.stall_timeout_s", d.stall_timeout_s, 10, 1, 3600)?);
        let render_timeout = Duration::from_secs(range("daemon.render_timeout_s", d.render_timeout_s, 30, 1, 600)?);
        let render_memory_bytes = range("daemon.render_memory_mb", d.render_memory_mb, 1024, 256, 65_536)? << 20;
        let max_tokens_limit = range("daemon.max_tokens_limit", d.max_tokens_limit.map(u64::from), 4096, 1, 131_072)? as u32;
        let default_max_tokens = range(
            "daemon.default_max_tokens",
            d.default_max_tokens.map(u64::from),
            512.min(max_tokens_limit.into()),
            1,
            max_tokens_limit.into(),
        )? as u32;
        let keep_alive_s = range("daemon.keep_alive_s", d.keep_alive_s, 300, 0, 30 * 86_400)?;
        let streams =
            range("daemon.streams", d.streams.map(u64::from), DEFAULT_STREAMS.into(), 1, revis_engine::MAX_STREAMS.into())? as u32;
        let speculate = match d.speculate.as_deref() {
            None => revis_engine::Speculate::Auto,
            Some(v) => v.parse().map_err(|m| field("daemon.speculate", m))?,
        };

        for name in raw.tiers.keys() {
            if name.parse::<Tier>().is_err() {
                return Err(field(&format!("tiers.{name}"), "is not a tier; the tiers are tier1, tier2 and tier3".into()));
            }
        }
        let mut tiers = BTreeMap::new();
        for tier in Tier::ALL {
            let t = raw.tiers.get(tier.as_str());
            let f = |k: &str| format!("tiers.{tier}.{k}");
            let name = t.and_then(|t| t.model.clone()).unwrap_or_else(|| revis_models::default_model(models_dir));
            let path = resolve_model(&name, models_dir).map_err(|m| field(&f("model"), m))?;
            let sampling = revis_models::sampling_defaults(&name, &path);
            let split = t.and_then(|t| t.split.clone()).unwrap_or_default();
            if split.len() > MAX_SPLIT_NODES {
                return Err(field(
                    &f("split"),
                    format!("names {} nodes; a tier may be split across at most {MAX_SPLIT_NODES}", split.len()),
                ));
            }
            for (i, n) in split.iter().enumerate() {
                if n.trim().is_empty() || n.chars().count() > 64 || n.chars().any(char::is_control) {
                    return Err(field(&f("split"), format!("names {n:?}; a node name is 1 to 64 printable characters")));
                }
                if split[..i].contains(n) {
                    return Err(field(&f("split"), format!("names {n:?} twice")));
                }
            }
            let split_local = t.and_then(|t| t.split_local);
            if let Some(s) = split_local {
                if split.is_empty() {
                    return Err(field(&f("split_local"), "is set, but the tier has no `split` nodes to share the layers with".into()));
                }
                if !(s > 0.0 && s < 1.0) {
                    return Err(field(
                        &f("split_local"),
                        format!("is {s}; it is the share of layers kept on this machine, between 0 and 1 (exclusive)"),
                    ));
                }
            }
            let model = TierModel {
                split,
                split_local,
                engine_split: None,
                sampling,
                name,
                path,
                context: match t.and_then(|t| t.context).or(context) {
                    Some(c) => range(&f("context"), Some(c.into()), 0, 256, 131_072)? as u32,
                    None => 0,
                },
                threads: threads_setting(t.and_then(|t| t.threads.as_ref()), threads, cores).map_err(|m| field(&f("threads"), m))?,
                batch,
                cache_slots,
                cache_budget_bytes: (range(&f("cache_budget_mb"), t.and_then(|t| t.cache_budget_mb), cache_mb, 0, 1 << 20)? << 20) as usize,
                speculate,
                streams,
            };
            tiers.insert(tier, model);
        }
        auto_contexts(&mut tiers, revis_models::machine::memory_bytes());
        // Tiers that share a model load it once, so they must agree on how.
        for (a, ma) in &tiers {
            for (b, mb) in tiers.range((std::ops::Bound::Excluded(*a), std::ops::Bound::Unbounded)) {
                // Named two ways (a path, a catalog name) it is still one model.
                let same_name = TierModel { name: ma.name.clone(), sampling: ma.sampling, ..mb.clone() };
                if ma.path == mb.path && *ma != same_name {
                    return Err(field(
                        &format!("tiers.{b}"),
                        format!(
                            "uses the same model as {a} with different context, threads, cache or split settings; a shared model is loaded once, so give both the same settings"
                        ),
                    ));
                }
            }
        }
        let server = server_config(raw.server, &field, models_dir, &range)?;
        Ok(Config {
            server,
            socket: d.socket,
            load_at_start: d.load_at_start.unwrap_or(false),
            keep_alive: (keep_alive_s > 0).then(|| Duration::from_secs(keep_alive_s)),
            queue_capacity,
            stall_timeout,
            render_timeout,
            render_memory_bytes,
            max_tokens_limit,
            default_max_tokens,
            speculate,
            streams,
            tiers,
        })
    }
}

/// Checks a number field: (name, value, default, low, high) → the value.
type Range<'a> = &'a dyn Fn(&str, Option<u64>, u64, u64, u64) -> Result<u64, ConfigError>;

fn server_config(
    s: RawServer,
    field: &dyn Fn(&str, String) -> ConfigError,
    models_dir: &Path,
    range: Range<'_>,
) -> Result<ServerConfig, ConfigError> {
    if s.tls == Some(false) {
        return Err(field(
            "server.tls",
            "is false, but revisd never serves plain TCP: on the network every connection is mutual TLS between paired devices. Remove the line".into(),
        ));
    }
    let listen = match s.listen {
        None => SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT)),
        Some(text) => {
            if text.contains("://") {
                return Err(field(
                    "server.listen",
                    format!(
                        "is {text:?}; write an address and port such as \"0.0.0.0:{DEFAULT_PORT}\", without a scheme (it is always mutual TLS)"
                    ),
                ));
            }
            text.parse().map_err(|_| {
                field("server.listen", format!("is {text:?}, which is not an address and port such as \"0.0.0.0:{DEFAULT_PORT}\""))
            })?
        }
    };
    let name = match s.name {
        Some(n) => n,
        None => revis_trust::host_name("revis"),
    };
    if name.trim().is_empty() || name.chars().count() > 64 || name.chars().any(char::is_control) {
        return Err(field("server.name", format!("is {name:?}; a name is 1 to 64 printable characters")));
    }
    let interfaces = s.interfaces.unwrap_or_default();
    for i in &interfaces {
        if i.is_empty() || i.len() > 15 || i.contains(['/', ' ']) {
            return Err(field("server.interfaces", format!("names {i:?}, which is not a network interface name")));
        }
    }
    // The default sits beside the models: `$REVIS_DATA_DIR/daemon`.
    let state_dir = s.state_dir.unwrap_or_else(|| models_dir.parent().unwrap_or(models_dir).join("daemon"));
    let mb = 1u64 << 20;
    let physical_mb = physical_memory() / mb;
    let lend_memory = mb * range("server.lend_memory_mb", s.lend_memory_mb, (physical_mb * 3 / 4).max(256), 256, 1 << 24)?;
    let rpc_cache = mb * range("server.rpc_cache_mb", s.rpc_cache_mb, DEFAULT_RPC_CACHE_MB, 64, 1 << 24)?;
    Ok(ServerConfig {
        lend: s.lend,
        lend_memory,
        rpc_cache,
        allow_shared_loopback: s.allow_shared_loopback.unwrap_or(false),
        keyring: s.keyring.unwrap_or_else(|| models_dir.parent().unwrap_or(models_dir).join("client")),
        enabled: s.enabled,
        listen,
        name,
        advertise: s.advertise.unwrap_or(true),
        interfaces,
        state_dir,
        pairing_window: Duration::from_secs(range("server.pairing_window_s", s.pairing_window_s, 120, 10, 600)?),
        max_connections: range("server.max_connections", s.max_connections.map(u64::from), 64, 1, 4096)? as usize,
        peer_timeout: Duration::from_millis(range("server.peer_timeout_ms", s.peer_timeout_ms, DEFAULT_PEER_TIMEOUT_MS, 200, 600_000)?),
    })
}

/// A catalog name or a Hugging Face reference → its file in `models_dir`; anything else is a path.
fn resolve_model(name: &str, models_dir: &Path) -> Result<PathBuf, String> {
    match revis_models::HfRef::parse(name) {
        Ok(Some(r)) => {
            return r
                .local_file(models_dir)
                .ok_or_else(|| format!("names Hugging Face model {name:?}, which is not downloaded yet: run `revis pull {name}`"));
        }
        Ok(None) => {}
        Err(e) => return Err(e.to_string()),
    }
    if let Some(entry) = revis_models::find(name) {
        let path = entry.path_in(models_dir);
        if !path.is_file() {
            return Err(format!("names catalog model {name:?}, which is not downloaded yet: run `revis pull {name}`"));
        }
        return Ok(path);
    }
    let path = PathBuf::from(name);
    if path.extension().is_none_or(|e| e != "gguf") && path.components().count() == 1 {
        let known: Vec<&str> = revis_models::catalog().iter().map(|e| e.name).collect();
        return Err(format!(
            "{name:?} is neither a catalog model ({}), a Hugging Face reference (hf:OWNER/REPO:QUANT) nor a path to a .gguf file",
            known.join(", ")
        ));
    }
    if !path.is_file() {
        return Err(format!("model file {} does not exist", path.display()));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{Expect, expect};

    fn check(toml: &str, want: Expect) {
        let dir = tempfile::tempdir().unwrap();
        let model = revis_models::find(revis_models::DEFAULT_MODEL).unwrap();
        std::fs::write(model.path_in(dir.path()), b"gguf").unwrap();
        std::fs::write(dir.path().join("other.gguf"), b"gguf").unwrap();
        let text = toml.replace("$DIR", &dir.path().display().to_string());
        let got = match Config::parse(&text, Path::new("revisd.toml"), dir.path()) {
            Ok(c) => {
                format!("ok: {}", c.tiers.iter().map(|(t, m)| format!("{t}={} ctx{}", m.name, m.context)).collect::<Vec<_>>().join(", "))
            }
            Err(e) => e.to_string(),
        };
        let got = got.replace(&dir.path().display().to_string(), "$DIR");
        want.assert_eq(&got);
    }

    #[test]
    fn empty_config_uses_the_default_model_everywhere() {
        check(
            "",
            expect!["ok: tier1=smollm2-135m-instruct ctx4096, tier2=smollm2-135m-instruct ctx4096, tier3=smollm2-135m-instruct ctx4096"],
        );
    }

    #[test]
    fn paths_and_overrides() {
        check(
            "[daemon]\ncontext = 2048\n[tiers.tier3]\nmodel = \"$DIR/other.gguf\"\ncontext = 8192\n",
            expect!["ok: tier1=smollm2-135m-instruct ctx2048, tier2=smollm2-135m-instruct ctx2048, tier3=$DIR/other.gguf ctx8192"],
        );
        // The default model named by its path on one tier is still the one model.
        let file = revis_models::find(revis_models::DEFAULT_MODEL).unwrap().file_name;
        check(
            &format!("[daemon]\ncontext = 2048\n[tiers.tier1]\nmodel = \"$DIR/{file}\"\n"),
            expect![
                "ok: tier1=$DIR/SmolLM2-135M-Instruct.Q4_1.gguf ctx2048, tier2=smollm2-135m-instruct ctx2048, tier3=smollm2-135m-instruct ctx2048"
            ],
        );
        // A file whose header cannot be read (these are not GGUF) and no
        // context set: the default-model choice's 4096.
        check(
            "",
            expect!["ok: tier1=smollm2-135m-instruct ctx4096, tier2=smollm2-135m-instruct ctx4096, tier3=smollm2-135m-instruct ctx4096"],
        );
    }

    #[test]
    fn threads_are_auto_unless_a_count_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let model = revis_models::find(revis_models::DEFAULT_MODEL).unwrap();
        std::fs::write(model.path_in(dir.path()), b"gguf").unwrap();
        let threads = |toml: &str| {
            let c = Config::parse(toml, Path::new("revisd.toml"), dir.path()).unwrap();
            c.tiers.values().map(|m| m.threads).collect::<Vec<_>>()
        };
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get() as u32);
        assert!(threads("").iter().all(|&t| t == revis_engine::Threads::Auto { most: cores }));
        assert!(threads("[daemon]\nthreads = \"auto\"\n").iter().all(|&t| t == revis_engine::Threads::Auto { most: cores }));
        assert!(threads("[daemon]\nthreads = 3\n").iter().all(|&t| t == revis_engine::Threads::Fixed(3)));
        check(
            "[daemon]\nthreads = \"many\"\n",
            expect![[
                r#"config revisd.toml: `daemon.threads` is "many"; it must be "auto" (chosen by measurement while revisd runs) or a number of threads between 1 and 256"#
            ]],
        );
        check(
            "[daemon]\nthreads = 0\n",
            expect![[r#"config revisd.toml: `daemon.threads` is 0; it must be "auto" or a number of threads between 1 and 256"#]],
        );
    }

    #[test]
    fn errors_name_the_field() {
        check("[daemon]\ncontext = 10\n", expect!["config revisd.toml: `daemon.context` is 10; it must be between 256 and 131072"]);
        assert_eq!(u64::from(DEFAULT_STREAMS), revis_models::choose::STREAMS, "the default-model choice counts this many caches");
        check("[daemon]\nstreams = 0\n", expect!["config revisd.toml: `daemon.streams` is 0; it must be between 1 and 16"]);
        check(
            "[daemon]\nspeculate = \"yes\"\n",
            expect![[r#"config revisd.toml: `daemon.speculate` is "yes"; it must be "auto", "always" or "off""#]],
        );
        check(
            "[tiers.tier4]\nmodel = \"x\"\n",
            expect!["config revisd.toml: `tiers.tier4` is not a tier; the tiers are tier1, tier2 and tier3"],
        );
        check(
            "[tiers.tier1]\nmodel = \"llama9\"\n",
            expect![[
                r#"config revisd.toml: `tiers.tier1.model` "llama9" is neither a catalog model (smollm2-135m-instruct, gemma3-270m, qwen2.5-0.5b-instruct, llama3.2-1b-instruct, qwen2.5-1.5b-instruct, qwen2.5-3b-instruct, llama3.2-3b-instruct, phi3.5-mini-instruct, qwen2.5-7b-instruct, llama3.1-8b-instruct, gemma3-12b-it, qwen2.5-14b-instruct), a Hugging Face reference (hf:OWNER/REPO:QUANT) nor a path to a .gguf file"#
            ]],
        );
        check(
            "[tiers.tier1]\nmodel = \"gemma3-270m\"\n",
            expect![[
                r#"config revisd.toml: `tiers.tier1.model` names catalog model "gemma3-270m", which is not downloaded yet: run `revis pull gemma3-270m`"#
            ]],
        );
        check(
            "[tiers.tier1]\nmodel = \"hf:owner/repo:Q4_K_M\"\n",
            expect![[
                r#"config revisd.toml: `tiers.tier1.model` names Hugging Face model "hf:owner/repo:Q4_K_M", which is not downloaded yet: run `revis pull hf:owner/repo:Q4_K_M`"#
            ]],
        );
        check(
            "[tiers.tier2]\ncontext = 1024\n",
            expect![
                "config revisd.toml: `tiers.tier2` uses the same model as tier1 with different context, threads, cache or split settings; a shared model is loaded once, so give both the same settings"
            ],
        );
        check(
            "[daemon]\nthreds = 2\n",
            expect![[r#"
            config revisd.toml: TOML parse error at line 2, column 1
              |
            2 | threds = 2
              | ^^^^^^
            unknown field `threds`, expected one of `socket`, `load_at_start`, `keep_alive_s`, `queue_capacity`, `stall_timeout_s`, `render_timeout_s`, `render_memory_mb`, `max_tokens_limit`, `default_max_tokens`, `context`, `threads`, `batch`, `cache_slots`, `cache_budget_mb`, `speculate`, `streams`"#]],
        );
    }

    #[test]
    fn a_hugging_face_reference_names_its_downloaded_file_and_the_recorded_default_applies() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(revis_models::find(revis_models::DEFAULT_MODEL).unwrap().path_in(dir.path()), b"gguf").unwrap();
        let file = dir.path().join("hf/owner/repo/Repo-Q8_0.gguf");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, b"gguf").unwrap();
        let c = Config::parse("[tiers.tier3]\nmodel = \"hf.co/owner/repo:q8_0\"\n", Path::new("x"), dir.path()).unwrap();
        assert_eq!(c.tiers[&Tier::Tier3].path, file);
        // No model named anywhere: the default model recorded in the models directory.
        revis_models::set_default_model(dir.path(), &revis_models::ModelRef::parse("hf:owner/repo:Q8_0").unwrap().unwrap()).unwrap();
        let c = Config::parse("", Path::new("x"), dir.path()).unwrap();
        assert!(c.tiers.values().all(|t| t.path == file && t.name == "hf:owner/repo:Q8_0"), "{:?}", c.tiers);
    }

    #[test]
    fn a_split_names_nodes_and_a_share_between_0_and_1() {
        let t3 = |rest: &str| format!("[tiers.tier3]\nmodel = \"$DIR/other.gguf\"\n{rest}");
        check(
            &t3("split = [\"desk\"]\nsplit_local = 0.25\n"),
            expect!["ok: tier1=smollm2-135m-instruct ctx4096, tier2=smollm2-135m-instruct ctx4096, tier3=$DIR/other.gguf ctx4096"],
        );
        check(
            &t3("split_local = 0.5\n"),
            expect!["config revisd.toml: `tiers.tier3.split_local` is set, but the tier has no `split` nodes to share the layers with"],
        );
        check(
            &t3("split = [\"desk\"]\nsplit_local = 1.0\n"),
            expect![
                "config revisd.toml: `tiers.tier3.split_local` is 1; it is the share of layers kept on this machine, between 0 and 1 (exclusive)"
            ],
        );
        check(&t3("split = [\"desk\", \"desk\"]\n"), expect![[r#"config revisd.toml: `tiers.tier3.split` names "desk" twice"#]]);
        check(
            &t3("split = [\"\"]\n"),
            expect![[r#"config revisd.toml: `tiers.tier3.split` names ""; a node name is 1 to 64 printable characters"#]],
        );
        let nine: Vec<String> = (0..9).map(|i| format!("\"n{i}\"")).collect();
        check(
            &t3(&format!("split = [{}]\n", nine.join(", "))),
            expect!["config revisd.toml: `tiers.tier3.split` names 9 nodes; a tier may be split across at most 8"],
        );
        // Tiers sharing a model load it once: split alike or not at all.
        check(
            "[tiers.tier1]\nsplit = [\"desk\"]\n",
            expect![
                "config revisd.toml: `tiers.tier2` uses the same model as tier1 with different context, threads, cache or split settings; a shared model is loaded once, so give both the same settings"
            ],
        );
    }

    #[test]
    fn server_mode_is_mutual_tls_only() {
        check(
            "[server]\ntls = false\n",
            expect![
                "config revisd.toml: `server.tls` is false, but revisd never serves plain TCP: on the network every connection is mutual TLS between paired devices. Remove the line"
            ],
        );
        check(
            "[server]\nlisten = \"http://0.0.0.0:80\"\n",
            expect![[
                r#"config revisd.toml: `server.listen` is "http://0.0.0.0:80"; write an address and port such as "0.0.0.0:47470", without a scheme (it is always mutual TLS)"#
            ]],
        );
        check(
            "[server]\nlisten = \"lan\"\n",
            expect![[r#"config revisd.toml: `server.listen` is "lan", which is not an address and port such as "0.0.0.0:47470""#]],
        );
        check(
            "[server]\npairing_window_s = 5\n",
            expect!["config revisd.toml: `server.pairing_window_s` is 5; it must be between 10 and 600"],
        );
        check(
            "[server]\npeer_timeout_ms = 50\n",
            expect!["config revisd.toml: `server.peer_timeout_ms` is 50; it must be between 200 and 600000"],
        );
        check(
            "[server]\ninterfaces = [\"eth0/1\"]\n",
            expect![[r#"config revisd.toml: `server.interfaces` names "eth0/1", which is not a network interface name"#]],
        );
        let dir = tempfile::tempdir().unwrap();
        let models = dir.path().join("models");
        std::fs::create_dir(&models).unwrap();
        std::fs::write(revis_models::find(revis_models::DEFAULT_MODEL).unwrap().path_in(&models), b"gguf").unwrap();
        let c = Config::parse("[server]\nenabled = true\nlisten = \"127.0.0.1:0\"\nname = \"desk\"\n", Path::new("x"), &models);
        let s = c.unwrap().server;
        assert_eq!(
            (s.enabled, s.listen.to_string(), s.name.as_str(), s.state_dir),
            (Some(true), "127.0.0.1:0".into(), "desk", dir.path().join("daemon"))
        );
    }
}
