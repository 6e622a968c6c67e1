//! Loading a model: the GGUF file (split over RPC servers when asked), its
//! chat template, the context with one sequence per stream, and the
//! tokenizer and session made from them.

use std::num::NonZeroU32;
use std::sync::Arc;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatTemplate, LlamaModel};
use llama_cpp_2::token::LlamaToken;

use super::pacer::Pacer;
use super::tokenizer::{Jinja, LlamaTokenizer, Template};
use super::{LlamaSession, Seq, raw_backend};
use crate::cache::PrefixCache;
use crate::lookup::{BatchCosts, PRIOR_ACCEPT};
use crate::render::{RenderPlace, Renderers};
use crate::{Backend, ChatTemplate, EngineError, Loaded, ModelSpec};

/// The llama.cpp backend. Runs on CPU here; a `metal` build uses the GPU on macOS.
#[derive(Debug, Default)]
pub struct LlamaCpp;

impl Backend for LlamaCpp {
    fn load(&self, spec: &ModelSpec) -> Result<Loaded, EngineError> {
        let load_err = |reason: String| EngineError::Load { path: spec.path.clone(), reason };
        if !spec.path.is_file() {
            return Err(load_err("no such file".into()));
        }
        let mut params = std::pin::pin!(match &spec.split {
            None => LlamaModelParams::default(),
            // llama.cpp offloads from the end, the output layer first: one
            // more than the repeating layers wanted there.
            Some(split) => LlamaModelParams::default()
                .with_devices(&split.devices)
                .map_err(|e| load_err(e.to_string()))?
                .with_n_gpu_layers(split.remote_layers + 1),
        });
        if spec.split.is_some() {
            // ...but the output layer's weights stay here (its matrix is
            // vocabulary × embedding): then a token's hidden state crosses
            // the network, not its logits (a 49k-entry vocabulary's logits
            // are 192 KiB a token, the hidden state 2 KiB).
            params.as_mut().add_cpu_buft_override(c"^(output|token_embd)");
        }
        let model = LlamaModel::load_from_file(raw_backend(), &spec.path, &params).map_err(|e| load_err(e.to_string()))?;
        let model = Arc::new(model);
        let template = match model.chat_template(None).ok().and_then(|t| t.to_string().ok()) {
            // The model's own (Jinja), as Hugging Face renders it.
            Some(source) => {
                let special = |t: LlamaToken| String::from_utf8_lossy(&model.vocab().token_to_piece(t, true, None)).into_owned();
                let (bos, eos) = (special(model.vocab().bos()), special(model.vocab().eos()));
                let template = ChatTemplate::new(&source, &bos, &eos).map_err(|e| load_err(e.to_string()))?;
                let renderers = match &spec.render {
                    RenderPlace::Here => None,
                    RenderPlace::Child(child) => Some(Renderers::new(child.clone())),
                };
                Template::Jinja(Box::new(Jinja { template, source, renderers }))
            }
            // No template in the GGUF: llama.cpp's built-in one for the architecture.
            None => {
                let arch = model.meta_val_str("general.architecture").unwrap_or_default();
                let name = if arch.starts_with("gemma") { "gemma" } else { "chatml" };
                Template::Builtin(LlamaChatTemplate::new(name).map_err(|e| load_err(e.to_string()))?)
            }
        };
        let n_ctx = spec.n_ctx.min(model.n_ctx_train().max(1));
        let threads = spec.threads.most() as i32;
        let streams = spec.streams.clamp(1, crate::MAX_STREAMS);
        let params = LlamaContextParams::default()
            // One sequence per stream, each with a cache of its own of the
            // whole context (not one pool they share): a stream never runs
            // out of cells because of the others, and attends over its own.
            .with_n_ctx(NonZeroU32::new(n_ctx * streams))
            .with_n_seq_max(streams)
            .with_kv_unified(false)
            .with_n_batch(spec.batch)
            .with_n_ubatch(spec.batch)
            .with_n_threads(threads)
            .with_n_threads_batch(threads)
            // Keep the whole sliding-window cache (Gemma 3) so prefixes can be trimmed and restored.
            .with_swa_full(true);
        let ctx = model.new_context(raw_backend(), params).map_err(|e| load_err(e.to_string()))?;
        // SAFETY: the context borrows the model. The session owns an Arc of
        // the model and declares `ctx` before `model`, so the context is
        // dropped first and the model outlives every use of it.
        let ctx: LlamaContext<'static> = unsafe { std::mem::transmute::<LlamaContext<'_>, LlamaContext<'static>>(ctx) };
        let pacer = Pacer::new(&ctx, spec.threads);
        let add_bos = model.vocab().should_add_bos();
        let bos_text = String::from_utf8_lossy(&model.vocab().token_to_piece(model.vocab().bos(), true, None)).into_owned();
        let tokenizer = Arc::new(LlamaTokenizer {
            model: model.clone(),
            template,
            n_ctx,
            add_bos,
            bos_text,
            grammars: Default::default(),
            checked: Default::default(),
        });
        let mut session = LlamaSession {
            embed_ctx: None,
            ctx,
            model,
            threads,
            pacer,
            batch: LlamaBatch::new(spec.batch as usize, 1),
            chunk: spec.batch as usize,
            n_ctx,
            seqs: (0..streams).map(|_| Seq::default()).collect(),
            gens: (0..streams).map(|_| None).collect(),
            tick: 0,
            saved: PrefixCache::new(spec.cache_slots, spec.cache_budget_bytes),
            costs: BatchCosts::default(),
            exact_batch: None,
            accept: PRIOR_ACCEPT,
        };
        if spec.probe {
            // The cache is empty now: nothing to save or lose.
            session.exact_batch = Some(session.probe()?);
        }
        Ok((tokenizer, Box::new(session)))
    }

    fn release_memory(&self) {
        // glibc keeps freed pages; hand them back so an unload shows in RSS.
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        unsafe {
            libc::malloc_trim(0);
        }
    }
}
