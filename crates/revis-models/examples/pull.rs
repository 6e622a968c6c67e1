//! Pulls one model for real: `cargo run --release -p revis-models --example pull -- [NAME | hf:OWNER/REPO[:QUANT]] [MODELS_DIR]`.

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
    let model = match revis_models::ModelRef::parse_known(&name) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    match model.pull(&dir, &revis_models::PullOptions::default()) {
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
