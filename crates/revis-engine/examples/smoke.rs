//! Smoke run of the engine alone: one greedy answer, timings.
use revis_engine::*;
use std::sync::{Arc, atomic::AtomicBool};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let path = std::env::args().nth(1).expect("model path");
    let engine = Engine::spawn(Arc::new(LlamaCpp));
    let spec = ModelSpec {
        path: path.into(),
        n_ctx: 2048,
        threads: revis_engine::Threads::Fixed(2),
        batch: 512,
        cache_slots: 4,
        cache_budget_bytes: 256 << 20,
        probe: true,
        split: None,
        streams: 1,
        render: Default::default(),
    };
    let loaded = engine.load("m", spec).await.unwrap();
    println!("loaded {} MB in {} ms", loaded.memory_bytes >> 20, loaded.load_ms);
    let msgs = vec![Message::new(Role::User, "What is the capital of France?")];
    let prompt = build_prompt(loaded.tokenizer.as_ref(), &msgs, &[], 0).unwrap();
    for _ in 0..2 {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (done, done_rx) = tokio::sync::oneshot::channel();
        let job = GenerateJob {
            prompt: prompt.clone(),
            sampling: Sampling::greedy(),
            max_tokens: 64,
            stop: vec![],
            grammar: None,
            logprobs: None,
            speculate: Speculate::Auto,
        };
        let _f = engine.run(
            "m",
            Job::Generate { job, deltas: tx, done },
            revis_engine::Class::User,
            Arc::new(AtomicBool::new(false)),
            Box::new(()),
        );
        while let Some(d) = rx.recv().await {
            print!("{}", d.text);
        }
        let f = done_rx.await.unwrap().unwrap();
        println!("\n{:?}", Finished { text: String::new(), ..f });
    }
}
