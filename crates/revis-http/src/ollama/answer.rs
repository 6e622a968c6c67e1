//! The chat and generate routes: an answer whole, or streamed as NDJSON
//! lines, the last with the counts, the durations and the calls.

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use revis_client::{Done, GenerateParams, Runner};
use serde_json::{Value, json};

use super::convert::{ChatRequest, GenerateRequest, OllamaFunctionCall, OllamaToolCall, chat_params, generate_params};
use super::{FLAVOR, catalog, json_response, ndjson_line, not_found, now};
use crate::app::AppState;
use crate::edge;
use crate::error::ApiError;
use crate::generation::Piece;
use crate::request;

/// The calls an answer made, as Ollama writes them (arguments as an object).
pub(crate) fn tool_calls(d: &Done) -> Vec<OllamaToolCall> {
    d.tool_calls
        .iter()
        .map(|c| OllamaToolCall { function: OllamaFunctionCall { name: c.name.clone(), arguments: edge::arguments_json(&c.arguments) } })
        .collect()
}

/// An answer's log-probabilities as Ollama writes them (the token that ends
/// the turn, which has no text, left out).
fn logprobs_json(d: &Done) -> Value {
    let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    d.logprobs
        .iter()
        .filter(|t| !t.piece.is_empty())
        .map(|t| {
            let top: Vec<Value> = t.top.iter().map(|a| json!({"token": lossy(&a.piece), "logprob": a.logprob, "bytes": a.piece})).collect();
            json!({"token": lossy(&t.piece), "logprob": t.logprob, "bytes": t.piece, "top_logprobs": top})
        })
        .collect()
}

/// The counts and durations of a finished answer, and its calls.
fn finished(v: &mut Value, d: &Done, total_ns: u64) {
    if !d.tool_calls.is_empty()
        && let Some(message) = v.get_mut("message").and_then(Value::as_object_mut)
    {
        message.insert("tool_calls".into(), json!(tool_calls(d)));
    }
    if !d.logprobs.is_empty()
        && let Some(o) = v.as_object_mut()
    {
        o.insert("logprobs".into(), logprobs_json(d));
    }
    let extra = json!({
        "done": true,
        "done_reason": if d.finish_reason == revis_client::FinishReason::Length { "length" } else { "stop" },
        "total_duration": total_ns,
        "load_duration": 0,
        "prompt_eval_count": d.prompt_tokens,
        "prompt_eval_duration": d.prompt_us * 1000,
        "eval_count": d.generated_tokens,
        "eval_duration": d.generate_us * 1000,
    });
    if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
        o.extend(e);
    }
}

/// How a line of each endpoint holds text.
#[derive(Clone, Copy)]
enum Kind {
    Chat,
    Generate,
}

impl Kind {
    fn line(self, model: &str, text: &str) -> Value {
        match self {
            Kind::Chat => json!({"model": model, "created_at": now(), "message": {"role": "assistant", "content": text}, "done": false}),
            Kind::Generate => json!({"model": model, "created_at": now(), "response": text, "done": false}),
        }
    }
}

async fn answer<R: Runner>(
    app: AppState<R>,
    model: String,
    params: GenerateParams,
    stream: bool,
    kind: Kind,
) -> Result<Response, ApiError> {
    let catalog = catalog(&app).await?;
    let entry = catalog.find(&model).ok_or_else(|| not_found(&model))?.clone();
    let place = app.generation_place(FLAVOR)?;
    let mut generation = app.start(FLAVOR, &entry, params, place)?;
    let started = generation.started;
    if !stream {
        let done = generation.finish().await.map_err(|e| ApiError::from_call(FLAVOR, &e))?;
        let mut v = kind.line(&model, &done.text);
        finished(&mut v, &done, started.elapsed().as_nanos() as u64);
        return Ok(json_response(&v));
    }
    let first = generation.first_or_wait().await.map_err(|e| ApiError::from_call(FLAVOR, &e))?;
    let encode = move |p: Piece| match p {
        // NDJSON has no comment: the headers are what says "still there".
        Piece::Wait => Vec::new(),
        Piece::Text(t) => ndjson_line(&kind.line(&model, &t)),
        Piece::End(Ok(d)) => {
            let mut v = kind.line(&model, "");
            finished(&mut v, &d, started.elapsed().as_nanos() as u64);
            ndjson_line(&v)
        }
        Piece::End(Err(e)) => ndjson_line(&ApiError::from_call(FLAVOR, &e).body()),
    };
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], generation.body(first, encode)).into_response())
}

