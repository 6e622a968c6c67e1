//! The edge between the domain types ([`crate::api`]) and `revis.v1`: every
//! conversion is here, once. Requests go out as protobuf messages; answers
//! come back as domain types; a `tonic::Status` becomes a [`CallError`].
//!
//! With the `wire` cargo feature this module is public, with `v1`,
//! `message` and `Raw` (a client's raw stubs, `Client::wire`),
//! for the programs that speak the wire itself: the end-to-end tests of the
//! daemon's API and the benchmarks. Nothing else enables the feature (`cargo
//! xtask layers` checks), so the orchestrator, the CLI, the GUI and the
//! HTTP APIs cannot name a protobuf type or a stub: the compiler refuses.

use std::time::Duration;

pub use revis_proto::v1;
use v1 as pb;

use crate::api::*;

/// A message's role on the wire.
fn role(r: Role) -> pb::Role {
    match r {
        Role::System => pb::Role::System,
        Role::User => pb::Role::User,
        Role::Assistant => pb::Role::Assistant,
        Role::Tool => pb::Role::Tool,
    }
}

fn tool_call(c: &ToolCall) -> pb::ToolCall {
    pb::ToolCall { id: c.id.clone(), name: c.name.clone(), arguments: c.arguments.clone().into_bytes().into() }
}

/// The raw stubs of one connection (see [`crate::Client::wire`]): no
/// retry, no domain types.
#[cfg(feature = "wire")]
#[derive(Clone)]
pub struct Raw {
    pub inference: v1::inference_client::InferenceClient<tonic::transport::Channel>,
    pub admin: v1::admin_client::AdminClient<tonic::transport::Channel>,
    /// The channel itself, for the socket's other services (health, reflection).
    pub channel: tonic::transport::Channel,
}

/// A chat message with text content, for callers that build `revis.v1`
/// requests themselves.
#[cfg(feature = "wire")]
pub fn message(role: pb::Role, text: &str) -> pb::ChatMessage {
    pb::ChatMessage { role: role as i32, content: text.as_bytes().to_vec().into(), ..Default::default() }
}

pub(crate) fn messages(ms: &[Message]) -> Vec<pb::ChatMessage> {
    ms.iter()
        .map(|m| pb::ChatMessage {
            role: role(m.role) as i32,
            content: m.text.clone().into_bytes().into(),
            tool_calls: m.tool_calls.iter().map(tool_call).collect(),
            tool_call_id: m.tool_call_id.clone(),
            name: m.name.clone(),
        })
        .collect()
}

fn sampling(s: &Sampling) -> pb::Sampling {
    pb::Sampling {
        temperature: s.temperature,
        top_k: s.top_k,
        top_p: s.top_p,
        min_p: s.min_p,
        repeat_penalty: s.repeat_penalty,
        repeat_last_n: s.repeat_last_n,
        presence_penalty: s.presence_penalty,
        frequency_penalty: s.frequency_penalty,
        seed: s.seed,
    }
}

impl From<&GenerateParams> for pb::GenerateRequest {
    fn from(g: &GenerateParams) -> pb::GenerateRequest {
        let (format, schema) = match &g.format {
            Format::Text => (pb::OutputFormat::Text, None),
            Format::Json { schema } => (pb::OutputFormat::Json, schema.clone()),
        };
        pb::GenerateRequest {
            tier: g.tier.as_str().to_owned(),
            messages: messages(&g.messages),
            static_messages: g.static_messages,
            sampling: Some(sampling(&g.sampling)),
            max_tokens: g.max_tokens.unwrap_or(0),
            cap_max_tokens: g.cap_max_tokens,
            stop: g.stop.iter().map(|s| s.clone().into_bytes().into()).collect(),
            format: format as i32,
            json_schema: schema.unwrap_or_default().into_bytes().into(),
            priority: g.priority.to_wire(),
            answer_prefix: g.answer_prefix.clone().into_bytes().into(),
            logprobs: g.logprobs.is_some(),
            top_logprobs: g.logprobs.unwrap_or(0),
            tools: g
                .tools
                .iter()
                .map(|t| pb::Tool {
                    name: t.name.clone(),
                    description: t.description.clone().into_bytes().into(),
                    parameters: t.parameters.clone().into_bytes().into(),
                })
                .collect(),
            tool_choice: match g.tool_choice {
                ToolChoice::Auto => pb::ToolChoice::Auto,
                ToolChoice::None => pb::ToolChoice::None,
                ToolChoice::Required => pb::ToolChoice::Required,
                ToolChoice::Named(_) => pb::ToolChoice::Named,
            } as i32,
            tool_name: match &g.tool_choice {
                ToolChoice::Named(name) => name.clone(),
                _ => String::new(),
            },
            parallel_tool_calls: g.parallel_tool_calls,
        }
    }
}

