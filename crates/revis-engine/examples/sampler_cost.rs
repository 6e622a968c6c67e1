//! What picking a token costs, without the model: llama.cpp's chain over a
//! candidate array of the whole vocabulary (what `llama_sampler_sample`
//! builds each token) against top-k here and the chain on k candidates.
//! `sampler_cost [ITERATIONS]`, for SmolLM2's and Gemma 3's vocabulary sizes.
use std::time::Instant;

use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use rand::{Rng, SeedableRng};

fn main() {
    let iterations: u32 = std::env::args().nth(1).map_or(300, |n| n.parse().expect("iterations"));
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for vocab in [49_152usize, 262_144] {
        // Logits shaped like a model's: most low, a few high.
        let logits: Vec<f32> =
            (0..vocab).map(|_| rng.random::<f32>() * 4.0 + if rng.random::<f32>() < 0.001 { 12.0 } else { 0.0 }).collect();
        let chain = |top_k: bool| {
            let mut v = Vec::new();
            if top_k {
                v.push(LlamaSampler::top_k(40));
            }
            v.extend([LlamaSampler::top_p(0.95, 1), LlamaSampler::min_p(0.05, 1), LlamaSampler::temp(0.7), LlamaSampler::dist(1)]);
            LlamaSampler::chain_simple(v)
        };
        let mut full = chain(true);
        let started = Instant::now();
        for _ in 0..iterations {
            let data = logits.iter().enumerate().map(|(i, &l)| LlamaTokenData::new(LlamaToken(i as i32), l, 0.0)).collect();
            let mut a = LlamaTokenDataArray::new(data, false);
            a.apply_sampler(&mut full);
            std::hint::black_box(a.selected_token());
        }
        let whole = started.elapsed().as_secs_f64() * 1e6 / f64::from(iterations);
        let mut rest = chain(false);
        let started = Instant::now();
        for _ in 0..iterations {
            let mut a = LlamaTokenDataArray::new(revis_engine::sample::top_k_of(&logits, 40), true);
            a.apply_sampler(&mut rest);
            std::hint::black_box(a.selected_token());
        }
        let here = started.elapsed().as_secs_f64() * 1e6 / f64::from(iterations);
        let started = Instant::now();
        for _ in 0..iterations {
            std::hint::black_box(revis_engine::sample::argmax(std::hint::black_box(&logits)));
        }
        let argmax = started.elapsed().as_secs_f64() * 1e6 / f64::from(iterations);
        println!(
            "vocabulary {vocab}: whole-vocabulary chain {whole:.0} us, top-k here then the chain {here:.0} us, greedy argmax {argmax:.0} us a token"
        );
    }
}
