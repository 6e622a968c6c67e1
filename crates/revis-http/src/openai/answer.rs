//! The chat and legacy completion routes: one request's choices started,
//! then answered whole or streamed as OpenAI's chunks.

use async_openai::types::chat::{
    ChatChoice, ChatChoiceStream, ChatCompletionResponseMessage, ChatCompletionStreamResponseDelta, CompletionUsage,
    CreateChatCompletionRequest, CreateChatCompletionResponse, CreateChatCompletionStreamResponse, FinishReason, Role,
};
use async_openai::types::chat::{ChatChoiceLogprobs, Choice};
use async_openai::types::completions::{CreateCompletionRequest, CreateCompletionResponse};
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use revis_client::{Done, GenerateParams, Runner};

use super::FLAVOR;
use super::convert::{chat_params, choices, completion_params};
use super::write::{
    chat_logprobs, completion_finish, completion_logprobs, finish_reason, json_response, sse, tool_call_chunks, tool_calls, usage_of,
};
use crate::app::{AppState, resolve};
use crate::error::ApiError;
use crate::generation::{Generation, Piece};
use crate::reply::{new_id, sse_body, unix_now};
use crate::request;

pub(crate) async fn chat<R: Runner>(State(app): State<AppState<R>>, body: Body) -> Response {
    chat_response(app, body).await.unwrap_or_else(IntoResponse::into_response)
}

async fn chat_response<R: Runner>(app: AppState<R>, body: Body) -> Result<Response, ApiError> {
    let req: CreateChatCompletionRequest = request::json(FLAVOR, body, app.opts.limits.max_body_bytes).await?;
    let params = chat_params(&req)?;
    let n = choices(req.n)?;
    let entry = resolve(&app, &req.model, FLAVOR).await?;
    let mut generations = start_choices(&app, &entry, params, n)?;
    let (id, created, model) = (new_id("chatcmpl"), unix_now(), req.model.clone());
    if req.stream != Some(true) {
        let mut choices = Vec::with_capacity(n);
        let mut dones = Vec::with_capacity(n);
        for (i, generation) in generations.into_iter().enumerate() {
            let done = generation.finish().await.map_err(|e| ApiError::from_call(FLAVOR, &e))?;
            #[allow(deprecated)] // function_call: deprecated, left out
            let message = ChatCompletionResponseMessage {
                // OpenAI's: no content beside calls when the model wrote none.
                content: (done.tool_calls.is_empty() || !done.text.is_empty()).then(|| done.text.clone()),
                tool_calls: tool_calls(&done),
                role: Role::Assistant,
                ..Default::default()
            };
            let (finish, logprobs) = (Some(finish_reason(&done)), chat_logprobs(&done));
            choices.push(ChatChoice { index: i as u32, message, finish_reason: finish, logprobs });
            dones.push(done);
        }
        return Ok(json_response(&CreateChatCompletionResponse {
            id,
            object: "chat.completion".into(),
            created,
            model,
            choices,
            usage: Some(usage_of(&dones)),
            ..Default::default()
        }));
    }
    let include_usage = req.stream_options.as_ref().and_then(|o| o.include_usage) == Some(true);
    let started = firsts(&mut generations).await?;
    let chunk = move |index: usize,
                      delta: ChatCompletionStreamResponseDelta,
                      finish: Option<FinishReason>,
                      usage: Option<CompletionUsage>,
                      logprobs: Option<ChatChoiceLogprobs>| {
        let choices = match usage {
            Some(_) => Vec::new(),
            None => vec![ChatChoiceStream { index: index as u32, delta, finish_reason: finish, logprobs }],
        };
        sse(&CreateChatCompletionStreamResponse {
            id: id.clone(),
            object: "chat.completion.chunk".into(),
            created,
            model: model.clone(),
            choices,
            usage,
            ..Default::default()
        })
    };
    let mut ends = Ends::new(n);
    let encode = move |p: Option<(usize, Piece)>| {
        let Some((i, p)) = p else {
            return ends.last(|u| if include_usage { chunk(0, Default::default(), None, Some(u), None) } else { Vec::new() });
        };
        if matches!(p, Piece::Wait) {
            return crate::generation::SSE_WAIT.to_vec();
        }
        let mut out = Vec::new();
        if ends.first(i) {
            let role =
                ChatCompletionStreamResponseDelta { role: Some(Role::Assistant), content: Some(String::new()), ..Default::default() };
            out = chunk(i, role, None, None, None);
        }
        match p {
            Piece::Text(t) => {
                out.extend(chunk(i, ChatCompletionStreamResponseDelta { content: Some(t), ..Default::default() }, None, None, None))
            }
            Piece::Wait => {}
            Piece::End(r) => out.extend(ends.end(r, |d| {
                let mut last = Vec::new();
                for call in tool_call_chunks(d) {
                    let delta = ChatCompletionStreamResponseDelta { tool_calls: Some(vec![call]), ..Default::default() };
                    last.extend(chunk(i, delta, None, None, None));
                }
                // The answer's log-probabilities come whole with its last chunk.
                last.extend(chunk(i, Default::default(), Some(finish_reason(d)), None, chat_logprobs(d)));
                last
            })),
        }
        out
    };
    Ok(sse_body(Generation::bodies(started, encode)))
}

