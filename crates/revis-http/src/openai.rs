//! OpenAI's API (`/v1`): models, chat completions, completions; request and
//! response types from `async-openai`.
//!
//! A chat request becomes one [`GenerateParams`](revis_client::GenerateParams): `system` and `developer`
//! messages are system messages; `max_completion_tokens` (or the older
//! `max_tokens`), `temperature`, `top_p`, `seed` and `stop` carry over;
//! `response_format` `json_object` is JSON, `json_schema` JSON held to its
//! schema by the daemon's grammar. `tools` (functions), `tool_choice`
//! (`none`, `auto`, `required`, one named function) and
//! `parallel_tool_calls` carry over, as do assistant messages' `tool_calls`
//! and `tool` messages; the answer's calls come as `message.tool_calls`
//! with `finish_reason: "tool_calls"` (streamed as OpenAI does: a chunk
//! with each call's index, ID and name, then one with its arguments, before
//! the last chunk). What revis cannot do is
//! refused with a 400 naming the field: more than 8 choices (`n`), custom
//! tools and the deprecated `functions`, non-text content, penalties
//! outside -2 to 2. `logprobs` and `top_logprobs` (at most 20) come as
//! OpenAI writes them (streamed: whole, with the last chunk); the legacy
//! completions' `logprobs` in that API's older shape.
//!
//! A legacy completion's `prompt` is sent as one user message (revis's
//! engine always applies the model's chat template).
//!
//! Embeddings take a string or strings (not token arrays, nor
//! `dimensions`) and answer floats, or base64 (little-endian f32) when
//! `encoding_format` says so, as OpenAI's own Python package asks.
//!
//! Streaming (`stream: true`): the status waits for the answer's first text
//! (so a refused request still gets its 4xx); then `data:` chunks, the first
//! with the assistant's role, each with `choices[0].delta.content`, a last
//! one with `finish_reason`, with `stream_options.include_usage` a chunk
//! with no choices and the usage, and `data: [DONE]`. A failure after text
//! was sent is a `data: {"error": ...}` event, and no `[DONE]`.

mod answer;
mod convert;
mod models;
mod write;

use crate::error::Flavor;

pub(crate) use answer::{chat, completions};
pub(crate) use models::{embeddings, model, models};
#[cfg(test)]
pub(crate) use {convert::chat_params, write::tool_calls};

const FLAVOR: Flavor = Flavor::OpenAi;