impl From<&PrefillParams> for pb::PrefillRequest {
    fn from(p: &PrefillParams) -> pb::PrefillRequest {
        pb::PrefillRequest { tier: p.tier.as_str().to_owned(), messages: messages(&p.messages), priority: p.priority.to_wire() }
    }
}

impl From<&ScoreParams> for pb::ScoreRequest {
    fn from(s: &ScoreParams) -> pb::ScoreRequest {
        pb::ScoreRequest {
            tier: s.tier.as_str().to_owned(),
            messages: messages(&s.messages),
            prefix: s.prefix.clone().into_bytes().into(),
            continuation: Default::default(),
            continuations: s.continuations.iter().map(|c| c.clone().into_bytes().into()).collect(),
            top_logprobs: s.top_logprobs,
            static_messages: s.static_messages,
        }
    }
}

impl From<&EmbedParams> for pb::EmbedRequest {
    fn from(e: &EmbedParams) -> pb::EmbedRequest {
        pb::EmbedRequest { tier: e.tier.as_str().to_owned(), inputs: e.inputs.iter().map(|t| t.clone().into_bytes().into()).collect() }
    }
}

impl From<pb::EmbedResponse> for Embedded {
    fn from(r: pb::EmbedResponse) -> Embedded {
        Embedded {
            model: r.model,
            embeddings: r.embeddings.into_iter().map(|e| Embedding { values: e.values, tokens: e.tokens }).collect(),
        }
    }
}

/// A tier the daemon named; one this client does not know (a newer daemon)
/// is left out of what it shows.
fn tier(name: &str) -> Option<Tier> {
    match Tier::from_wire(name) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::debug!("ignoring a tier of the daemon: {e}");
            None
        }
    }
}

impl From<pb::Done> for Done {
    fn from(d: pb::Done) -> Done {
        Done {
            finish_reason: match pb::FinishReason::try_from(d.finish_reason) {
                Ok(pb::FinishReason::Length) => FinishReason::Length,
                Ok(pb::FinishReason::Stop) => FinishReason::Stop,
                Ok(pb::FinishReason::ToolCalls) => FinishReason::ToolCalls,
                _ => FinishReason::End,
            },
            prompt_tokens: d.prompt_tokens,
            cached_tokens: d.cached_tokens,
            generated_tokens: d.generated_tokens,
            seed: d.seed,
            prompt_us: d.prompt_us,
            generate_us: d.generate_us,
            text: d.text,
            queue_ms: d.queue_ms,
            draft_tokens: d.draft_tokens,
            draft_accepted: d.draft_accepted,
            batch_peak: d.batch_peak,
            tool_calls: d
                .tool_calls
                .into_iter()
                .map(|c| ToolCall { id: c.id, name: c.name, arguments: String::from_utf8_lossy(&c.arguments).into_owned() })
                .collect(),
            // Read from the deltas (GenerateStream::finish).
            logprobs: Vec::new(),
        }
    }
}

/// A streamed event; `None` for an empty one (a newer daemon's event kind).
pub(crate) fn event(e: pb::GenerateEvent) -> Option<Event> {
    Some(match e.event? {
        pb::generate_event::Event::Started(s) => Event::Started { model: s.model, prompt_tokens: s.prompt_tokens },
        pb::generate_event::Event::Delta(d) => {
            Event::Delta { text: d.text, tokens: d.tokens, logprobs: d.logprobs.into_iter().map(token_logprob).collect() }
        }
        pb::generate_event::Event::Done(d) => Event::Done(d.into()),
    })
}

impl From<pb::PrefillResponse> for Prefilled {
    fn from(p: pb::PrefillResponse) -> Prefilled {
        Prefilled { prompt_tokens: p.prompt_tokens, cached_tokens: p.cached_tokens, elapsed_us: p.elapsed_us }
    }
}

fn token_logprob(t: pb::TokenLogprob) -> TokenLogprob {
    TokenLogprob {
        piece: t.piece.to_vec(),
        logprob: t.logprob,
        top: t.top.into_iter().map(|a| Alternative { piece: a.piece.to_vec(), logprob: a.logprob }).collect(),
    }
}

