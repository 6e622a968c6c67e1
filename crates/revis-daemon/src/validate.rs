//! Requests checked at the edge into `Valid*` types: the rest of the daemon
//! never sees an unchecked request. Every limit is a named constant.

use std::sync::Arc;

use revis_engine::{Message, Role, Sampling, Tool, ToolCall, ToolChoice};
use revis_proto::v1 as pb;

use revis_proto::Tier;

use crate::config::Config;
use crate::error::DaemonError;
use crate::registry::{Model, Registry};
use crate::scheduler::Priority;

/// Text in one request (all messages, prefix and continuation together).
pub const MAX_TEXT_BYTES: usize = 1 << 20;
/// tonic's own decode limit: larger than ours so ours answers first, clearly.
pub const GRPC_MAX_MESSAGE_BYTES: usize = 4 << 20;
pub const MAX_MESSAGES: usize = 1024;
pub const MAX_STOP_STRINGS: usize = 8;
pub const MAX_STOP_BYTES: usize = 64;
pub const MAX_SCHEMA_BYTES: usize = 64 << 10;
/// Functions one request may offer (`tools`).
pub const MAX_TOOLS: usize = 128;
/// A function's name: OpenAI's rule.
pub const MAX_TOOL_NAME: usize = 64;
/// All functions' names, descriptions and schemas together.
pub const MAX_TOOLS_BYTES: usize = 256 << 10;
/// Calls one earlier assistant message may carry.
pub const MAX_CALLS_PER_MESSAGE: usize = 64;
/// The sampling bounds, shared with the models' defaults (which must keep to them).
pub use revis_models::{MAX_REPEAT_LAST_N, MAX_REPEAT_PENALTY, MAX_TEMPERATURE, MAX_TOP_K};
/// OpenAI's presence and frequency penalties lie in [-this, this].
pub const MAX_PENALTY: f32 = 2.0;
/// Continuations one Score call may carry.
pub const MAX_CONTINUATIONS: usize = 16;
/// Texts one Embed call may carry.
pub const MAX_EMBED_INPUTS: usize = 64;
pub use revis_engine::MAX_EMBED_TOKENS;
pub use revis_engine::MAX_TOP_LOGPROBS;

fn invalid(msg: impl Into<String>) -> DaemonError {
    DaemonError::Invalid(msg.into())
}

pub struct ValidGenerate {
    pub tier: Tier,
    pub model: Arc<Model>,
    pub messages: Vec<Message>,
    pub static_count: usize,
    pub sampling: Sampling,
    pub max_tokens: u32,
    pub stop: Vec<String>,
    /// Some(schema) when JSON output was asked for; the schema is optional.
    pub json: Option<Option<String>>,
    pub priority: Priority,
    /// The answer so far, to continue (empty = a fresh answer).
    pub answer_prefix: String,
    /// Alternatives per token to report; None = no log-probabilities.
    pub logprobs: Option<u32>,
    /// Functions the model may call, and whether and which it must.
    pub tools: Vec<Tool>,
    pub tool_choice: ToolChoice,
    pub parallel_tool_calls: bool,
}

pub struct ValidPrefill {
    pub tier: Tier,
    pub model: Arc<Model>,
    pub messages: Vec<Message>,
    pub priority: Priority,
}

pub struct ValidScore {
    pub tier: Tier,
    pub model: Arc<Model>,
    pub messages: Vec<Message>,
    /// Messages `[0, static_count)` are the static part (with messages).
    pub static_count: usize,
    pub prefix: String,
    pub continuations: Vec<String>,
    pub top_logprobs: u32,
}

pub struct ValidEmbed {
    pub tier: Tier,
    pub model: Arc<Model>,
    pub inputs: Vec<String>,
}

