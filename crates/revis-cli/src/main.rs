//! `revis`: the command line over the client library (pull, models, status,
//! load/unload, run, chat, and other machines: nodes, pair, unpair, --node).

mod chat;
mod cli;
mod commands;
mod detach;
mod ensemble;
mod history;
mod input;
mod models;
mod nodes;
mod profile;
mod run;
mod serve;
mod session;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Cmd};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `revis serve` says a line a request (what an agent asked, and how it went).
    let default = if matches!(cli.command, Cmd::Serve(_)) { "warn,revis_http=info" } else { "warn" };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("REVIS_LOG").unwrap_or_else(|_| default.into()))
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file or the journal gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if matches!(cli.command, Cmd::Chat(_)) && std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        // SAFETY: no thread has started yet (the runtime below starts them).
        unsafe { detach::split() };
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime");
    match runtime.block_on(commands::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("revis: {e:#}");
            ExitCode::FAILURE
        }
    }
}