/// One result per continuation, in the order asked.
pub(crate) fn scored(s: pb::ScoreResponse) -> Vec<Scored> {
    let prefix_tokens = s.prefix_tokens;
    s.results
        .into_iter()
        .map(|r| Scored {
            logprob: r.logprob,
            tokens: r.tokens.into_iter().map(token_logprob).collect(),
            byte_length: r.byte_length,
            prefix_tokens,
        })
        .collect()
}

impl From<pb::TierStatus> for TierStatus {
    fn from(t: pb::TierStatus) -> TierStatus {
        TierStatus {
            tier: tier(&t.tier).unwrap_or_default(),
            model: t.model,
            model_path: t.model_path,
            state: match pb::ModelState::try_from(t.state) {
                Ok(pb::ModelState::Loading) => ModelState::Loading,
                Ok(pb::ModelState::Ready) => ModelState::Ready,
                _ => ModelState::Unloaded,
            },
            memory_bytes: t.memory_bytes,
            cached_prefixes: t.cached_prefixes,
            cache_bytes: t.cache_bytes,
            context_tokens: t.context_tokens,
            shared_with: t.shared_with.iter().filter_map(|s| tier(s)).collect(),
            split: t.split,
            threads: t.threads,
            threads_auto: t.threads_auto,
        }
    }
}

impl From<pb::ServerModeStatus> for ServerMode {
    fn from(s: pb::ServerModeStatus) -> ServerMode {
        ServerMode {
            enabled: s.enabled,
            listen_address: s.listen_address,
            advertised: s.advertised,
            remote_connections: s.remote_connections,
            paired_devices: s.paired_devices,
            pairing_open: s.pairing_open,
            lending: s.lending,
            lending_sessions: s.lending_sessions,
            lending_refused: s.lending_refused,
        }
    }
}

impl From<pb::StatusResponse> for DaemonStatus {
    fn from(s: pb::StatusResponse) -> DaemonStatus {
        DaemonStatus {
            version: s.version,
            tiers: s.tiers.into_iter().filter(|t| tier(&t.tier).is_some()).map(Into::into).collect(),
            queue_depth: s.queue_depth,
            queue_capacity: s.queue_capacity,
            rss_bytes: s.rss_bytes,
            busy: s.busy,
            pid: s.pid,
            uptime_s: s.uptime_s,
            device_id: s.device_id,
            name: s.name,
            server: s.server.map(Into::into),
            memory_free_bytes: s.memory_free_bytes,
        }
    }
}

impl From<pb::LoadModelResponse> for Loaded {
    fn from(r: pb::LoadModelResponse) -> Loaded {
        Loaded { tier: r.tier.map(Into::into).unwrap_or_default(), elapsed_ms: r.elapsed_ms }
    }
}

impl From<pb::UnloadModelResponse> for Unloaded {
    fn from(r: pb::UnloadModelResponse) -> Unloaded {
        Unloaded {
            tier: r.tier.map(Into::into).unwrap_or_default(),
            rss_before_bytes: r.rss_before_bytes,
            rss_after_bytes: r.rss_after_bytes,
        }
    }
}

impl From<pb::PurgeResponse> for Purged {
    fn from(r: pb::PurgeResponse) -> Purged {
        Purged { dropped_prefixes: r.dropped_prefixes, freed_bytes: r.freed_bytes }
    }
}

impl From<pb::PairedDeviceInfo> for DeviceInfo {
    fn from(d: pb::PairedDeviceInfo) -> DeviceInfo {
        DeviceInfo { device_id: d.device_id, name: d.name, paired_at: d.paired_at, last_seen: d.last_seen, connections: d.connections }
    }
}

impl From<pb::RevokeDeviceResponse> for Revoked {
    fn from(r: pb::RevokeDeviceResponse) -> Revoked {
        Revoked { device: r.device.map(Into::into), cut_connections: r.cut_connections }
    }
}

/// A pairing window's event; `None` for an empty one.
pub(crate) fn pairing_event(e: pb::PairingEvent) -> Option<PairingEvent> {
    Some(match e.event? {
        pb::pairing_event::Event::Opened(o) => {
            PairingEvent::Opened { code: o.code, expires_in_s: o.expires_in_s, listen_address: o.listen_address, device_id: o.device_id }
        }
        pb::pairing_event::Event::Paired(p) => PairingEvent::Paired { device_id: p.device_id, name: p.name },
        pb::pairing_event::Event::Closed(c) => PairingEvent::Closed { reason: c.reason },
    })
}