pub fn embed(req: &pb::EmbedRequest, registry: &Registry) -> Result<ValidEmbed, DaemonError> {
    let (tier, model) = tier(registry, &req.tier)?;
    if req.inputs.is_empty() {
        return Err(invalid("inputs is empty; give at least one text to embed"));
    }
    if req.inputs.len() > MAX_EMBED_INPUTS {
        return Err(invalid(format!("{} inputs is over the limit of {MAX_EMBED_INPUTS} per call", req.inputs.len())));
    }
    size(req.inputs.iter().map(|t| t.len()).sum())?;
    let inputs = req
        .inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if t.is_empty() {
                return Err(invalid(format!("inputs[{i}] is empty; every input needs text to embed")));
            }
            utf8(&format!("inputs[{i}]"), t)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ValidEmbed { tier, model: model.clone(), inputs })
}

pub fn tier<'a>(registry: &'a Registry, tier: &str) -> Result<(Tier, &'a Arc<Model>), DaemonError> {
    let unknown = || invalid(format!("unknown tier {tier:?}; the tiers are tier1, tier2 and tier3"));
    let tier = Tier::from_wire(tier).map_err(|_| unknown())?;
    registry.tier(tier).map(|m| (tier, m)).ok_or_else(unknown)
}

fn utf8(field: &str, bytes: &[u8]) -> Result<String, DaemonError> {
    let s =
        std::str::from_utf8(bytes).map_err(|e| invalid(format!("{field} is not valid UTF-8 (bad byte at offset {})", e.valid_up_to())))?;
    if s.contains('\0') {
        return Err(invalid(format!("{field} contains a NUL character")));
    }
    Ok(s.to_owned())
}

fn messages(list: &[pb::ChatMessage], allow_empty_list: bool) -> Result<(Vec<Message>, usize), DaemonError> {
    if list.is_empty() && !allow_empty_list {
        return Err(invalid("messages is empty; send at least one message"));
    }
    if list.len() > MAX_MESSAGES {
        return Err(invalid(format!("{} messages is over the limit of {MAX_MESSAGES}", list.len())));
    }
    let mut total = 0;
    let mut out = Vec::with_capacity(list.len());
    let mut call_ids = std::collections::HashSet::new();
    for (i, m) in list.iter().enumerate() {
        let role = match pb::Role::try_from(m.role) {
            Ok(pb::Role::System) => Role::System,
            Ok(pb::Role::User) => Role::User,
            Ok(pb::Role::Assistant) => Role::Assistant,
            Ok(pb::Role::Tool) => Role::Tool,
            _ => return Err(invalid(format!("messages[{i}].role must be system, user, assistant or tool"))),
        };
        if !m.tool_calls.is_empty() && role != Role::Assistant {
            return Err(invalid(format!("messages[{i}] has tool_calls but only an assistant message makes calls")));
        }
        if m.content.is_empty() && m.tool_calls.is_empty() {
            return Err(invalid(format!("messages[{i}].content is empty")));
        }
        if m.tool_calls.len() > MAX_CALLS_PER_MESSAGE {
            return Err(invalid(format!("messages[{i}] has {} tool_calls; the limit is {MAX_CALLS_PER_MESSAGE}", m.tool_calls.len())));
        }
        let mut tool_calls = Vec::with_capacity(m.tool_calls.len());
        for (j, c) in m.tool_calls.iter().enumerate() {
            let field = format!("messages[{i}].tool_calls[{j}]");
            if c.name.is_empty() {
                return Err(invalid(format!("{field}.name is empty; name the function called")));
            }
            let arguments = if c.arguments.is_empty() { "{}".to_owned() } else { utf8(&format!("{field}.arguments"), &c.arguments)? };
            if serde_json::from_str::<serde_json::Value>(&arguments).is_err() {
                return Err(invalid(format!("{field}.arguments is not JSON; give the arguments as a JSON object")));
            }
            total += c.id.len() + c.name.len() + arguments.len();
            call_ids.insert(c.id.clone());
            tool_calls.push(ToolCall { id: c.id.clone(), name: c.name.clone(), arguments });
        }
        if role == Role::Tool && !m.tool_call_id.is_empty() && !call_ids.contains(&m.tool_call_id) {
            return Err(invalid(format!(
                "messages[{i}].tool_call_id is {}, but no earlier assistant message made a call with that id",
                quoted(&m.tool_call_id)
            )));
        }
        total += m.content.len() + m.tool_call_id.len() + m.name.len();
        let content = utf8(&format!("messages[{i}].content"), &m.content)?;
        out.push(Message { role, content, tool_calls, tool_call_id: m.tool_call_id.clone(), name: m.name.clone() });
    }
    Ok((out, total))
}

