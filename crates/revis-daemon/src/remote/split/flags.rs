//! The split engine's command line, written once: the flags revisd starts
//! `revisd split-engine` with ([`EngineFlags::to_args`]) are the flags that
//! subcommand parses (revisd flattens [`EngineFlags`] into it).

use std::ffi::OsString;
use std::path::PathBuf;

/// What a split engine (`revisd split-engine`) is started with.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct EngineFlags {
    /// The private socket it serves its tier on.
    #[arg(long)]
    pub socket: PathBuf,
    /// The tier it serves (parsed by `revisd split-engine`, which names a
    /// tier it does not know).
    #[arg(long)]
    pub tier: String,
    #[arg(long)]
    pub model: PathBuf,
    #[arg(long)]
    pub context: u32,
    /// "auto" or a count.
    #[arg(long)]
    pub threads: revis_engine::Threads,
    #[arg(long)]
    pub batch: u32,
    #[arg(long)]
    pub max_tokens_limit: u32,
    /// The nodes lending layers, in the tier's order.
    #[arg(long = "node")]
    pub nodes: Vec<String>,
    #[arg(long)]
    pub split_local: Option<f64>,
    #[arg(long)]
    pub state_dir: PathBuf,
    /// As rpc-worker's.
    #[arg(long)]
    pub allow_shared_loopback: bool,
}

impl EngineFlags {
    /// The flags as the arguments after `split-engine` on the engine's
    /// command line.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut out: Vec<OsString> = Vec::new();
        let mut flag = |name: &str, value: OsString| {
            out.push(name.into());
            out.push(value);
        };
        flag("--socket", self.socket.clone().into());
        flag("--tier", self.tier.clone().into());
        flag("--model", self.model.clone().into());
        flag("--context", self.context.to_string().into());
        flag("--threads", self.threads.to_string().into());
        flag("--batch", self.batch.to_string().into());
        flag("--max-tokens-limit", self.max_tokens_limit.to_string().into());
        flag("--state-dir", self.state_dir.clone().into());
        for name in &self.nodes {
            flag("--node", name.into());
        }
        if let Some(s) = self.split_local {
            flag("--split-local", s.to_string().into());
        }
        if self.allow_shared_loopback {
            out.push("--allow-shared-loopback".into());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser, Debug)]
    struct Engine {
        #[command(flatten)]
        flags: EngineFlags,
    }

    fn check(flags: EngineFlags) {
        let args = std::iter::once(OsString::from("split-engine")).chain(flags.to_args());
        let parsed = Engine::try_parse_from(args).map_err(|e| e.to_string()).expect("parses");
        assert_eq!(parsed.flags, flags);
    }

    fn flags() -> EngineFlags {
        EngineFlags {
            socket: "/run/revis/split/default.sock".into(),
            tier: "default".into(),
            model: "/models/a model.gguf".into(),
            context: 4096,
            threads: revis_engine::Threads::Fixed(6),
            batch: 512,
            max_tokens_limit: 2048,
            nodes: vec!["desktop".into(), "laptop two".into()],
            split_local: Some(0.25),
            state_dir: "/state/split/default-state".into(),
            allow_shared_loopback: true,
        }
    }

    #[test]
    fn rendered_flags_parse_back_the_same() {
        check(flags());
        check(EngineFlags {
            threads: "auto".parse().unwrap(),
            nodes: vec!["desktop".into()],
            split_local: None,
            allow_shared_loopback: false,
            ..flags()
        });
        check(EngineFlags { split_local: Some(1.0 / 3.0), ..flags() });
    }
}
