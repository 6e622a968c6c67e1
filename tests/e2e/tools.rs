//! Function calling through revisd's own API, on both test models (neither
//! template offers functions: revis's generic prompt and grammar do): a
//! required call keeps to its function's schema and repeats when greedy,
//! a named one names that function, a conversation with calls and their
//! results is answered, and bad requests name their field. Nothing here
//! depends on the model's words. Also: each model's own template gives
//! the tokens llama.cpp's built-in one gave for plain chats.

use revis_client::wire::v1 as pb;
use revis_testkit::TestDaemon;
use serde_json::{Value, json};

use crate::{generate, greedy, system, user};

fn tool(name: &str, parameters: Value) -> pb::Tool {
    pb::Tool {
        name: name.into(),
        description: format!("the {name} function").into_bytes().into(),
        parameters: parameters.to_string().into_bytes().into(),
    }
}

fn weather() -> pb::Tool {
    tool(
        "get_weather",
        json!({
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"],
            "additionalProperties": false
        }),
    )
}

fn clock() -> pb::Tool {
    tool("get_time", json!({"type": "object", "properties": {"zone": {"type": "string", "maxLength": 24}}, "required": ["zone"]}))
}

/// Whether a call's arguments keep to its function's schema (the two above).
fn keeps_to_schema(call: &pb::ToolCall) -> bool {
    let Ok(args) = serde_json::from_slice::<Value>(&call.arguments) else { return false };
    match call.name.as_str() {
        "get_weather" => {
            let days = args["days"].as_i64();
            args.as_object().is_some_and(|o| o.len() == 2) && args["city"].is_string() && days.is_some_and(|d| (1..=7).contains(&d))
        }
        "get_time" => args["zone"].is_string(),
        _ => false,
    }
}

fn asking(choice: pb::ToolChoice, name: &str) -> pb::GenerateRequest {
    pb::GenerateRequest {
        messages: vec![system("You are a helpful assistant."), user("What will the weather be in Paris for the next three days?")],
        sampling: greedy(),
        max_tokens: 96,
        tools: vec![weather(), clock()],
        tool_choice: choice as i32,
        tool_name: name.into(),
        ..Default::default()
    }
}

fn calls(d: &pb::Done) -> Vec<(String, String)> {
    d.tool_calls.iter().map(|c| (c.name.clone(), String::from_utf8_lossy(&c.arguments).into_owned())).collect()
}

#[tokio::test]
async fn a_required_call_keeps_to_its_schema_and_repeats_when_greedy_in_both_models() {
    for model in [revis_testkit::smollm2(), revis_testkit::gemma3()] {
        let d = TestDaemon::new().model(model.clone()).start();
        let mut c = d.client().await;
        let a = generate(&mut c, asking(pb::ToolChoice::Required, "")).await.unwrap();
        let done = &a.done;
        assert_eq!(done.finish_reason, pb::FinishReason::ToolCalls as i32, "{model:?}: {done:?}");
        assert_eq!(done.tool_calls.len(), 1, "parallel_tool_calls off: one call; {done:?}");
        assert!(done.tool_calls.iter().all(keeps_to_schema), "{model:?}: {:?}", calls(done));
        assert_eq!(done.tool_calls[0].id.len(), 9);
        let shown: String = a.deltas.iter().map(|d| d.text.as_str()).collect();
        assert_eq!(shown, done.text, "the deltas carry the text, and no call's markup");
        assert!(!done.text.contains("<tool_call>"), "{:?}", done.text);
        let again = generate(&mut c, asking(pb::ToolChoice::Required, "")).await.unwrap();
        assert_eq!(calls(&again.done), calls(done), "greedy: the same call");

        let named = generate(&mut c, asking(pb::ToolChoice::Named, "get_time")).await.unwrap().done;
        assert_eq!(named.tool_calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["get_time"], "{model:?}");
        assert!(named.tool_calls.iter().all(keeps_to_schema), "{:?}", calls(&named));

        let parallel =
            generate(&mut c, pb::GenerateRequest { parallel_tool_calls: true, ..asking(pb::ToolChoice::Required, "") }).await.unwrap();
        // Several calls may run to max_tokens: the whole ones stand, and the length is said.
        let n = parallel.done.tool_calls.len();
        assert!((1..=8).contains(&n) && parallel.done.tool_calls.iter().all(keeps_to_schema), "{:?}", calls(&parallel.done));
        let ended = [pb::FinishReason::ToolCalls as i32, pb::FinishReason::Length as i32];
        assert!(ended.contains(&parallel.done.finish_reason), "{:?}", parallel.done);

        // A call cut short by max_tokens is no call, and its syntax is no text.
        let cut = generate(&mut c, pb::GenerateRequest { max_tokens: 3, ..asking(pb::ToolChoice::Required, "") }).await.unwrap();
        assert_eq!((cut.done.finish_reason, cut.done.tool_calls.len()), (pb::FinishReason::Length as i32, 0), "{model:?}: {:?}", cut.done);
        let shown: String = cut.deltas.iter().map(|d| d.text.as_str()).collect();
        assert_eq!((shown.as_str(), cut.done.text.as_str()), ("", ""), "{model:?}: nothing of the call's syntax");
    }
}