/// The functions offered and the choice among them; the bytes they carry.
fn tools(req: &pb::GenerateRequest) -> Result<(Vec<Tool>, ToolChoice, usize), DaemonError> {
    if req.tools.len() > MAX_TOOLS {
        return Err(invalid(format!("{} tools is over the limit of {MAX_TOOLS}", req.tools.len())));
    }
    let mut out: Vec<Tool> = Vec::with_capacity(req.tools.len());
    let mut total = 0;
    // Every function's schema goes into one grammar: their alternatives count together.
    let mut alternatives = 0;
    for (i, t) in req.tools.iter().enumerate() {
        let ok_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        if t.name.is_empty() || t.name.len() > MAX_TOOL_NAME || !t.name.chars().all(ok_char) {
            return Err(invalid(format!(
                "tools[{i}].name {} must be 1 to {MAX_TOOL_NAME} characters of a-z, A-Z, 0-9, _ and -",
                quoted(&t.name)
            )));
        }
        if out.iter().any(|o| o.name == t.name) {
            return Err(invalid(format!("tools[{i}].name {} is offered twice; give each function once", quoted(&t.name))));
        }
        if t.parameters.len() > MAX_SCHEMA_BYTES {
            return Err(DaemonError::TooLarge(format!(
                "tools[{i}].parameters is {} bytes; the limit is {MAX_SCHEMA_BYTES} bytes a schema",
                t.parameters.len()
            )));
        }
        let parameters = if t.parameters.is_empty() {
            r#"{"type":"object"}"#.to_owned()
        } else {
            utf8(&format!("tools[{i}].parameters"), &t.parameters)?
        };
        // References (`$ref`, Pydantic's nested models) are inlined here:
        // the parameters go inside the call's own schema, where they would
        // point at the wrong root.
        let parameters = match serde_json::from_str::<serde_json::Value>(&parameters) {
            Ok(v) if v.is_object() => match revis_engine::schema::inline_refs(&v) {
                Ok(inlined) => {
                    revis_engine::schema::count_alternatives(&inlined, &format!("tools[{i}].parameters"), &mut alternatives)
                        .map_err(invalid)?;
                    if inlined == v { parameters } else { inlined.to_string() }
                }
                Err(e) => return Err(invalid(format!("tools[{i}].parameters: {e}"))),
            },
            _ => return Err(invalid(format!("tools[{i}].parameters is not a JSON schema (a JSON object)"))),
        };
        total += t.name.len() + t.description.len() + parameters.len();
        out.push(Tool { name: t.name.clone(), description: utf8(&format!("tools[{i}].description"), &t.description)?, parameters });
    }
    if total > MAX_TOOLS_BYTES {
        return Err(DaemonError::TooLarge(format!(
            "the tools carry {total} bytes of names, descriptions and schemas; the limit is {MAX_TOOLS_BYTES} bytes"
        )));
    }
    let choice = match pb::ToolChoice::try_from(req.tool_choice) {
        Ok(pb::ToolChoice::Unspecified | pb::ToolChoice::Auto) => ToolChoice::Auto,
        Ok(pb::ToolChoice::None) => ToolChoice::None,
        Ok(pb::ToolChoice::Required) => ToolChoice::Required,
        Ok(pb::ToolChoice::Named) => {
            if !out.iter().any(|t| t.name == req.tool_name) {
                return Err(invalid(format!("tool_name {} is not among the tools offered", quoted(&req.tool_name))));
            }
            ToolChoice::Named(req.tool_name.clone())
        }
        Err(_) => return Err(invalid(format!("tool_choice {} is not a known choice", req.tool_choice))),
    };
    if out.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
        return Err(invalid("tool_choice asks for a call but no tools are offered"));
    }
    if !req.tool_name.is_empty() && !matches!(choice, ToolChoice::Named(_)) {
        return Err(invalid("tool_name is set but tool_choice is not TOOL_CHOICE_NAMED"));
    }
    Ok((out, choice, total))
}

