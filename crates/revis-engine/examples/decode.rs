//! Decode speed of the engine alone, for profiling (`perf record`):
//! `decode MODEL [THREADS] [greedy|sampled] [ROUNDS]`, each round a
//! 128-token answer to a counting prompt after a Purge.
use revis_engine::*;
use std::sync::{Arc, atomic::AtomicBool};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: decode MODEL [THREADS] [greedy|sampled] [ROUNDS]");
    let threads = args.next().map_or(1, |t| t.parse().expect("threads"));
    let sampled = args.next().is_some_and(|m| m == "sampled");
    let rounds: u32 = args.next().map_or(5, |r| r.parse().expect("rounds"));
    let engine = Engine::spawn(Arc::new(LlamaCpp));
    let spec = ModelSpec {
        path: path.into(),
        n_ctx: 2048,
        threads: revis_engine::Threads::Fixed(threads),
        batch: 512,
        cache_slots: 4,
        cache_budget_bytes: 256 << 20,
        probe: false,
        split: None,
        streams: 1,
        render: Default::default(),
    };
    let loaded = engine.load("m", spec).await.expect("load");
    let msgs = vec![Message::new(Role::User, "Count from 1 to 500, separated by spaces. Write every number; do not stop early.")];
    let prompt = build_prompt(loaded.tokenizer.as_ref(), &msgs, &[], 0).expect("prompt");
    let sampling = if sampled {
        Sampling { temperature: 0.7, top_k: 40, top_p: 0.95, min_p: 0.05, seed: 1, ..Sampling::greedy() }
    } else {
        Sampling::greedy()
    };
    for round in 0..rounds {
        engine.purge(None).await.expect("purge");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (done, done_rx) = tokio::sync::oneshot::channel();
        let job = GenerateJob {
            prompt: prompt.clone(),
            sampling: sampling.clone(),
            max_tokens: 128,
            stop: vec![],
            grammar: None,
            logprobs: None,
            speculate: Speculate::Off,
        };
        let _f = engine.run(
            "m",
            Job::Generate { job, deltas: tx, done },
            revis_engine::Class::User,
            Arc::new(AtomicBool::new(false)),
            Box::new(()),
        );
        while rx.recv().await.is_some() {}
        let f = done_rx.await.expect("engine").expect("generate");
        println!("round {round}: {} tokens, {:.1} t/s", f.generated_tokens, f64::from(f.generated_tokens) * 1e6 / f.generate_us as f64);
    }
}
