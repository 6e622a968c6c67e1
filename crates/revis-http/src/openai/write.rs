//! The pieces of OpenAI's replies in its types: log-probabilities, finish
//! reasons, tool calls (whole and as streamed), usage, and the JSON and
//! SSE bodies they are written in.

use async_openai::types::chat::{ChatChoiceLogprobs, ChatCompletionTokenLogprob, CompletionFinishReason, Logprobs, TopLogprobs};
use async_openai::types::chat::{
    ChatCompletionMessageToolCall, ChatCompletionMessageToolCallChunk, ChatCompletionMessageToolCalls, FunctionCall, FunctionCallStream,
    FunctionType,
};
use async_openai::types::chat::{CompletionUsage, FinishReason, PromptTokensDetails};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use revis_client::Done;

pub(super) fn json_response<T: serde::Serialize>(v: &T) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], serde_json::to_string(v).unwrap_or_default()).into_response()
}

/// The tokens an answer's log-probabilities speak of: those with text (the
/// token that ends the turn has none, and OpenAI lists no such token).
fn spoken(d: &Done) -> impl Iterator<Item = &revis_client::TokenLogprob> {
    d.logprobs.iter().filter(|t| !t.piece.is_empty())
}

/// A chat answer's log-probabilities, when they were asked.
pub(super) fn chat_logprobs(d: &Done) -> Option<ChatChoiceLogprobs> {
    let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (!d.logprobs.is_empty()).then(|| ChatChoiceLogprobs {
        content: Some(
            spoken(d)
                .map(|t| ChatCompletionTokenLogprob {
                    token: lossy(&t.piece),
                    logprob: t.logprob as f32,
                    bytes: Some(t.piece.clone()),
                    top_logprobs: t
                        .top
                        .iter()
                        .map(|a| TopLogprobs { token: lossy(&a.piece), logprob: a.logprob as f32, bytes: Some(a.piece.clone()) })
                        .collect(),
                })
                .collect(),
        ),
        refusal: None,
    })
}

/// A legacy completion's log-probabilities, in that API's older shape.
pub(super) fn completion_logprobs(d: &Done) -> Option<Logprobs> {
    let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    if d.logprobs.is_empty() {
        return None;
    }
    let mut offset = 0u32;
    let (mut tokens, mut token_logprobs, mut top_logprobs, mut text_offset) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for t in spoken(d) {
        tokens.push(lossy(&t.piece));
        token_logprobs.push(Some(t.logprob as f32));
        let top: serde_json::Map<String, serde_json::Value> =
            t.top.iter().map(|a| (lossy(&a.piece), serde_json::json!(a.logprob as f32))).collect();
        top_logprobs.push(serde_json::Value::Object(top));
        text_offset.push(offset);
        offset += t.piece.len() as u32;
    }
    Some(Logprobs { tokens, token_logprobs, top_logprobs, text_offset })
}

pub(super) fn finish_reason(d: &Done) -> FinishReason {
    match d.finish_reason {
        revis_client::FinishReason::Length => FinishReason::Length,
        revis_client::FinishReason::End | revis_client::FinishReason::Stop => FinishReason::Stop,
        revis_client::FinishReason::ToolCalls => FinishReason::ToolCalls,
    }
}

/// The calls an answer made, as a message carries them.
pub(crate) fn tool_calls(d: &Done) -> Option<Vec<ChatCompletionMessageToolCalls>> {
    (!d.tool_calls.is_empty()).then(|| {
        d.tool_calls
            .iter()
            .map(|c| {
                ChatCompletionMessageToolCalls::Function(ChatCompletionMessageToolCall {
                    id: c.id.clone(),
                    function: FunctionCall { name: c.name.clone(), arguments: c.arguments.clone() },
                })
            })
            .collect()
    })
}

/// The calls an answer made, as OpenAI streams them: for each, a delta
/// with its index, ID, type and name (arguments empty), then one with its
/// arguments.
pub(super) fn tool_call_chunks(d: &Done) -> Vec<ChatCompletionMessageToolCallChunk> {
    d.tool_calls
        .iter()
        .enumerate()
        .flat_map(|(i, c)| {
            let named = ChatCompletionMessageToolCallChunk {
                index: i as u32,
                id: Some(c.id.clone()),
                r#type: Some(FunctionType::Function),
                function: Some(FunctionCallStream { name: Some(c.name.clone()), arguments: Some(String::new()) }),
            };
            let arguments = ChatCompletionMessageToolCallChunk {
                index: i as u32,
                function: Some(FunctionCallStream { name: None, arguments: Some(c.arguments.clone()) }),
                ..Default::default()
            };
            [named, arguments]
        })
        .collect()
}

fn usage(d: &Done) -> CompletionUsage {
    CompletionUsage {
        prompt_tokens: d.prompt_tokens,
        completion_tokens: d.generated_tokens,
        total_tokens: d.prompt_tokens + d.generated_tokens,
        prompt_tokens_details: Some(PromptTokensDetails { cached_tokens: Some(d.cached_tokens), ..Default::default() }),
        completion_tokens_details: None,
    }
}

pub(super) fn sse(v: &impl serde::Serialize) -> Vec<u8> {
    let mut out = b"data: ".to_vec();
    serde_json::to_writer(&mut out, v).unwrap_or_default();
    out.extend_from_slice(b"\n\n");
    out
}

/// The usage of several answers to one prompt: the prompt once, every answer's tokens.
pub(super) fn usage_of(dones: &[Done]) -> CompletionUsage {
    let mut u = usage(&dones[0]);
    u.completion_tokens = dones.iter().map(|d| d.generated_tokens).sum();
    u.total_tokens = u.prompt_tokens + u.completion_tokens;
    u
}

pub(super) fn completion_finish(d: &Done) -> CompletionFinishReason {
    match d.finish_reason {
        revis_client::FinishReason::Length => CompletionFinishReason::Length,
        revis_client::FinishReason::End | revis_client::FinishReason::Stop | revis_client::FinishReason::ToolCalls => {
            CompletionFinishReason::Stop
        }
    }
}