/// A caller's text as an error quotes it: at most [`QUOTED_CHARS`]
/// characters (an error travels in a header, which has a size limit).
fn quoted(text: &str) -> String {
    match text.char_indices().nth(QUOTED_CHARS) {
        None => format!("{text:?}"),
        Some((at, _)) => format!("{:?}… ({} bytes)", &text[..at], text.len()),
    }
}

/// The most characters of a caller's text an error quotes.
const QUOTED_CHARS: usize = 64;

fn size(total: usize) -> Result<(), DaemonError> {
    if total > MAX_TEXT_BYTES {
        return Err(DaemonError::TooLarge(format!(
            "the request carries {total} bytes of text; the limit is {MAX_TEXT_BYTES} bytes (1 MiB)"
        )));
    }
    Ok(())
}

/// The request's sampling; what it leaves unset comes from the model
/// (`defaults`: its GGUF metadata, else the catalog's), else revis's own.
fn sampling(s: Option<&pb::Sampling>, defaults: &revis_models::SamplingDefaults) -> Result<Sampling, DaemonError> {
    let d = pb::Sampling::default();
    let s = s.unwrap_or(&d);
    let check = |name: &str, v: f32, ok: bool, range: &str| -> Result<f32, DaemonError> {
        if !v.is_finite() || !ok {
            return Err(invalid(format!("sampling.{name} is {v}; it must be {range}")));
        }
        Ok(v)
    };
    let penalty = |name: &str, v: Option<f32>| {
        let v = v.unwrap_or(0.0);
        check(name, v, (-MAX_PENALTY..=MAX_PENALTY).contains(&v), &format!("between -{MAX_PENALTY} and {MAX_PENALTY} (0 = off)"))
    };
    let t = s.temperature.or(defaults.temperature).unwrap_or(0.7);
    let top_p = s.top_p.or(defaults.top_p).unwrap_or(0.95);
    let min_p = s.min_p.or(defaults.min_p).unwrap_or(0.05);
    let rp = s.repeat_penalty.or(defaults.repeat_penalty).unwrap_or(1.0);
    let top_k = s.top_k.or(defaults.top_k).unwrap_or(40);
    let last_n = s.repeat_last_n.or(defaults.repeat_last_n).unwrap_or(64);
    if top_k > MAX_TOP_K {
        return Err(invalid(format!("sampling.top_k is {top_k}; it must be at most {MAX_TOP_K} (0 = off)")));
    }
    if last_n > MAX_REPEAT_LAST_N {
        return Err(invalid(format!("sampling.repeat_last_n is {last_n}; it must be at most {MAX_REPEAT_LAST_N}")));
    }
    Ok(Sampling {
        temperature: check("temperature", t, (0.0..=MAX_TEMPERATURE).contains(&t), &format!("between 0 (greedy) and {MAX_TEMPERATURE}"))?,
        top_k,
        top_p: check("top_p", top_p, top_p > 0.0 && top_p <= 1.0, "in (0, 1]")?,
        min_p: check("min_p", min_p, (0.0..1.0).contains(&min_p), "in [0, 1)")?,
        repeat_penalty: check(
            "repeat_penalty",
            rp,
            (1.0..=MAX_REPEAT_PENALTY).contains(&rp),
            &format!("between 1 (off) and {MAX_REPEAT_PENALTY}"),
        )?,
        repeat_last_n: last_n,
        presence_penalty: penalty("presence_penalty", s.presence_penalty)?,
        frequency_penalty: penalty("frequency_penalty", s.frequency_penalty)?,
        seed: s.seed.unwrap_or_else(rand::random),
    })
}

