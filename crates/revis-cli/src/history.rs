//! `revis history`: the conversations kept, and one shown whole.

use std::process::ExitCode;

use anyhow::bail;
use revis_client::Paths;
use revis_store::{ConversationId, MessageState, Role};

use crate::cli::HistoryCmd;

pub(crate) fn history(paths: &Paths, show: Option<HistoryCmd>) -> anyhow::Result<ExitCode> {
    let store = crate::session::open_store(paths)?;
    match show {
        None => {
            let list = store.conversations()?;
            if list.is_empty() {
                println!("no conversations yet: `revis chat` starts one");
            }
            for c in list {
                println!("{:>4}  {:>3} messages  {}", c.id, c.message_count, if c.title.is_empty() { "(untitled)" } else { &c.title });
            }
        }
        Some(HistoryCmd::Show { id }) => {
            let id = ConversationId(id);
            let Some(c) = store.conversation(id)? else { bail!("there is no conversation {id}; `revis history` lists them") };
            println!("conversation {}: {}", c.id, c.title);
            if let Some(s) = store.summary(id)? {
                println!("[summary up to message {}] {}", s.covers_up_to, s.text);
            }
            for m in store.messages(id)? {
                let who = if m.role == Role::User { "you" } else { "revis" };
                let flag = if m.state == MessageState::Incomplete { " [incomplete: cut off before it ended]" } else { "" };
                println!("{who}{flag}: {}", m.text);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