#[tokio::test]
async fn a_conversation_with_calls_and_results_is_answered() {
    let d = TestDaemon::new().start();
    let mut c = d.client().await;
    let first = generate(&mut c, asking(pb::ToolChoice::Required, "")).await.unwrap().done;
    let call = first.tool_calls[0].clone();
    let mut history = asking(pb::ToolChoice::None, "").messages;
    history.push(pb::ChatMessage { role: pb::Role::Assistant as i32, tool_calls: vec![call.clone()], ..Default::default() });
    history.push(pb::ChatMessage {
        role: pb::Role::Tool as i32,
        content: br#"{"forecast": ["sun", "rain", "sun"]}"#.to_vec().into(),
        tool_call_id: call.id.clone(),
        name: call.name.clone(),
        ..Default::default()
    });
    let none = pb::GenerateRequest { messages: history.clone(), ..asking(pb::ToolChoice::None, "") };
    let answer = generate(&mut c, none).await.unwrap().done;
    assert!(answer.tool_calls.is_empty() && !answer.text.is_empty(), "tool_choice none: a text answer; {answer:?}");
    assert_ne!(answer.finish_reason, pb::FinishReason::ToolCalls as i32);
    let auto = generate(&mut c, pb::GenerateRequest { messages: history, ..asking(pb::ToolChoice::Auto, "") }).await.unwrap().done;
    let well_formed = if auto.finish_reason == pb::FinishReason::ToolCalls as i32 {
        !auto.tool_calls.is_empty() && auto.tool_calls.iter().all(keeps_to_schema)
    } else {
        auto.tool_calls.is_empty()
    };
    assert!(well_formed, "auto: text or calls that keep to their schema; {auto:?}");
}

