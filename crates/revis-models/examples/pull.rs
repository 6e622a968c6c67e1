//! Pulls one catalog model for real: `cargo run --release -p revis-models --example pull -- [NAME] [MODELS_DIR]`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

fn main() -> ExitCode {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| revis_models::DEFAULT_MODEL.to_owned());
    let dir = match args.next().map(PathBuf::from).map_or_else(revis_models::models_dir, Ok) {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(entry) = revis_models::find(&name) else {
        let known: Vec<_> = revis_models::catalog().iter().map(|e| e.name).collect();
        eprintln!("unknown model {name:?}; known: {}", known.join(", "));
        return ExitCode::from(2);
    };
    let started = Instant::now();
    match revis_models::pull(entry, &dir, &revis_models::PullOptions::default()) {
        Ok(path) => {
            println!("{} in {:.1?}", path.display(), started.elapsed());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