fn code(c: tonic::Code) -> Code {
    use tonic::Code as T;
    match c {
        T::Ok | T::Unknown => Code::Unknown,
        T::Cancelled => Code::Cancelled,
        T::InvalidArgument => Code::InvalidArgument,
        T::DeadlineExceeded => Code::DeadlineExceeded,
        T::NotFound => Code::NotFound,
        T::AlreadyExists => Code::AlreadyExists,
        T::PermissionDenied => Code::PermissionDenied,
        T::ResourceExhausted => Code::ResourceExhausted,
        T::FailedPrecondition => Code::FailedPrecondition,
        T::Aborted => Code::Aborted,
        T::OutOfRange => Code::OutOfRange,
        T::Unimplemented => Code::Unimplemented,
        T::Internal => Code::Internal,
        T::Unavailable => Code::Unavailable,
        T::DataLoss => Code::DataLoss,
        T::Unauthenticated => Code::Unauthenticated,
    }
}

impl CallError {
    /// A failed call as the wire said it. A status the daemon sent never
    /// has a `source`; one made here from a transport error (the connection
    /// broke under the call) does.
    pub(crate) fn from_status(s: tonic::Status) -> CallError {
        let retry_after =
            s.metadata().get("grpc-retry-pushback-ms").and_then(|v| v.to_str().ok()?.parse::<u64>().ok()).map(Duration::from_millis);
        let broken = std::error::Error::source(&s).is_some();
        let code = match code(s.code()) {
            // The connection gave up the call (hyper's "operation was
            // canceled", as a daemon closes its connections on shutdown):
            // nobody here cancelled it (a caller that does drops the call
            // and sees no status), and the daemon never ran it.
            Code::Cancelled if broken => Code::Unavailable,
            c => c,
        };
        CallError { code, message: s.message().to_owned(), retry_after, broken, delivered: 0 }
    }
}

/// A raw stub's failure said as the domain says it, for the programs that
/// speak the wire itself (the benchmarks read their own calls' failures so).
#[cfg(feature = "wire")]
impl From<tonic::Status> for CallError {
    fn from(s: tonic::Status) -> CallError {
        CallError::from_status(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_the_connection_gave_up_is_unavailable_and_a_cancel_from_the_daemon_stays_one() {
        let mut s = tonic::Status::cancelled("operation was canceled");
        s.set_source(std::sync::Arc::new(std::io::Error::other("connection closing")));
        assert_eq!(CallError::from_status(s).code, Code::Unavailable);
        assert_eq!(CallError::from_status(tonic::Status::cancelled("cut")).code, Code::Cancelled);
    }

    #[test]
    fn a_generation_goes_out_as_the_daemon_reads_it() {
        let g = GenerateParams {
            tier: Tier::Tier1,
            messages: vec![Message::system("be brief"), Message::user("hi")],
            max_tokens: None,
            format: Format::Json { schema: Some("{}".into()) },
            priority: Priority::Background,
            sampling: Sampling { seed: Some(7), ..Default::default() },
            ..Default::default()
        };
        let w = pb::GenerateRequest::from(&g);
        assert_eq!(w.tier, "tier1");
        assert_eq!(w.messages[0].role, pb::Role::System as i32);
        assert_eq!(&w.messages[1].content[..], b"hi");
        assert_eq!(w.max_tokens, 0, "None is the daemon's default");
        assert_eq!(w.format, pb::OutputFormat::Json as i32);
        assert_eq!(&w.json_schema[..], b"{}");
        assert_eq!(w.priority, pb::Priority::Background as i32);
        assert_eq!(w.sampling.and_then(|s| s.seed), Some(7));
    }

    #[test]
    fn a_status_keeps_its_pushback_and_whether_the_connection_broke() {
        let mut s = tonic::Status::resource_exhausted("queue full");
        s.metadata_mut().insert("grpc-retry-pushback-ms", "250".parse().unwrap());
        let e = CallError::from_status(s);
        assert_eq!((e.code, e.retry_after, e.broken), (Code::ResourceExhausted, Some(Duration::from_millis(250)), false));
        let broken = tonic::Status::from_error(Box::new(std::io::Error::other("connection reset")));
        assert!(CallError::from_status(broken).broken);
    }

    #[test]
    fn tiers_the_client_does_not_know_are_left_out() {
        let s = pb::StatusResponse {
            tiers: vec![
                pb::TierStatus { tier: "tier1".into(), shared_with: vec!["tier2".into(), "tier9".into()], ..Default::default() },
                pb::TierStatus { tier: "tier9".into(), ..Default::default() },
            ],
            ..Default::default()
        };
        let d = DaemonStatus::from(s);
        assert_eq!(d.tiers.len(), 1);
        assert_eq!(d.tiers[0].shared_with, vec![Tier::Tier2]);
    }
}
