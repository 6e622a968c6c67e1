//! What every handler shares: the runner, the model catalog, the places
//! for generations and pulls, and the options; and the steps each API's
//! handlers take through it (what a `model` names, a place, a generation
//! started where the model runs, embeddings).

use std::sync::Arc;
use std::time::Duration;

use revis_client::Runner;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{ApiError, Flavor};
use crate::options::Options;
use crate::{edge, generation, models};

/// What a request's `model` names.
pub(crate) async fn resolve<R: Runner>(app: &AppState<R>, model: &str, flavor: Flavor) -> Result<models::Entry, ApiError> {
    let catalog = app.catalog.get(&app.runner).await.map_err(|e| ApiError::from_call(flavor, &e))?;
    catalog.find(model).cloned().ok_or_else(|| ApiError::model_not_found(flavor, model, &catalog.names()))
}

/// What every handler shares.
pub(crate) struct App<R> {
    pub(crate) runner: R,
    pub(crate) catalog: models::Cached,
    generations: Arc<Semaphore>,
    /// Model downloads running at once (`/api/pull`).
    pub(crate) pulls: Arc<Semaphore>,
    pub(crate) opts: Options,
}

/// The state axum hands each handler.
pub(crate) type AppState<R> = Arc<App<R>>;

impl<R: Runner> App<R> {
    /// The state over `runner`, with room for `max_pulls` model downloads at once.
    pub(crate) fn new(runner: R, opts: Options, max_pulls: usize) -> App<R> {
        App {
            runner,
            catalog: models::Cached::default(),
            generations: Arc::new(Semaphore::new(opts.limits.max_generations)),
            pulls: Arc::new(Semaphore::new(max_pulls)),
            opts,
        }
    }

    /// The runner held to a paired node, for a request that names it
    /// (`NODE/TIER`), or a 503 saying it does not answer.
    fn node(&self, flavor: Flavor, node: &str) -> Result<R, ApiError> {
        self.runner.on_node(node).ok_or_else(|| {
            ApiError::new(
                flavor,
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                format!("the paired node {node:?} does not answer now; the model list says what can be used"),
            )
        })
    }

    /// Starts a generation where `entry` runs: its node alone, or wherever the runner places it.
    pub(crate) fn start(
        &self,
        flavor: Flavor,
        entry: &models::Entry,
        mut params: revis_client::GenerateParams,
        place: OwnedSemaphorePermit,
    ) -> Result<generation::Generation, ApiError> {
        params.tier = entry.tier;
        edge::prepare(&mut params);
        Ok(match &entry.node {
            None => generation::Generation::start(self.runner.clone(), entry.name.clone(), params, place),
            Some(node) => generation::Generation::start(self.node(flavor, node)?, entry.name.clone(), params, place),
        })
    }

    /// Embeddings where `entry` runs.
    pub(crate) async fn embed(
        &self,
        flavor: Flavor,
        entry: &models::Entry,
        inputs: Vec<String>,
    ) -> Result<revis_client::Embedded, ApiError> {
        let req = revis_client::EmbedParams { tier: entry.tier, inputs };
        let r = match &entry.node {
            None => self.runner.embed(req).await,
            Some(node) => self.node(flavor, node)?.embed(req).await,
        };
        r.map_err(|e| ApiError::from_call(flavor, &e))
    }

    /// A place for one more generation (an embedding call takes one too),
    /// or a 429 naming the limit.
    pub(crate) fn generation_place(&self, flavor: Flavor) -> Result<OwnedSemaphorePermit, ApiError> {
        self.generations.clone().try_acquire_owned().map_err(|_| {
            ApiError::too_many(
                flavor,
                format!(
                    "revis serve runs at most {} generations at once (its max_generations limit) and all are in use; retry when one ends",
                    self.opts.limits.max_generations
                ),
                Duration::from_secs(1),
            )
        })
    }
}
