//! The command line's grammar: `revis`'s global flags and its subcommands,
//! as clap reads them. What each subcommand does is elsewhere
//! (`commands.rs` hands each to its file).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// revis: a private AI partner on the machines you own.
#[derive(Parser)]
#[command(version, propagate_version = true)]
pub struct Cli {
    /// The daemon's socket. Default: $REVIS_SOCKET, else the user's runtime dir.
    #[arg(long, global = true, env = "REVIS_SOCKET")]
    pub(crate) socket: Option<PathBuf>,
    /// Use a paired node's daemon (name or device ID, see `revis nodes`) instead of this machine's,
    /// over mutual TLS (--socket is then not used).
    #[arg(long, global = true, env = "REVIS_NODE")]
    pub(crate) node: Option<String>,
    /// Answer yes when revis asks (before a first download of over 1 GB), for scripts.
    /// REVIS_YES takes 1/0, yes/no, true/false, on/off.
    #[arg(long, global = true, env = "REVIS_YES", value_parser = switch)]
    pub(crate) yes: bool,
    #[command(subcommand)]
    pub(crate) command: Cmd,
}

/// An environment switch (REVIS_YES) as people write it: 1/0, yes/no,
/// true/false, on/off (any case); anything else is an error that says what
/// it takes. (clap's own bool parser takes only true and false, so
/// `REVIS_YES=1`, as the README says, failed every command.)
fn switch(value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "yes" | "y" | "true" | "on" => Ok(true),
        "0" | "no" | "n" | "false" | "off" | "" => Ok(false),
        _ => Err(format!("REVIS_YES (or --yes) is {value:?}; it takes 1 or 0, yes or no, true or false, on or off")),
    }
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Download a model: a catalog name (`revis models`), or any GGUF on Hugging Face:
    /// `hf:OWNER/REPO[:QUANT]` (default Q4_K_M) or `hf:OWNER/REPO/FILE.gguf`.
    /// Without one: the catalog model that fits this machine, which becomes the default.
    Pull {
        name: Option<String>,
        /// Re-hash a model that is already there.
        #[arg(long)]
        verify: bool,
        /// Make it the default model (what tiers use when revisd.toml names none).
        #[arg(long)]
        default: bool,
    },
    /// List the catalog (size, memory, expected speed here) and what is downloaded.
    Models,
    /// Show the daemon's state: tiers, models, memory, queue.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Load a tier's model now.
    Load { tier: revis_client::Tier },
    /// Unload a tier's model and free its memory.
    Unload { tier: revis_client::Tier },
    /// Answer one prompt, streamed to stdout.
    Run(crate::run::RunArgs),
    /// Chat, remembered across runs (continues the latest conversation; --new starts one).
    /// With piped input, one message per line and each answer printed.
    Chat(crate::chat::ChatArgs),
    /// List conversations, or show one.
    History {
        #[command(subcommand)]
        show: Option<HistoryCmd>,
    },
    /// What revis has learned about you, with where and when you said it; forget or add facts.
    Profile {
        #[command(subcommand)]
        cmd: Option<ProfileCmd>,
    },
    /// Other machines' daemons: discovered on the LAN, and paired ones with their health.
    Nodes(crate::nodes::NodesArgs),
    /// Pair with another machine's daemon, using the code it shows (`revisd pair` there).
    Pair(crate::nodes::PairArgs),
    /// Forget a paired node here.
    Unpair { node: String },
    /// Run a tier on paired nodes instead of here (its model is unloaded here), or bring it home.
    Offload(crate::nodes::OffloadArgs),
    /// Answer a tier with several models together (this machine's tiers, paired nodes' tiers); no arguments: list them.
    Ensemble(crate::ensemble::EnsembleArgs),
    /// Serve OpenAI's (/v1) and Ollama's (/api) HTTP APIs on this machine, for other tools
    /// (`revis serve install` runs it as a service next to revisd).
    Serve(Box<crate::serve::ServeArgs>),
}

#[derive(Subcommand)]
pub enum HistoryCmd {
    /// Show a conversation's messages.
    Show { id: u64 },
}

#[derive(Subcommand)]
pub enum ProfileCmd {
    /// Forget a fact (its number in `revis profile`), or every fact with --all. A fact forgotten
    /// comes back only if you say it again.
    Forget {
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        id: Option<u64>,
        #[arg(long)]
        all: bool,
    },
    /// Tell revis a fact about yourself ("I'm vegetarian"); it goes into every conversation's prompt.
    Add { fact: String },
}