#[tokio::test]
async fn bad_tool_requests_are_refused_naming_their_field() {
    let d = TestDaemon::new().start();
    let mut c = d.client().await;
    let call = pb::ToolCall { id: "call00001".into(), name: "get_weather".into(), arguments: br#"{"city":"Paris"}"#.to_vec().into() };
    let result = |id: &str| pb::ChatMessage {
        role: pb::Role::Tool as i32,
        content: b"18 C".to_vec().into(),
        tool_call_id: id.into(),
        ..Default::default()
    };
    let called = pb::ChatMessage { role: pb::Role::Assistant as i32, tool_calls: vec![call.clone()], ..Default::default() };
    let base = asking(pb::ToolChoice::Auto, "");
    let many: Vec<pb::Tool> = (0..129).map(|i| tool(&format!("f{i}"), json!({"type": "object"}))).collect();
    let cases: Vec<(pb::GenerateRequest, &str)> = vec![
        (asking(pb::ToolChoice::Named, "nope"), "tool_name \"nope\""),
        (pb::GenerateRequest { tools: Vec::new(), ..asking(pb::ToolChoice::Required, "") }, "no tools are offered"),
        (pb::GenerateRequest { tools: many, ..base.clone() }, "129 tools is over the limit of 128"),
        (pb::GenerateRequest { tools: vec![tool("bad name!", json!({}))], ..base.clone() }, "tools[0].name"),
        (pb::GenerateRequest { tools: vec![weather(), weather()], ..base.clone() }, "tools[1].name \"get_weather\" is offered twice"),
        (
            pb::GenerateRequest {
                tools: vec![pb::Tool { name: "f".into(), parameters: b"[1]".to_vec().into(), ..Default::default() }],
                ..base.clone()
            },
            "tools[0].parameters is not a JSON schema",
        ),
        (pb::GenerateRequest { messages: vec![user("hi"), result("call_x")], ..base.clone() }, "messages[1].tool_call_id"),
        (pb::GenerateRequest { messages: vec![user("hi"), called.clone(), result("other")], ..base.clone() }, "messages[2].tool_call_id"),
        (
            pb::GenerateRequest {
                messages: vec![
                    user("hi"),
                    pb::ChatMessage {
                        tool_calls: vec![pb::ToolCall { arguments: b"{".to_vec().into(), ..call.clone() }],
                        ..called.clone()
                    },
                ],
                ..base.clone()
            },
            "messages[1].tool_calls[0].arguments is not JSON",
        ),
        (pb::GenerateRequest { format: pb::OutputFormat::Json as i32, ..base.clone() }, "tools cannot be combined with format"),
        (pb::GenerateRequest { logprobs: true, ..base.clone() }, "tools cannot be combined with logprobs"),
    ];
    for (req, says) in cases {
        let e = generate(&mut c, req).await.expect_err(says);
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{says}: {e:?}");
        assert!(e.message().contains(says), "{says}: {}", e.message());
    }
    // The same conversation, well formed, is answered: nothing was lost to the refusals.
    let ok = pb::GenerateRequest { messages: vec![user("hi"), called, result("call00001")], ..asking(pb::ToolChoice::None, "") };
    assert!(!generate(&mut c, ok).await.unwrap().done.text.is_empty());
}

/// For plain chats (with a system message) each model's own template,
/// rendered by revis, gives exactly the tokens llama.cpp's built-in
/// template for it gave before revis rendered templates itself: SmolLM2's
/// from its GGUF, Gemma 3's from Hugging Face (the test GGUF has none, so
/// revisd keeps llama.cpp's there). Without a system message SmolLM2's own
/// template adds its default one, as Hugging Face's rendering does.
#[test]
fn the_models_own_templates_give_the_tokens_llama_cpps_built_in_ones_gave() {
    use llama_cpp_2::llama_backend::LlamaBackend;
    use llama_cpp_2::model::params::LlamaModelParams;
    use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
    use revis_engine::{ChatTemplate, Message, Role};

    let mut backend = LlamaBackend::init().unwrap();
    backend.void_logs();
    let gemma_source = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/revis-engine/tests/templates/gemma3.jinja"),
    )
    .unwrap();
    let chats: Vec<Vec<Message>> = vec![
        vec![Message::new(Role::System, "Be brief."), Message::new(Role::User, "Hello! Grüße, 東京")],
        vec![
            Message::new(Role::System, "You are revis."),
            Message::new(Role::User, "What is 2 + 2?"),
            Message::new(Role::Assistant, "4."),
            Message::new(Role::User, "And 3 + 3?\nThanks."),
        ],
    ];
    for (path, builtin) in [(revis_testkit::smollm2(), "chatml"), (revis_testkit::gemma3(), "gemma")] {
        let model = LlamaModel::load_from_file(&backend, &path, &LlamaModelParams::default()).unwrap();
        let vocab = model.vocab();
        let special = |t| String::from_utf8_lossy(&vocab.token_to_piece(t, true, None)).into_owned();
        let (bos, eos) = (special(vocab.bos()), special(vocab.eos()));
        let source = model.chat_template(None).ok().and_then(|t| t.to_string().ok()).unwrap_or_else(|| gemma_source.clone());
        let own = ChatTemplate::new(&source, &bos, &eos).unwrap();
        let old = LlamaChatTemplate::new(builtin).unwrap();
        let tokens =
            |text: &str| vocab.tokenize(text.as_bytes(), vocab.should_add_bos(), true).into_iter().map(|t| t.0).collect::<Vec<_>>();
        let render_old = |chat: &[Message]| {
            let m: Vec<LlamaChatMessage> =
                chat.iter().map(|m| LlamaChatMessage::new(m.role.as_str().into(), m.content.clone()).unwrap()).collect();
            model.apply_chat_template(&old, &m, true).unwrap()
        };
        // As revisd does: BOS written by the template is the one tokenizing adds.
        let render_own = |chat: &[Message]| {
            let text = own.render(chat, &[], true).unwrap();
            match text.strip_prefix(bos.as_str()) {
                Some(rest) if vocab.should_add_bos() => rest.to_owned(),
                _ => text,
            }
        };
        for chat in &chats {
            assert_eq!(tokens(&render_own(chat)), tokens(&render_old(chat)), "{path:?}: {chat:?}");
        }
        let no_system = [Message::new(Role::User, "Hi")];
        if builtin == "chatml" {
            let with_default =
                [Message::new(Role::System, "You are a helpful AI assistant named SmolLM, trained by Hugging Face"), no_system[0].clone()];
            assert_eq!(tokens(&render_own(&no_system)), tokens(&render_old(&with_default)), "SmolLM2's own default system message");
        } else {
            assert_eq!(tokens(&render_own(&no_system)), tokens(&render_old(&no_system)));
        }
    }
}