pub fn generate(req: &pb::GenerateRequest, registry: &Registry, config: &Config) -> Result<ValidGenerate, DaemonError> {
    let (tier, model) = tier(registry, &req.tier)?;
    let (messages, mut total) = messages(&req.messages, false)?;
    let static_count = match req.static_messages {
        Some(n) if n as usize > messages.len() => {
            return Err(invalid(format!("static_messages is {n} but there are only {} messages", messages.len())));
        }
        Some(n) => n as usize,
        None => messages.len() - 1,
    };
    let max_tokens = match req.max_tokens {
        0 => config.default_max_tokens,
        n if n > config.max_tokens_limit && req.cap_max_tokens => config.max_tokens_limit,
        n if n > config.max_tokens_limit => {
            return Err(invalid(format!("max_tokens is {n}; the limit is {} (daemon.max_tokens_limit)", config.max_tokens_limit)));
        }
        n => n,
    };
    if req.stop.len() > MAX_STOP_STRINGS {
        return Err(invalid(format!("{} stop strings is over the limit of {MAX_STOP_STRINGS}", req.stop.len())));
    }
    let mut stop = Vec::with_capacity(req.stop.len());
    for (i, s) in req.stop.iter().enumerate() {
        if s.is_empty() || s.len() > MAX_STOP_BYTES {
            return Err(invalid(format!("stop[{i}] is {} bytes; it must be 1 to {MAX_STOP_BYTES} bytes", s.len())));
        }
        stop.push(utf8(&format!("stop[{i}]"), s)?);
    }
    let json = match pb::OutputFormat::try_from(req.format) {
        Ok(pb::OutputFormat::Json) => {
            if req.json_schema.len() > MAX_SCHEMA_BYTES {
                return Err(DaemonError::TooLarge(format!(
                    "json_schema is {} bytes; the limit is {MAX_SCHEMA_BYTES} bytes",
                    req.json_schema.len()
                )));
            }
            total += req.json_schema.len();
            let schema = (!req.json_schema.is_empty()).then(|| utf8("json_schema", &req.json_schema)).transpose()?;
            // A schema that is not JSON gets llama.cpp's own word later.
            if let Some(v) = schema.as_deref().and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok()) {
                revis_engine::schema::count_alternatives(&v, "json_schema", &mut 0).map_err(invalid)?;
            }
            Some(schema)
        }
        Ok(_) if !req.json_schema.is_empty() => {
            return Err(invalid("json_schema is set but format is not OUTPUT_FORMAT_JSON"));
        }
        Ok(_) => None,
        Err(_) => return Err(invalid(format!("format {} is not a known output format", req.format))),
    };
    if json.is_some() && !req.answer_prefix.is_empty() {
        return Err(invalid("answer_prefix cannot continue a JSON answer (OUTPUT_FORMAT_JSON); send the request again without it"));
    }
    let answer_prefix = utf8("answer_prefix", &req.answer_prefix)?;
    let logprobs = match (req.logprobs, req.top_logprobs) {
        (_, n) if n > MAX_TOP_LOGPROBS => {
            return Err(invalid(format!("top_logprobs is {n}; it must be at most {MAX_TOP_LOGPROBS}")));
        }
        (false, n) if n > 0 => return Err(invalid("top_logprobs is set but logprobs is not; set logprobs too")),
        (true, n) => Some(n),
        (false, _) => None,
    };
    let (tools, tool_choice, tool_bytes) = tools(req)?;
    if !tools.is_empty() && tool_choice != ToolChoice::None {
        let with = if json.is_some() {
            Some("format OUTPUT_FORMAT_JSON")
        } else if !answer_prefix.is_empty() {
            Some("answer_prefix")
        } else if logprobs.is_some() {
            Some("logprobs")
        } else {
            None
        };
        if let Some(with) = with {
            return Err(invalid(format!("tools cannot be combined with {with} yet; send one or the other")));
        }
    }
    total += req.answer_prefix.len() + tool_bytes;
    size(total)?;
    Ok(ValidGenerate {
        answer_prefix,
        logprobs,
        tools,
        tool_choice,
        parallel_tool_calls: req.parallel_tool_calls,
        tier,
        model: model.clone(),
        messages,
        static_count,
        sampling: sampling(req.sampling.as_ref(), &config.tiers.get(&tier).map(|t| t.sampling).unwrap_or_default())?,
        max_tokens,
        stop,
        json,
        priority: Priority::from_wire(req.priority),
    })
}

