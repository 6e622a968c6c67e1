//! `revis ensemble`: which models answer a tier together (this machine's
//! tiers and paired nodes' tiers), kept in the store like a tier's offload
//! and read by every command that builds a dispatcher.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use revis_client::ensemble::{EnsembleSpec, MemberProblem, MemberSpec, Method};
use revis_client::{Client, Keyring, Paths, Tier};
use serde_json::json;

/// The exit status of settings `revis ensemble` refuses: 2, as clap exits
/// for a command line it cannot parse (a bad `--method` or member there).
const REFUSED: u8 = 2;

#[derive(Args)]
pub struct EnsembleArgs {
    /// The tier an ensemble answers (tier1, tier2 or tier3). Without it: every tier's ensemble.
    tier: Option<Tier>,
    /// The models that answer together, comma-separated, at least two: a tier of this machine (`tier2`) or of a
    /// paired node (`desk/tier3`). Sets the ensemble and switches it on.
    #[arg(long, value_delimiter = ',', requires = "tier")]
    members: Option<Vec<MemberSpec>>,
    /// How the answers are combined: confident (the surest span wins), cross (every member scores every span) or
    /// merge (the members' next words mixed where the first is unsure). Default: confident.
    #[arg(long, requires = "tier")]
    method: Option<Method>,
    /// Tokens each member drafts per round (cut back to a word boundary).
    #[arg(long, requires = "tier")]
    span: Option<u32>,
    /// merge: the first member's top-token probability under which the members' words are mixed.
    #[arg(long, requires = "tier")]
    gate: Option<f32>,
    /// A member that has not answered a round within this many milliseconds sits it out.
    #[arg(long, requires = "tier")]
    deadline_ms: Option<u64>,
    /// Switch the tier's ensemble off (its members are kept); the tier answers alone again.
    #[arg(long, requires = "tier", conflicts_with_all = ["members", "method", "span", "gate", "deadline_ms"])]
    off: bool,
}

impl EnsembleArgs {
    /// Whether any setting was given (else the tier's ensemble is shown).
    fn sets(&self) -> bool {
        self.members.is_some() || self.method.is_some() || self.span.is_some() || self.gate.is_some() || self.deadline_ms.is_some()
    }

    /// The settings given, over what the tier had.
    fn apply_to(&self, mut spec: EnsembleSpec) -> EnsembleSpec {
        spec.enabled = true;
        if let Some(m) = &self.members {
            spec.members.clone_from(m);
        }
        if let Some(m) = self.method {
            spec.method = m;
        }
        if let Some(s) = self.span {
            spec.span_tokens = s;
        }
        if let Some(g) = self.gate {
            spec.gate = g;
        }
        if let Some(ms) = self.deadline_ms {
            spec.round_deadline = Duration::from_millis(ms);
        }
        spec
    }
}

pub async fn ensemble(paths: &Paths, explicit: bool, a: EnsembleArgs) -> anyhow::Result<ExitCode> {
    let Some(tier) = a.tier else {
        let all = revis_orchestrator::ensemble::load_all(&crate::session::open_store(paths)?);
        for t in Tier::ALL {
            println!("{}", line(t, all.get(&t)));
        }
        return Ok(ExitCode::SUCCESS);
    };
    if a.off {
        let store = crate::session::open_store(paths)?;
        match revis_orchestrator::ensemble::load_all(&store).remove(&tier) {
            Some(spec) if spec.enabled => {
                revis_orchestrator::ensemble::save(&store, tier, &EnsembleSpec { enabled: false, ..spec })?;
                println!("{tier}: ensemble off; {tier} answers alone.");
            }
            _ => println!("{tier} has no ensemble on; it answers alone."),
        }
        return Ok(ExitCode::SUCCESS);
    }
    if !a.sets() {
        let all = revis_orchestrator::ensemble::load_all(&crate::session::open_store(paths)?);
        println!("{}", line(tier, all.get(&tier)));
        return Ok(ExitCode::SUCCESS);
    }
    let store = crate::session::open_store(paths)?;
    let spec = a.apply_to(revis_orchestrator::ensemble::load_all(&store).remove(&tier).unwrap_or_default());
    if let Err(why) = spec.check() {
        eprintln!("revis: {why}");
        return Ok(ExitCode::from(REFUSED));
    }
    check_members(paths, explicit, &spec.members).await?;
    revis_orchestrator::ensemble::save(&store, tier, &spec)?;
    println!("{}", line(tier, Some(&spec)));
    Ok(ExitCode::SUCCESS)
}

/// A member on a node names a paired node; a member here names a tier this
/// machine's daemon serves.
async fn check_members(paths: &Paths, explicit: bool, members: &[MemberSpec]) -> anyhow::Result<()> {
    let mut paired = std::collections::HashSet::new();
    if members.iter().any(|m| m.node.is_some()) {
        let keyring = Keyring::open(&paths.keyring())?;
        for n in members.iter().filter_map(|m| m.node.as_deref()) {
            if keyring.store.find(n)?.is_some() {
                paired.insert(n.to_owned());
            }
        }
    }
    let served = if members.iter().any(|m| m.node.is_none()) {
        let status = crate::session::connect_or_start(&paths.socket, explicit).await?.status().await?;
        status.tiers.iter().map(|t| t.tier).collect()
    } else {
        Vec::new()
    };
    match revis_client::ensemble::check_members(members, |n| paired.contains(n), || served) {
        Ok(()) => Ok(()),
        Err(e @ MemberProblem::NotPaired(_)) => bail!("{e}; `revis nodes` lists them, `revis pair NODE` pairs one"),
        Err(e) => bail!("{e}"),
    }
}

/// A tier's ensemble in one line.
fn line(tier: Tier, spec: Option<&EnsembleSpec>) -> String {
    match spec {
        Some(s) => format!("{tier}: ensemble {}", s.describe()),
        None => format!("{tier}: no ensemble"),
    }
}

/// The ensembles switched on, for `revis status`: a line each.
pub fn status_lines(ensembles: &BTreeMap<Tier, EnsembleSpec>) -> Vec<String> {
    ensembles.iter().filter(|(_, s)| s.enabled).map(|(t, s)| format!("  {}", line(*t, Some(s)))).collect()
}

/// The ensembles switched on, for `revis status --json` (this machine only: a
/// node's daemon knows nothing of this machine's ensembles).
pub fn status_json(paths: &Paths, client: &Client) -> serde_json::Value {
    if !matches!(client.target(), revis_client::Target::Socket(_)) {
        return serde_json::Value::Null;
    }
    let Ok(store) = crate::session::open_store(paths) else { return serde_json::Value::Null };
    let on: serde_json::Map<String, serde_json::Value> = revis_orchestrator::ensemble::load_all(&store)
        .into_iter()
        .filter(|(_, s)| s.enabled)
        .map(|(t, s)| {
            let mut v = s.to_json();
            v["summary"] = json!(s.describe());
            (t.to_string(), v)
        })
        .collect();
    serde_json::Value::Object(on)
}