/// Greedy under a grammar checks the best tokens first
/// (`revis_engine::sample::greedy_under`) and picks what llama.cpp's chain
/// (the grammar over the whole vocabulary, then greedy) picks, step after
/// step: with random logits (whose best is mostly refused), with the
/// grammar's own best raised above every other (the check-first path), and
/// with it tied with the highest logit (the first token wins a tie).
/// SmolLM2's vocabulary, a JSON schema's grammar with an enum of values
/// sharing a prefix.
#[test]
fn checking_the_best_tokens_first_picks_what_the_whole_vocabulary_picks() {
    use llama_cpp_2::llama_backend::LlamaBackend;
    use llama_cpp_2::model::LlamaModel;
    use llama_cpp_2::model::params::LlamaModelParams;
    use llama_cpp_2::sampling::LlamaSampler;
    use llama_cpp_2::token::LlamaToken;
    use llama_cpp_2::token::data::LlamaTokenData;
    use llama_cpp_2::token::data_array::LlamaTokenDataArray;
    use rand::{Rng, SeedableRng};

    let mut backend = LlamaBackend::init().unwrap();
    backend.void_logs();
    let model = LlamaModel::load_from_file(&backend, revis_testkit::smollm2(), &LlamaModelParams::default()).unwrap();
    let values: Vec<String> = (0..40).map(|i| format!("  option {i}")).collect();
    let schema = serde_json::json!({"type": "object", "properties": {"pick": {"enum": values}, "n": {"type": "integer"}}, "required": ["pick", "n"]});
    let text = llama_cpp_2::json_schema_to_grammar(&schema.to_string()).unwrap();
    let n_vocab = model.n_vocab() as usize;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (mut checked, mut fast) = (0, 0);
    for round in 0..6 {
        let mut ours = LlamaSampler::grammar(&model, &text, "root").unwrap();
        let mut chain = LlamaSampler::chain_simple([LlamaSampler::grammar(&model, &text, "root").unwrap(), LlamaSampler::greedy()]);
        let whole = |chain: &mut LlamaSampler, logits: &[f32]| {
            let mut all = LlamaTokenDataArray::new(
                logits.iter().enumerate().map(|(t, &l)| LlamaTokenData::new(LlamaToken(t as i32), l, 0.0)).collect(),
                false,
            );
            all.apply_sampler(chain);
            all.selected_token().unwrap()
        };
        for _ in 0..60 {
            let mut logits: Vec<f32> = (0..n_vocab).map(|_| rng.random_range(-10.0..10.0)).collect();
            let best = whole(&mut chain, &logits).0 as usize;
            let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            match round % 3 {
                0 => {}
                1 => logits[best] = top + 1.0,
                _ => logits[best] = top,
            }
            let expected = whole(&mut chain, &logits);
            chain.accept(expected);
            let picked = revis_engine::sample::greedy_under(&mut ours, &logits);
            assert_eq!(picked, expected, "round {round}");
            checked += 1;
            fast += usize::from(round % 3 == 1);
            if model.vocab().is_eog(picked) {
                break;
            }
        }
    }
    assert!(checked > 100 && fast > 30, "{checked} picks, {fast} on the check-first path");
}