pub(crate) async fn chat<R: Runner>(State(app): State<AppState<R>>, body: Body) -> Response {
    let r = async {
        let req: ChatRequest = request::json(FLAVOR, body, app.opts.limits.max_body_bytes).await?;
        let params = chat_params(&req)?;
        answer(app.clone(), req.model, params, req.stream != Some(false), Kind::Chat).await
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
}

pub(crate) async fn generate<R: Runner>(State(app): State<AppState<R>>, body: Body) -> Response {
    let r = async {
        let req: GenerateRequest = request::json(FLAVOR, body, app.opts.limits.max_body_bytes).await?;
        if req.prompt.is_empty() && req.system.as_deref().unwrap_or_default().is_empty() {
            // Ollama's "load the model": revis's daemon loads a tier's model on first use.
            let c = catalog(&app).await?;
            c.find(&req.model).ok_or_else(|| not_found(&req.model))?;
            return Ok(json_response(
                &json!({"model": req.model, "created_at": now(), "response": "", "done": true, "done_reason": "load"}),
            ));
        }
        let params = generate_params(&req)?;
        answer(app.clone(), req.model, params, req.stream != Some(false), Kind::Generate).await
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use revis_client::Role;

    #[test]
    fn tools_and_calls_carry_over_and_calls_come_back_as_objects() {
        let req: ChatRequest = serde_json::from_value(json!({
            "model": "m",
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "content": "18 C", "tool_name": "get_weather"}
            ],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
        }))
        .unwrap();
        let p = chat_params(&req).unwrap();
        assert_eq!((p.tools.len(), p.tools[0].parameters.as_str()), (1, r#"{"type":"object"}"#));
        assert_eq!(
            (p.messages[1].tool_calls[0].name.as_str(), p.messages[1].tool_calls[0].arguments.as_str()),
            ("get_weather", r#"{"city":"Paris"}"#)
        );
        assert_eq!((p.messages[2].role, p.messages[2].name.as_str()), (Role::Tool, "get_weather"));
        let d = Done {
            finish_reason: revis_client::FinishReason::ToolCalls,
            tool_calls: vec![revis_client::ToolCall { id: "x".into(), name: "get_weather".into(), arguments: r#"{"city":"Oslo"}"#.into() }],
            ..Default::default()
        };
        let mut v = Kind::Chat.line("tier2", "");
        finished(&mut v, &d, 1);
        assert_eq!(v["message"]["tool_calls"], json!([{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]));
        assert_eq!(v["done_reason"], json!("stop"));
    }

    #[test]
    fn the_last_line_has_counts_and_nanoseconds() {
        let d = Done { prompt_tokens: 10, generated_tokens: 4, prompt_us: 1500, generate_us: 2000, ..Default::default() };
        let mut v = Kind::Generate.line("tier2", "");
        finished(&mut v, &d, 9_000_000);
        assert_eq!(
            (
                &v["done"],
                &v["done_reason"],
                &v["prompt_eval_count"],
                &v["eval_count"],
                &v["prompt_eval_duration"],
                &v["eval_duration"],
                &v["total_duration"]
            ),
            (&json!(true), &json!("stop"), &json!(10), &json!(4), &json!(1_500_000), &json!(2_000_000), &json!(9_000_000))
        );
    }
}