/// Starts `n` answers of `params`, each with a place of its own (a 429 when
/// there are not that many); a seed given is the first choice's, the next
/// ones take the seeds after it.
fn start_choices<R: Runner>(
    app: &AppState<R>,
    entry: &crate::models::Entry,
    params: GenerateParams,
    n: usize,
) -> Result<Vec<Generation>, ApiError> {
    let places = (0..n).map(|_| app.generation_place(FLAVOR)).collect::<Result<Vec<_>, _>>()?;
    places
        .into_iter()
        .enumerate()
        .map(|(i, place)| {
            let mut p = params.clone();
            p.sampling.seed = p.sampling.seed.map(|s| s.wrapping_add(i as u64));
            app.start(FLAVOR, entry, p, place)
        })
        .collect()
}

/// Each answer's first piece: a failure before any text is the response's status.
async fn firsts(generations: &mut Vec<Generation>) -> Result<Vec<(Piece, Generation)>, ApiError> {
    let mut started = Vec::with_capacity(generations.len());
    for mut g in generations.drain(..) {
        let first = g.first_or_wait().await.map_err(|e| ApiError::from_call(FLAVOR, &e))?;
        started.push((first, g));
    }
    Ok(started)
}

/// A stream of several answers: which have started and ended, what they
/// used, and whether one failed (then nothing follows its error event, and
/// no `[DONE]`).
struct Ends {
    started: Vec<bool>,
    dones: Vec<Done>,
    failed: bool,
}

impl Ends {
    fn new(n: usize) -> Ends {
        Ends { started: vec![false; n], dones: Vec::with_capacity(n), failed: false }
    }

    /// Whether this is answer `i`'s first piece.
    fn first(&mut self, i: usize) -> bool {
        !std::mem::replace(&mut self.started[i], true)
    }

    /// An answer's end: its last chunks (`last`), or the error event.
    fn end(&mut self, r: Result<Done, revis_client::CallError>, last: impl FnOnce(&Done) -> Vec<u8>) -> Vec<u8> {
        if self.failed {
            return Vec::new();
        }
        match r {
            Ok(done) => {
                let out = last(&done);
                self.dones.push(done);
                out
            }
            Err(e) => {
                self.failed = true;
                sse(&ApiError::from_call(FLAVOR, &e).body())
            }
        }
    }

    /// After every answer ended: the usage chunk (`usage`, given the
    /// answers' usage) and `[DONE]`, unless one failed.
    fn last(&mut self, usage_chunk: impl FnOnce(CompletionUsage) -> Vec<u8>) -> Vec<u8> {
        if self.failed || self.dones.is_empty() {
            return Vec::new();
        }
        let mut out = usage_chunk(usage_of(&self.dones));
        out.extend_from_slice(b"data: [DONE]\n\n");
        out
    }
}

pub(crate) async fn completions<R: Runner>(State(app): State<AppState<R>>, body: Body) -> Response {
    completion_response(app, body).await.unwrap_or_else(IntoResponse::into_response)
}

async fn completion_response<R: Runner>(app: AppState<R>, body: Body) -> Result<Response, ApiError> {
    let req: CreateCompletionRequest = request::json(FLAVOR, body, app.opts.limits.max_body_bytes).await?;
    let params = completion_params(&req)?;
    let n = choices(req.n)?;
    let entry = resolve(&app, &req.model, FLAVOR).await?;
    let mut generations = start_choices(&app, &entry, params, n)?;
    let (id, created, model) = (new_id("cmpl"), unix_now(), req.model.clone());
    let response = move |choices: Vec<Choice>, usage: Option<CompletionUsage>| CreateCompletionResponse {
        id: id.clone(),
        object: "text_completion".into(),
        created,
        model: model.clone(),
        choices,
        usage,
        ..Default::default()
    };
    let choice = |index: usize, text: String, d: Option<&Done>| Choice {
        text,
        index: index as u32,
        logprobs: d.and_then(completion_logprobs),
        finish_reason: d.map(completion_finish),
    };
    if req.stream != Some(true) {
        let mut choices = Vec::with_capacity(n);
        let mut dones = Vec::with_capacity(n);
        for (i, generation) in generations.into_iter().enumerate() {
            let done = generation.finish().await.map_err(|e| ApiError::from_call(FLAVOR, &e))?;
            choices.push(choice(i, done.text.clone(), Some(&done)));
            dones.push(done);
        }
        return Ok(json_response(&response(choices, Some(usage_of(&dones)))));
    }
    let include_usage = req.stream_options.as_ref().and_then(|o| o.include_usage) == Some(true);
    let started = firsts(&mut generations).await?;
    let mut ends = Ends::new(n);
    let encode = move |p: Option<(usize, Piece)>| match p {
        None => ends.last(|u| if include_usage { sse(&response(Vec::new(), Some(u))) } else { Vec::new() }),
        Some((_, Piece::Wait)) => crate::generation::SSE_WAIT.to_vec(),
        Some((i, Piece::Text(t))) => sse(&response(vec![choice(i, t, None)], None)),
        Some((i, Piece::End(r))) => ends.end(r, |d| sse(&response(vec![choice(i, String::new(), Some(d))], None))),
    };
    Ok(sse_body(Generation::bodies(started, encode)))
}
