//! Each kept chat template, rendered by revis, gives exactly what Hugging
//! Face's `apply_chat_template` gave for the same conversation (the
//! `.txt` files, made by `tests/templates/generate.py`), and fails where it
//! failed (the `.error` files).

use std::path::{Path, PathBuf};

use revis_engine::{ChatTemplate, Message, Role, Tool, ToolCall};
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/templates")
}

/// The special tokens each model's tokenizer gives its template.
const TEMPLATES: &[(&str, &str, &str)] = &[
    ("qwen2.5", "", "<|im_end|>"),
    ("llama3.1", "<|begin_of_text|>", "<|eot_id|>"),
    ("mistral", "<s>", "</s>"),
    ("smollm2", "<|im_start|>", "<|im_end|>"),
    ("gemma3", "<bos>", "<eos>"),
];

fn message(m: &Value) -> Message {
    let role = match m["role"].as_str().unwrap() {
        "system" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        other => panic!("role {other}"),
    };
    let text = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    let tool_calls = m
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| {
            calls
                .iter()
                .map(|c| ToolCall {
                    id: c["id"].as_str().unwrap().to_owned(),
                    name: c["function"]["name"].as_str().unwrap().to_owned(),
                    arguments: c["function"]["arguments"].to_string(),
                })
                .collect()
        })
        .unwrap_or_default();
    Message { role, content: text("content"), tool_calls, tool_call_id: text("tool_call_id"), name: text("name") }
}

fn tool(t: &Value) -> Tool {
    let f = &t["function"];
    Tool {
        name: f["name"].as_str().unwrap().to_owned(),
        description: f["description"].as_str().unwrap_or_default().to_owned(),
        parameters: f["parameters"].to_string(),
    }
}

#[test]
fn each_template_renders_as_hugging_face_renders_it() {
    let cases: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(dir().join("cases.json")).unwrap()).unwrap();
    let mut checked = 0;
    for (name, bos, eos) in TEMPLATES {
        let source = std::fs::read_to_string(dir().join(format!("{name}.jinja"))).unwrap();
        let template = ChatTemplate::new(&source, bos, eos).unwrap();
        for case in &cases {
            let case_name = case["name"].as_str().unwrap();
            // revis's messages always have text (a call's may be empty): no
            // message reaches a template with `content: null`.
            if case_name.ends_with("_null") {
                continue;
            }
            let messages: Vec<Message> = case["messages"].as_array().unwrap().iter().map(message).collect();
            let tools: Vec<Tool> = case["tools"].as_array().map(|t| t.iter().map(tool).collect()).unwrap_or_default();
            let add = case["add_generation_prompt"].as_bool().unwrap();
            let got = template.render(&messages, &tools, add);
            let expected = dir().join(format!("{name}.{case_name}.txt"));
            if expected.exists() {
                let want = std::fs::read_to_string(&expected).unwrap();
                assert_eq!(got.as_deref().unwrap_or_else(|e| panic!("{name} {case_name}: {e}")), want, "{name} {case_name}");
            } else {
                let want = std::fs::read_to_string(dir().join(format!("{name}.{case_name}.error"))).unwrap();
                let e = got.expect_err(&format!("{name} {case_name} fails in Hugging Face's rendering: {want}")).to_string();
                assert!(e.contains(want.trim()), "{name} {case_name}: {e} / {want}");
            }
            checked += 1;
        }
    }
    assert_eq!(checked, TEMPLATES.len() * 6);
}

#[test]
fn the_tool_syntax_of_each_template() {
    use revis_engine::tools::ToolSyntax;
    let format = |name: &str| revis_engine::ToolFormat::of_template(&std::fs::read_to_string(dir().join(format!("{name}.jinja"))).unwrap());
    assert_eq!((format("qwen2.5").native, format("qwen2.5").syntax), (true, ToolSyntax::Hermes));
    assert_eq!((format("llama3.1").native, format("llama3.1").syntax), (true, ToolSyntax::Llama3));
    assert_eq!((format("mistral").native, format("mistral").syntax), (true, ToolSyntax::Mistral));
    assert!(!format("smollm2").native && !format("gemma3").native, "these two offer no functions: revis's generic prompt");
}
