//! A context's thread count per call: each `llama_decode` runs on the
//! threads the [`Tuner`] plans for it, set through llama.cpp's context.

use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;

use crate::threads::{Threads, Tuner};

/// A context's thread counts: before each `llama_decode` it sets the count
/// the [`Tuner`] plans for the call (`llama_set_n_threads`), and gives the
/// tuner what the call took.
pub(super) struct Pacer {
    pub(super) threads: Threads,
    pub(super) tuner: Tuner,
    /// The `llama_context` as an address ([`raw_context`]); 0 when it could
    /// not be found, and then every call keeps the count the context was
    /// made with.
    raw: usize,
    /// The count set last.
    applied: u32,
    /// The calls that follow carry background work only ([`crate::Session::set_background`]).
    pub(super) background: bool,
}

impl Pacer {
    pub(super) fn new(ctx: &LlamaContext<'_>, threads: Threads) -> Pacer {
        let raw = match (threads, raw_context(ctx)) {
            (Threads::Fixed(_), _) => 0,
            (_, Some(p)) => p as usize,
            (_, None) => {
                tracing::warn!("cannot reach llama.cpp's context to change its thread count: every call keeps {}", threads.most());
                0
            }
        };
        Pacer { threads, tuner: Tuner::new(threads), raw, applied: threads.most(), background: false }
    }

    pub(super) fn decode(&mut self, ctx: &mut LlamaContext<'_>, batch: &mut LlamaBatch<'_>) -> Result<(), llama_cpp_2::DecodeError> {
        if self.raw == 0 {
            return ctx.decode(batch);
        }
        let tokens = batch.n_tokens().max(1) as usize;
        let plan = self.tuner.plan(tokens, self.background, Instant::now());
        if plan.threads != self.applied {
            let n = plan.threads as i32;
            // SAFETY: `raw` is `ctx`'s own context (checked in `raw_context`),
            // used on the engine thread that owns `ctx`, between calls.
            unsafe { llama_cpp_sys_2::llama_set_n_threads(self.raw as *mut llama_cpp_sys_2::llama_context, n, n) };
            self.applied = plan.threads;
        }
        let started = Instant::now();
        let result = ctx.decode(batch);
        if result.is_ok() {
            let now = Instant::now();
            self.tuner.record(plan, tokens, now - started, now);
        }
        result
    }
}

/// The `llama_context` behind `ctx`, for `llama_set_n_threads`, which
/// llama-cpp-2 (pinned at =0.1.160) does not wrap. The crate keeps the
/// pointer private and prints it in its Debug form; the address read there
/// is used only if llama.cpp's own getters through it give what the
/// crate's give (context, batch and micro-batch sizes).
fn raw_context(ctx: &LlamaContext<'_>) -> Option<*mut llama_cpp_sys_2::llama_context> {
    let shown = format!("{ctx:?}");
    let digits: String = shown.split("0x").nth(1)?.chars().take_while(char::is_ascii_hexdigit).collect();
    let p = usize::from_str_radix(&digits, 16).ok()? as *mut llama_cpp_sys_2::llama_context;
    if p.is_null() {
        return None;
    }
    // SAFETY: with the pinned crate `p` is the pointer `ctx` wraps; the
    // getters read fields of a live context.
    let agrees = unsafe {
        llama_cpp_sys_2::llama_n_ctx(p) == ctx.n_ctx()
            && llama_cpp_sys_2::llama_n_batch(p) == ctx.n_batch()
            && llama_cpp_sys_2::llama_n_ubatch(p) == ctx.n_ubatch()
    };
    agrees.then_some(p)
}
