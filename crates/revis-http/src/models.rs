//! Model names as the HTTP APIs use them, and the tier each means.
//!
//! A request names a model by its tier (`tier1`, `tier2`, `tier3`) or by
//! the model a tier runs as this machine's daemon reports it: its catalog
//! name (`smollm2-135m-instruct`), or, for a model the config gives as a
//! path, the file's name without `.gguf` (and a file the catalog knows by
//! its catalog name). A model several tiers run means the default tier if
//! that is one of them, else the first. Ollama's `:latest` tag is accepted
//! and ignored. A paired node's tier is `NODE/TIER` (`desk/tier3`, the
//! node's name as paired): such a request goes through the dispatcher to
//! that node alone ([`Runner::on_node`]: its breaker as for any task, no
//! failover, since it names where it must run), and a 503 while the node
//! does not answer. Every paired node's tiers (as last seen) are listed. A
//! plain tier is the dispatcher's to place (`revis offload`).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use revis_client::{CallError, Runner, Tier, TierStatus};

/// One model as the APIs list it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// What a request names.
    pub name: String,
    pub tier: Tier,
    /// The paired node that runs it (a `NODE/TIER` name); None: this
    /// machine's dispatcher places it.
    pub node: Option<String>,
    /// The tier's model (catalog name or file name).
    pub model: String,
    pub state: revis_client::ModelState,
    pub memory_bytes: u64,
    pub context_tokens: u32,
    /// The model file's size, when the catalog knows it.
    pub size: u64,
    /// The catalog's SHA-256 of the file, when known.
    pub digest: String,
}

/// Every name a request may use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Catalog {
    /// Tiers first, then the models (each once), in tier order.
    pub entries: Vec<Entry>,
}

/// A tier's model under the name users know it by.
pub fn model_name(model: &str) -> String {
    let file = Path::new(model).file_name().map_or_else(|| model.to_owned(), |f| f.to_string_lossy().into_owned());
    if let Some(e) = revis_models::catalog().iter().find(|e| e.name == model || e.file_name == file) {
        return e.name.to_owned();
    }
    file.strip_suffix(".gguf").unwrap_or(&file).to_owned()
}

impl Catalog {
    /// This machine's `tiers` and the models they run, then each of
    /// `nodes`' tiers as `NODE/TIER`.
    pub fn new(tiers: &[TierStatus], nodes: &[(String, Vec<Tier>)]) -> Catalog {
        let entry = |name: String, t: &TierStatus| {
            let known = revis_models::find(&model_name(&t.model));
            Entry {
                name,
                tier: t.tier,
                node: None,
                model: model_name(&t.model),
                state: t.state,
                memory_bytes: t.memory_bytes,
                context_tokens: t.context_tokens,
                size: known.map_or(0, |e| e.size),
                digest: known.map_or_else(String::new, |e| e.sha256.to_owned()),
            }
        };
        let mut entries: Vec<Entry> = tiers.iter().map(|t| entry(t.tier.to_string(), t)).collect();
        // Each model once, under the tier that answers for it.
        let mut ordered: Vec<&TierStatus> = tiers.iter().filter(|t| t.tier == Tier::DEFAULT).collect();
        ordered.extend(tiers.iter().filter(|t| t.tier != Tier::DEFAULT));
        for t in ordered {
            let name = model_name(&t.model);
            if !name.is_empty() && !entries.iter().any(|e| e.name == name) {
                entries.push(entry(name, t));
            }
        }
        for (node, node_tiers) in nodes {
            for &tier in node_tiers {
                entries.push(Entry {
                    name: format!("{node}/{tier}"),
                    tier,
                    node: Some(node.clone()),
                    model: String::new(),
                    state: revis_client::ModelState::Ready,
                    memory_bytes: 0,
                    context_tokens: 0,
                    size: 0,
                    digest: String::new(),
                });
            }
        }
        Catalog { entries }
    }

    /// The entry a request's `model` names.
    pub fn find(&self, model: &str) -> Option<&Entry> {
        let model = model.strip_suffix(":latest").unwrap_or(model);
        self.entries.iter().find(|e| e.name == model)
    }

    pub fn names(&self) -> Vec<String> {
        self.entries.iter().map(|e| e.name.clone()).collect()
    }
}

/// How long a catalog read from the daemon is used before it is read again.
const CATALOG_TTL: Duration = Duration::from_secs(2);

/// The catalog, read again from the daemon at most every [`CATALOG_TTL`]
/// to resolve a request's model; the listings read it fresh (a model's
/// state changes at its first answer).
#[derive(Default)]
pub(crate) struct Cached(Mutex<Option<(Instant, Arc<Catalog>)>>);

impl Cached {
    /// Read now.
    pub(crate) async fn fresh<R: Runner>(&self, runner: &R) -> Result<Arc<Catalog>, CallError> {
        let c = Arc::new(Catalog::new(&runner.tiers().await?, &runner.nodes()));
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), c.clone()));
        Ok(c)
    }

    /// Read at most [`CATALOG_TTL`] ago.
    pub(crate) async fn get<R: Runner>(&self, runner: &R) -> Result<Arc<Catalog>, CallError> {
        if let Some((at, c)) = &*self.0.lock().unwrap_or_else(|e| e.into_inner())
            && at.elapsed() < CATALOG_TTL
        {
            return Ok(c.clone());
        }
        self.fresh(runner).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tier(tier: Tier, model: &str) -> TierStatus {
        TierStatus { tier, model: model.into(), ..Default::default() }
    }

    #[test]
    fn tiers_and_their_models_are_names() {
        let smol = revis_models::find("smollm2-135m-instruct").unwrap();
        let c = Catalog::new(
            &[
                tier(Tier::Tier1, "gemma3-270m"),
                tier(Tier::Tier2, &format!("/home/u/models/{}", smol.file_name)),
                tier(Tier::Tier3, "/models/my-own-8b.Q4.gguf"),
            ],
            &[("desk".into(), vec![Tier::Tier3])],
        );
        assert_eq!(c.names(), ["tier1", "tier2", "tier3", "smollm2-135m-instruct", "gemma3-270m", "my-own-8b.Q4", "desk/tier3"]);
        let desk = c.find("desk/tier3").unwrap();
        assert_eq!((desk.tier, desk.node.as_deref()), (Tier::Tier3, Some("desk")));
        assert_eq!(c.find("tier3").unwrap().node, None, "a plain tier is placed by the dispatcher");
        assert_eq!(c.find("smollm2-135m-instruct").unwrap().tier, Tier::Tier2);
        assert_eq!(c.find("smollm2-135m-instruct").unwrap().size, smol.size);
        assert_eq!(c.find("tier3:latest").unwrap().model, "my-own-8b.Q4");
        assert!(c.find("gpt-4o").is_none());
    }

    #[test]
    fn a_model_of_several_tiers_means_the_default_tier() {
        let c = Catalog::new(&[tier(Tier::Tier1, "gemma3-270m"), tier(Tier::Tier2, "gemma3-270m"), tier(Tier::Tier3, "gemma3-270m")], &[]);
        assert_eq!(c.find("gemma3-270m").unwrap().tier, Tier::DEFAULT);
    }
}
