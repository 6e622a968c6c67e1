//! End-to-end tests: a real `revisd` process serving the real SmolLM2 model
//! (and Gemma 3 where a second tokenizer matters) over a real Unix socket.

mod admin;
mod admin_cli;
mod agents;
mod bad_input;
mod batch;
mod cache;
mod chat;
mod cli;
mod discovery;
mod dispatch;
mod embed;
mod ensemble;
mod ensemble_cli;
mod fuzz;
mod generate;
mod hardening;
mod http_api;
mod impersonation;
mod lan;
mod logprobs;
mod orchestrator;
mod process;
mod server_mode;
mod service;
mod speculation;
mod split;
mod third_party;
mod threads;
mod tools;

use revis_client::Client;
use revis_client::wire::{message, v1 as pb};

pub fn user(text: &str) -> pb::ChatMessage {
    message(pb::Role::User, text)
}

pub fn system(text: &str) -> pb::ChatMessage {
    message(pb::Role::System, text)
}

pub fn greedy() -> Option<pb::Sampling> {
    Some(pb::Sampling { temperature: Some(0.0), ..Default::default() })
}

pub fn ask(text: &str) -> pb::GenerateRequest {
    pb::GenerateRequest { messages: vec![user(text)], sampling: greedy(), max_tokens: 48, ..Default::default() }
}

/// A greedy request whose answer runs to `max_tokens` whatever the model:
/// JSON the schema makes far longer than `max_tokens` tokens can hold (an
/// array of `max_tokens / 2` strings of at least 64 characters, and a token
/// of natural text averages well under 16 of them), so the model cannot end
/// it early. For tests that need an answer still running. (llama.cpp's
/// grammars refuse a repetition of over 2000, hence no one long string.)
pub fn long_answer(max_tokens: u32) -> pb::GenerateRequest {
    let schema = serde_json::json!({
        "type": "array",
        "items": { "type": "string", "minLength": 64 },
        "minItems": max_tokens.div_ceil(2),
    });
    pb::GenerateRequest {
        format: pb::OutputFormat::Json as i32,
        json_schema: schema.to_string().into_bytes().into(),
        max_tokens,
        ..ask("Write a long story about a lighthouse, as a JSON array of its sentences.")
    }
}

/// `len` characters from the middle of a greedy answer: a stop string the
/// same request is sure to meet, whatever the model said.
pub fn stop_from(answer: &str, len: usize) -> String {
    let chars: Vec<char> = answer.chars().collect();
    assert!(chars.len() >= 2 * len, "an answer long enough to cut a {len}-character stop string from: {answer:?}");
    chars[chars.len() / 2..chars.len() / 2 + len].iter().collect()
}

/// What one Generate streamed.
#[derive(Debug)]
pub struct Answer {
    pub started: pb::Started,
    pub deltas: Vec<pb::Delta>,
    pub done: pb::Done,
}

pub async fn generate(client: &mut Client, req: pb::GenerateRequest) -> Result<Answer, tonic::Status> {
    let mut stream = client.wire().inference.generate(req).await?.into_inner();
    let mut started = None;
    let mut deltas = Vec::new();
    while let Some(ev) = stream.message().await? {
        match ev.event.expect("an event") {
            pb::generate_event::Event::Started(s) => started = Some(s),
            pb::generate_event::Event::Delta(d) => deltas.push(d),
            pb::generate_event::Event::Done(done) => {
                assert!(stream.message().await?.is_none(), "nothing after Done");
                return Ok(Answer { started: started.expect("Started comes first"), deltas, done });
            }
        }
    }
    panic!("stream ended without Done")
}