pub fn prefill(req: &pb::PrefillRequest, registry: &Registry) -> Result<ValidPrefill, DaemonError> {
    let (tier, model) = tier(registry, &req.tier)?;
    let (messages, total) = messages(&req.messages, false)?;
    size(total)?;
    Ok(ValidPrefill { tier, model: model.clone(), messages, priority: Priority::from_wire(req.priority) })
}

pub fn score(req: &pb::ScoreRequest, registry: &Registry) -> Result<ValidScore, DaemonError> {
    let (tier, model) = tier(registry, &req.tier)?;
    let (messages, total) = messages(&req.messages, true)?;
    let texts: Vec<&[u8]> = match (req.continuation.is_empty(), req.continuations.is_empty()) {
        (false, true) => vec![&req.continuation[..]],
        (true, false) => req.continuations.iter().map(|c| &c[..]).collect(),
        (false, false) => return Err(invalid("both continuation and continuations are set; give one or the other")),
        (true, true) => return Err(invalid("continuation is empty; give the text to score")),
    };
    if texts.len() > MAX_CONTINUATIONS {
        return Err(invalid(format!("{} continuations is over the limit of {MAX_CONTINUATIONS} per call", texts.len())));
    }
    size(total + req.prefix.len() + texts.iter().map(|t| t.len()).sum::<usize>())?;
    if let Some(i) = texts.iter().position(|t| t.is_empty()) {
        return Err(invalid(format!("continuations[{i}] is empty; every continuation needs text to score")));
    }
    if req.top_logprobs > MAX_TOP_LOGPROBS {
        return Err(invalid(format!("top_logprobs is {}; it must be at most {MAX_TOP_LOGPROBS}", req.top_logprobs)));
    }
    let many = texts.len() > 1 || req.continuation.is_empty();
    let continuations = texts
        .iter()
        .enumerate()
        .map(|(i, t)| utf8(&if many { format!("continuations[{i}]") } else { "continuation".into() }, t))
        .collect::<Result<Vec<_>, _>>()?;
    if req.prefix.is_empty() && messages.is_empty() {
        return Err(invalid("prefix is empty; give a prefix or messages to score after"));
    }
    let static_count = match req.static_messages {
        Some(n) if n as usize > messages.len() => {
            return Err(invalid(format!("static_messages is {n} but there are only {} messages", messages.len())));
        }
        Some(n) => n as usize,
        None => messages.len().saturating_sub(1),
    };
    Ok(ValidScore {
        tier,
        model: model.clone(),
        messages,
        static_count,
        prefix: utf8("prefix", &req.prefix)?,
        continuations,
        top_logprobs: req.top_logprobs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_quotes_at_most_a_few_characters_of_the_callers_text() {
        assert_eq!(quoted("get_weather"), "\"get_weather\"");
        let long = "x".repeat(40_000);
        let q = quoted(&long);
        assert!(q.len() < 100 && q.ends_with("… (40000 bytes)"), "{q}");
    }

    #[test]
    fn unset_sampling_comes_from_the_model_then_from_revis() {
        let model = revis_models::SamplingDefaults { temperature: Some(0.6), top_k: Some(20), ..Default::default() };
        let s = sampling(None, &model).unwrap();
        assert_eq!((s.temperature, s.top_k, s.top_p, s.min_p), (0.6, 20, 0.95, 0.05), "the model's, then revis's own");
        let asked = pb::Sampling { temperature: Some(0.0), top_p: Some(0.5), ..Default::default() };
        let s = sampling(Some(&asked), &model).unwrap();
        assert_eq!((s.temperature, s.top_k, s.top_p), (0.0, 20, 0.5), "the request's own setting wins");
        let s = sampling(None, &revis_models::SamplingDefaults::NONE).unwrap();
        assert_eq!((s.temperature, s.top_k, s.top_p, s.min_p, s.repeat_penalty, s.repeat_last_n), (0.7, 40, 0.95, 0.05, 1.0, 64));
    }
}
