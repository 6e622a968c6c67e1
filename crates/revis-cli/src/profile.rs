//! `revis profile`: what revis has learned about the person, with where
//! and when they said it; facts forgotten, or told directly.

use std::process::ExitCode;

use anyhow::{Context, bail};
use revis_client::Paths;

use crate::cli::ProfileCmd;

pub(crate) fn profile(paths: &Paths, cmd: Option<ProfileCmd>) -> anyhow::Result<ExitCode> {
    use revis_orchestrator::conversation::{Told, provenance, tell};
    let store = crate::session::open_store(paths)?;
    match cmd {
        None => {
            let facts = store.facts()?;
            if facts.is_empty() {
                println!("revis has not learned anything about you yet (`revis profile add \"...\"` tells it)");
            }
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
            for f in facts {
                println!("{:>4}  {}", f.id, f.text);
                println!("      {}", provenance(&f, now));
            }
        }
        Some(ProfileCmd::Forget { all: true, .. }) => {
            let facts = store.facts()?;
            for f in &facts {
                store.remove_fact(f.id)?;
            }
            println!("forgot {} facts", facts.len());
        }
        Some(ProfileCmd::Forget { id, .. }) => {
            let id = revis_store::FactId(id.context("name the fact to forget (its number in `revis profile`), or --all")?);
            if !store.remove_fact(id)? {
                bail!("there is no fact {id}; `revis profile` lists them");
            }
            println!("forgot fact {id}");
        }
        Some(ProfileCmd::Add { fact }) => match tell(&store, &fact)? {
            Told::Added(id, text) => println!("{id:>4}  {text}"),
            Told::Known(id) => println!("revis knows that already (fact {id})"),
        },
    }
    Ok(ExitCode::SUCCESS)
}
