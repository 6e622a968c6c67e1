//! Does the thread count change a token's logits? A 600-token prompt, then
//! 64 greedy tokens decoded one at a time, with 1 and with 2 threads, flash
//! attention on (llama.cpp's default here) and off; every row compared bit
//! for bit, and the time a token took. `thread_numerics MODEL [f16|f32 f16|f32]`
//! (the cache's K and V types; f16 both by default).
//! (The answer decides the thread policy: see ARCHITECTURE.md, "Threads".)
use std::num::NonZeroU32;
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams};
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::token::LlamaToken;

const DECODED: usize = 64;

fn main() {
    let path = std::env::args().nth(1).expect("thread_numerics MODEL [K V]");
    let kv = |i: usize| match std::env::args().nth(i).as_deref() {
        Some("f32") => KvCacheType::F32,
        _ => KvCacheType::F16,
    };
    let (type_k, type_v) = (kv(2), kv(3));
    let mut backend = LlamaBackend::init().unwrap();
    backend.void_logs();
    let model = LlamaModel::load_from_file(&backend, path, &LlamaModelParams::default()).unwrap();
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(60);
    let prompt = model.vocab().tokenize(text.as_bytes(), true, true);
    let n = prompt.len();
    for (name, fa) in
        [("fa auto", llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_AUTO), ("fa off", llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_DISABLED)]
    {
        // Each run: the prompt's last logits, then each decoded token's, and ms a token.
        let run = |threads: i32, forced: Option<&[i32]>| -> (Vec<Vec<f32>>, Vec<i32>, f64, f64) {
            let params = LlamaContextParams::default()
                .with_n_ctx(NonZeroU32::new(2048))
                .with_n_batch(512)
                .with_n_ubatch(512)
                .with_n_threads(threads)
                .with_n_threads_batch(threads)
                .with_n_seq_max(1)
                .with_type_k(type_k)
                .with_type_v(type_v)
                .with_flash_attention_policy(fa);
            let mut ctx: LlamaContext = model.new_context(&backend, params).unwrap();
            let mut batch = LlamaBatch::new(512, 1);
            let p0 = Instant::now();
            for start in (0..n).step_by(512) {
                batch.clear();
                for (i, &t) in prompt.iter().enumerate().take((start + 512).min(n)).skip(start) {
                    batch.add(t, i as i32, &[0], i == n - 1).unwrap();
                }
                ctx.decode(&mut batch).unwrap();
            }
            let prompt_ms = p0.elapsed().as_secs_f64() * 1e3;
            let mut rows = vec![ctx.get_logits_ith(batch.n_tokens() - 1).to_vec()];
            let mut toks = vec![];
            let t0 = Instant::now();
            for step in 0..DECODED {
                let l = rows.last().unwrap();
                let t = match forced {
                    Some(f) => f[step],
                    None => (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b]).then(b.cmp(&a))).unwrap() as i32,
                };
                toks.push(t);
                batch.clear();
                batch.add(LlamaToken(t), (n + step) as i32, &[0], true).unwrap();
                ctx.decode(&mut batch).unwrap();
                rows.push(ctx.get_logits_ith(0).to_vec());
            }
            (rows, toks, t0.elapsed().as_secs_f64() / DECODED as f64 * 1e3, prompt_ms)
        };
        let (one, toks, ms1, p1) = run(1, None);
        let (two, _, ms2, p2) = run(2, Some(&toks));
        let differ: Vec<usize> = (0..one.len()).filter(|&i| one[i] != two[i]).collect();
        println!(
            "{name}, K {type_k:?} V {type_v:?}, prompt {n}: {} of {} rows differ between 1 and 2 threads (first at row {:?}); decode {ms1:.1} ms a token with 1 thread, {ms2:.1} with 2; prompt {p1:.0} ms with 1, {p2:.0} with 2",
            differ.len(),
            one.len(),
            differ.first()
        );
    }
}
