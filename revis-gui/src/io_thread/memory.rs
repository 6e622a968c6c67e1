//! The Memory view's work on the profile: read the facts, forget one or
//! all, edit one (it becomes what the person told revis), tell revis a new
//! one. Each change is a store write off the runtime, then the facts are
//! read again and sent with what the change did, or why it was refused.

use revis_orchestrator::conversation::{ChatError, Told, tell};
use revis_store::Store;

use super::Io;
use crate::protocol::{Event, MemoryCommand};

impl Io {
    pub(super) async fn memory(&self, cmd: MemoryCommand) {
        let Some(store) = self.store.clone() else { return self.sink.error("reading the profile", "the database is not open yet") };
        let sink = self.sink.clone();
        let r = tokio::task::spawn_blocking(move || {
            let note = change(&store, cmd);
            store.facts().map(|facts| (facts, note))
        })
        .await;
        match r {
            Ok(Ok((facts, note))) => sink.send(Event::Facts { facts, note }),
            Ok(Err(e)) => sink.error("reading the profile", e.to_string()),
            Err(e) => sink.error("reading the profile", e.to_string()),
        }
    }
}

/// Does `cmd` (blocks); what it did, in words, or why not (None: it changed nothing).
fn change(store: &Store, cmd: MemoryCommand) -> Option<Result<String, String>> {
    let words = |e: ChatError| e.to_string();
    match cmd {
        MemoryCommand::List => None,
        MemoryCommand::Forget(id) => Some(match store.remove_fact(id) {
            Ok(true) => Ok(format!("Forgot fact {id}.")),
            Ok(false) => Err(format!("There is no fact {id} any more.")),
            Err(e) => Err(e.to_string()),
        }),
        MemoryCommand::ForgetAll => Some(store.facts().map_err(|e| e.to_string()).and_then(|facts| {
            for f in &facts {
                store.remove_fact(f.id).map_err(|e| e.to_string())?;
            }
            Ok(format!("Forgot {} facts.", facts.len()))
        })),
        MemoryCommand::Add(text) => Some(match tell(store, &text).map_err(words) {
            Ok(Told::Added(id, _)) => Ok(format!("Added fact {id}.")),
            Ok(Told::Known(id)) => Ok(format!("revis knows that already (fact {id}).")),
            Err(e) => Err(e),
        }),
        // The new words are checked before the old fact goes: a refusal changes nothing.
        MemoryCommand::Edit { id, text } => Some(match tell(store, &text).map_err(words) {
            Ok(Told::Added(new, _)) => store.remove_fact(id).map(|_| format!("Fact {id} is now fact {new}.")).map_err(|e| e.to_string()),
            Ok(Told::Known(same)) if same == id => Ok("Nothing changed.".into()),
            Ok(Told::Known(same)) => {
                store.remove_fact(id).map(|_| format!("Fact {id} said what fact {same} says; it is gone.")).map_err(|e| e.to_string())
            }
            Err(e) => Err(e),
        }),
    }
}
