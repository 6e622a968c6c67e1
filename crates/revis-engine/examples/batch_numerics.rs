//! Are a token's logits the same decoded alone and in a batch, after a
//! 600-token prompt, with flash attention on and off? (They are not on
//! llama.cpp's CPU backend: see `lookup::EXACT_CONTEXT`.)
//! `batch_numerics MODEL [THREADS]`.
use std::num::NonZeroU32;
use std::time::Instant;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::token::LlamaToken;

fn main() {
    let path = std::env::args().nth(1).unwrap();
    let threads: i32 = std::env::args().nth(2).map_or(1, |s| s.parse().unwrap());
    let mut backend = LlamaBackend::init().unwrap();
    backend.void_logs();
    let model = LlamaModel::load_from_file(&backend, path, &LlamaModelParams::default()).unwrap();
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(60);
    let prompt = model.vocab().tokenize(text.as_bytes(), true, true);
    for (name, fa) in
        [("fa auto", llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_AUTO), ("fa off", llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_DISABLED)]
    {
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(2048))
            .with_n_batch(512)
            .with_n_ubatch(512)
            .with_n_threads(threads)
            .with_n_threads_batch(threads)
            .with_n_seq_max(1)
            .with_flash_attention_policy(fa);
        let mut ctx = model.new_context(&backend, params).unwrap();
        let mut batch = LlamaBatch::new(512, 1);
        let n = prompt.len();
        let eval = |ctx: &mut llama_cpp_2::context::LlamaContext, batch: &mut LlamaBatch| {
            ctx.clear_kv_cache();
            for start in (0..n).step_by(512) {
                batch.clear();
                for (i, &t) in prompt.iter().enumerate().take((start + 512).min(n)).skip(start) {
                    batch.add(t, i as i32, &[0], i == n - 1).unwrap();
                }
                ctx.decode(batch).unwrap();
            }
        };
        eval(&mut ctx, &mut batch);
        let mut plain = vec![ctx.get_logits_ith(batch.n_tokens() - 1).to_vec()];
        let mut toks = vec![];
        let t0 = Instant::now();
        for step in 0..40 {
            let l = plain.last().unwrap();
            let t = (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b]).then(b.cmp(&a))).unwrap() as i32;
            toks.push(t);
            batch.clear();
            batch.add(LlamaToken(t), (n + step) as i32, &[0], true).unwrap();
            ctx.decode(&mut batch).unwrap();
            plain.push(ctx.get_logits_ith(0).to_vec());
        }
        let per = t0.elapsed().as_secs_f64() / 40.0 * 1e3;
        for k in [2usize, 4, 8] {
            eval(&mut ctx, &mut batch);
            let (mut same, mut differ) = (0, 0);
            let mut pos = 0;
            while pos + k <= toks.len() {
                batch.clear();
                for i in 0..k {
                    batch.add(LlamaToken(toks[pos + i]), (n + pos + i) as i32, &[0], true).unwrap();
                }
                ctx.decode(&mut batch).unwrap();
                for i in 0..k {
                    if ctx.get_logits_ith(i as i32) == &plain[pos + i + 1][..] { same += 1 } else { differ += 1 }
                }
                pos += k;
            }
            println!("{name}, prompt {n}: batch {k}: {same} identical, {differ} differ; single decode {per:.1} ms a token");
        }
    }
}
