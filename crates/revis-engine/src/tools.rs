//! Functions a model may call (tool calling), pure logic: what the prompt
//! offers ([`plan`]), the grammar that holds a call to the functions'
//! schemas, and reading the calls back out of the answer ([`ToolStream`]).
//!
//! A model's template either offers functions itself (it reads `tools`:
//! Qwen, Llama 3.1, Mistral, Hermes) and calls them in its own syntax
//! ([`ToolSyntax`]), or it does not (SmolLM2, Gemma 3): then revis offers
//! them in a system message of its own ([`generic_instructions`]) and the
//! model calls in Hermes's `<tool_call>` form, earlier calls and results
//! written into the messages as text. Either way the grammar makes every
//! call valid JSON naming a function offered, with arguments that match
//! its schema: from the first token when a call is required (`required`, or
//! one function named), from the syntax's opening word on when the model
//! chooses (`auto`, a lazy grammar).

use serde_json::{Value as Json, json};

pub use crate::message::ToolCall;
use crate::{EngineError, Message, Role};

/// A function the model may call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tool {
    pub name: String,
    pub description: String,
    /// Its arguments' JSON schema (an object), as JSON text.
    pub parameters: String,
}

impl Tool {
    /// The parameters' schema; `{"type": "object"}` when none was given.
    pub fn schema(&self) -> Json {
        serde_json::from_str(&self.parameters).unwrap_or_else(|_| json!({"type": "object"}))
    }

    /// OpenAI's form, which chat templates read.
    pub fn openai_json(&self) -> Json {
        json!({
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.schema()},
        })
    }
}

/// Whether and which function the model must call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model answers in text or calls, as it chooses.
    #[default]
    Auto,
    /// The model answers in text; the functions are not offered.
    None,
    /// The model calls at least one function.
    Required,
    /// The model calls this function.
    Named(String),
}

/// How a template writes a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolSyntax {
    /// `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`, one block a
    /// call (Hermes, Qwen 2.5 and 3, SmolLM3; revis's generic prompt).
    Hermes,
    /// `{"name": …, "parameters": {…}}` as the whole answer (Llama 3.1+).
    Llama3,
    /// `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]` (Mistral).
    Mistral,
}

impl ToolSyntax {
    /// The text a call starts with: a lazy grammar's trigger and where
    /// [`ToolStream`] stops passing text on.
    pub fn opening(self) -> &'static str {
        match self {
            ToolSyntax::Hermes => "<tool_call>",
            ToolSyntax::Llama3 => "{\"",
            ToolSyntax::Mistral => "[TOOL_CALLS]",
        }
    }

    /// The key a call's arguments go under.
    fn arguments_key(self) -> &'static str {
        match self {
            ToolSyntax::Llama3 => "parameters",
            _ => "arguments",
        }
    }
}

/// A model's way with functions (see [`crate::Tokenizer::tool_format`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolFormat {
    /// The template offers functions itself (it reads `tools`).
    pub native: bool,
    pub syntax: ToolSyntax,
}

/// The most calls one answer may make (`parallel_tool_calls`).
pub const MAX_PARALLEL_CALLS: usize = 8;

/// A grammar a generation keeps to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grammar {
    /// GBNF, its start rule `root`.
    pub text: String,
    /// Empty: from the first token. Else lazy: from the first of these
    /// words on (the words included), the text before them free.
    pub triggers: Vec<String>,
}

impl Grammar {
    pub fn strict(text: String) -> Grammar {
        Grammar { text, triggers: Vec::new() }
    }
}

/// What a chat with functions becomes.
#[derive(Debug)]
pub struct ToolPlan {
    /// The messages to render (with the generic prompt and the earlier
    /// calls and results as text, for a template that offers no functions).
    pub messages: Vec<Message>,
    /// The functions to give the template (none for the generic prompt).
    pub tools: Vec<Tool>,
    /// The grammar the calls keep to (none when no call may be made).
    pub grammar: Option<Grammar>,
    /// How to read calls out of the answer (none when no call may be made).
    pub syntax: Option<ToolSyntax>,
}

/// Plans a generation over `messages` with `tools` offered: see the module
/// documentation. `json_grammar` compiles a JSON schema into GBNF (the
/// tokenizer's). A tool named by `choice` must be among `tools`.
pub fn plan(
    format: ToolFormat,
    messages: &[Message],
    tools: &[Tool],
    choice: &ToolChoice,
    parallel: bool,
    json_grammar: impl Fn(&str) -> Result<String, EngineError>,
) -> Result<ToolPlan, EngineError> {
    let offered = if matches!(choice, ToolChoice::None) { &[][..] } else { tools };
    let messages = if format.native { messages.to_vec() } else { generic_messages(messages, offered) };
    if offered.is_empty() {
        return Ok(ToolPlan { messages, tools: Vec::new(), grammar: None, syntax: None });
    }
    let callable: Vec<&Tool> = match choice {
        ToolChoice::Named(name) => match tools.iter().find(|t| &t.name == name) {
            Some(t) => vec![t],
            None => return Err(EngineError::Tools(format!("tool_choice names {name:?}, which is not among the tools"))),
        },
        _ => tools.iter().collect(),
    };
    let max_calls = if parallel && !matches!(choice, ToolChoice::Named(_)) { MAX_PARALLEL_CALLS } else { 1 };
    let text = grammar(format.syntax, &callable, max_calls, json_grammar)?;
    let grammar = match choice {
        ToolChoice::Auto => Grammar { text, triggers: vec![format.syntax.opening().to_owned()] },
        _ => Grammar::strict(text),
    };
    let tools = if format.native { tools.to_vec() } else { Vec::new() };
    Ok(ToolPlan { messages, tools, grammar: Some(grammar), syntax: Some(format.syntax) })
}

/// The rule the schema's grammar starts with, renamed so the wrapper can
/// be the start rule.
const CALL_RULE: &str = "revis-tool-call";
/// Whitespace around a call: at most 4 characters, so a greedy model cannot
/// spend its tokens there.
const WS_RULE: &str = "revis-ws";

/// GBNF for up to `max_calls` calls of `tools` in `syntax`.
fn grammar(
    syntax: ToolSyntax,
    tools: &[&Tool],
    max_calls: usize,
    json_grammar: impl Fn(&str) -> Result<String, EngineError>,
) -> Result<String, EngineError> {
    let key = syntax.arguments_key();
    let one_of: Vec<Json> = tools
        .iter()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, key: t.schema()},
                "required": ["name", key],
                "additionalProperties": false,
            })
        })
        .collect();
    let call = if one_of.len() == 1 { one_of[0].clone() } else { json!({"anyOf": one_of}) };
    let schema = match syntax {
        ToolSyntax::Mistral => json!({"type": "array", "items": call, "minItems": 1, "maxItems": max_calls}),
        _ => call,
    };
    let compiled = json_grammar(&schema.to_string()).map_err(|e| match e {
        EngineError::InvalidSchema(why) => EngineError::Tools(format!("a tool's parameters cannot be used: {why}")),
        other => other,
    })?;
    let body = rename_root(&compiled);
    // A little whitespace around each call, so the text a model writes in
    // the same token as the opening (a newline, a space) is the grammar's.
    let one = format!("\"<tool_call>\" {WS_RULE} {CALL_RULE} {WS_RULE} \"</tool_call>\"");
    let root = match syntax {
        ToolSyntax::Hermes if max_calls > 1 => format!("root ::= {one} ({WS_RULE} {one}){{0,{}}}", max_calls - 1),
        ToolSyntax::Hermes => format!("root ::= {one}"),
        ToolSyntax::Llama3 => format!("root ::= {CALL_RULE}"),
        ToolSyntax::Mistral => format!("root ::= \"[TOOL_CALLS]\" {WS_RULE} {CALL_RULE}"),
    };
    Ok(format!("{root}\n{WS_RULE} ::= [ \\t\\n]{{0,4}}\n{body}"))
}

/// `grammar` with its start rule renamed [`CALL_RULE`].
fn rename_root(grammar: &str) -> String {
    grammar
        .lines()
        .map(|line| match line.strip_prefix("root ::=") {
            Some(rest) => format!("{CALL_RULE} ::={rest}"),
            None => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The system message revis adds for a template that offers no functions.
pub fn generic_instructions(tools: &[Tool]) -> String {
    let mut text =
        String::from("You can call functions to help answer. Each function is described by a JSON object on a line of its own:\n");
    for t in tools {
        text.push_str(&json!({"name": t.name, "description": t.description, "parameters": t.schema()}).to_string());
        text.push('\n');
    }
    text.push_str(
        "To call a function, answer with nothing but:\n<tool_call>\n{\"name\": \"the function's name\", \"arguments\": {the arguments as a JSON object}}\n</tool_call>\nA function's result comes back to you between <tool_response> and </tool_response>. When no function is needed, answer in plain text.",
    );
    text
}

/// A call written as Hermes's syntax writes it.
fn hermes_call(c: &crate::ToolCall) -> String {
    format!("<tool_call>\n{}\n</tool_call>", json!({"name": c.name, "arguments": c.arguments_json()}))
}

/// The conversation for a template that offers no functions: the
/// functions' instructions first (in the system message, or one of their
/// own), each earlier call as its Hermes text in the assistant's message,
/// each run of tool results as one user message.
fn generic_messages(messages: &[Message], tools: &[Tool]) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len() + 1);
    if !tools.is_empty() {
        let instructions = generic_instructions(tools);
        match messages.first() {
            Some(m) if m.role == Role::System => {}
            _ => out.push(Message::new(Role::System, instructions.clone())),
        }
        for (i, m) in messages.iter().enumerate() {
            if i == 0 && m.role == Role::System {
                out.push(Message::new(Role::System, format!("{}\n\n{instructions}", m.content)));
            } else {
                out.push(m.clone());
            }
        }
    } else {
        out.extend(messages.iter().cloned());
    }
    let mut merged: Vec<Message> = Vec::with_capacity(out.len());
    let mut last_was_tool = false;
    for m in out {
        match m.role {
            Role::Tool => {
                let block = format!("<tool_response>\n{}\n</tool_response>", m.content);
                match merged.last_mut() {
                    Some(prev) if last_was_tool => {
                        prev.content.push('\n');
                        prev.content.push_str(&block);
                    }
                    _ => merged.push(Message::new(Role::User, block)),
                }
                last_was_tool = true;
                continue;
            }
            Role::Assistant if !m.tool_calls.is_empty() => {
                let calls: Vec<String> = m.tool_calls.iter().map(hermes_call).collect();
                let content = if m.content.is_empty() { calls.join("\n") } else { format!("{}\n{}", m.content, calls.join("\n")) };
                merged.push(Message::new(Role::Assistant, content));
            }
            _ => merged.push(Message { tool_calls: Vec::new(), tool_call_id: String::new(), name: String::new(), ..m }),
        }
        last_was_tool = false;
    }
    merged
}

/// Reads an answer's text as it streams: text before a call's opening is
/// passed on (the end of it held back while it could still be the start of
/// the opening); from the opening on it is kept for [`ToolStream::finish`].
#[derive(Debug)]
pub struct ToolStream {
    syntax: ToolSyntax,
    held: String,
    call: Option<String>,
    /// Everything passed on so far.
    shown: String,
}

impl ToolStream {
    pub fn new(syntax: ToolSyntax) -> ToolStream {
        ToolStream { syntax, held: String::new(), call: None, shown: String::new() }
    }

    /// The text of `piece` that is plain answer, as far as known now.
    pub fn push(&mut self, piece: &str) -> String {
        let out = self.pass(piece);
        self.shown.push_str(&out);
        out
    }

    fn pass(&mut self, piece: &str) -> String {
        if let Some(call) = &mut self.call {
            call.push_str(piece);
            return String::new();
        }
        self.held.push_str(piece);
        let opening = self.syntax.opening();
        if let Some(at) = self.held.find(opening) {
            self.call = Some(self.held[at..].to_owned());
            self.held.truncate(at);
            return std::mem::take(&mut self.held);
        }
        let keep = (1..opening.len()).rev().find(|&n| self.held.ends_with(&opening[..n])).unwrap_or(0);
        let pass = self.held.len() - keep;
        let out = self.held[..pass].to_owned();
        self.held.drain(..pass);
        out
    }

    /// At the answer's end: the rest of its plain text, the calls, and the
    /// whole plain text (all [`ToolStream::push`] passed on, then the rest).
    /// A call cut short (`cut`: the answer ran out of tokens) is dropped,
    /// never shown as text in revis's call syntax; an opening followed by
    /// what does not read as a call, in an answer that ended by itself, was
    /// the model's prose and is given back as text.
    pub fn finish(self, cut: bool) -> (String, Vec<ToolCall>, String) {
        let (rest, calls) = match self.call {
            // The opening itself cut short.
            None if cut && !self.held.is_empty() && self.syntax.opening().starts_with(self.held.as_str()) => (String::new(), Vec::new()),
            None => (self.held, Vec::new()),
            Some(text) => match read_calls(self.syntax, &text) {
                Some(calls) if !calls.is_empty() => (self.held, calls),
                _ if cut => (self.held, Vec::new()),
                _ => (self.held + &text, Vec::new()),
            },
        };
        let shown = self.shown + &rest;
        (rest, calls, shown)
    }
}

/// The calls in `text`, which starts at the syntax's opening; None when it
/// does not read as calls.
pub fn read_calls(syntax: ToolSyntax, text: &str) -> Option<Vec<ToolCall>> {
    let objects: Vec<Json> = match syntax {
        ToolSyntax::Hermes => {
            let mut found = Vec::new();
            let mut rest = text.trim();
            while !rest.is_empty() {
                let body = rest.strip_prefix("<tool_call>")?;
                let Some((inside, after)) = body.split_once("</tool_call>") else {
                    // A last call cut short (max_tokens): the whole ones before it stand.
                    if found.is_empty() {
                        return None;
                    }
                    break;
                };
                found.push(serde_json::from_str(inside.trim()).ok()?);
                rest = after.trim_start();
            }
            found
        }
        ToolSyntax::Llama3 => {
            let mut found = Vec::new();
            for part in serde_json::Deserializer::from_str(text.trim()).into_iter::<Json>() {
                found.push(part.ok()?);
            }
            found
        }
        ToolSyntax::Mistral => match serde_json::from_str(text.trim().strip_prefix("[TOOL_CALLS]")?.trim()).ok()? {
            Json::Array(items) => items,
            _ => return None,
        },
    };
    objects
        .into_iter()
        .map(|o| {
            let name = o.get("name")?.as_str()?.to_owned();
            let args = o.get("arguments").or_else(|| o.get("parameters")).cloned().unwrap_or_else(|| json!({}));
            let arguments = match args {
                Json::String(s) => s,
                other => other.to_string(),
            };
            Some(ToolCall { id: call_id(), name, arguments })
        })
        .collect()
}

/// A new call's ID: 9 letters and digits (Mistral's templates ask for
/// exactly that; OpenAI's clients take any string).
pub fn call_id() -> String {
    use rand::Rng;
    const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut rng = rand::rng();
    (0..9).map(|_| ALNUM[rng.random_range(0..ALNUM.len())] as char).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Tool {
        Tool {
            name: "get_weather".into(),
            description: "The weather in a city".into(),
            parameters: r#"{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}"#.into(),
        }
    }

    fn fake_grammar(schema: &str) -> Result<String, EngineError> {
        Ok(format!("root ::= object\nobject ::= \"{{\" # {}", schema.len()))
    }

    #[test]
    fn text_before_a_call_streams_and_the_call_is_read_at_the_end() {
        let mut s = ToolStream::new(ToolSyntax::Hermes);
        let mut shown = String::new();
        for piece in
            ["Let me ", "check.<tool", "_call>\n{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"]
        {
            shown += &s.push(piece);
        }
        assert_eq!(shown, "Let me check.");
        let (rest, calls, shown) = s.finish(false);
        assert_eq!((rest.as_str(), shown.as_str()), ("", "Let me check."));
        assert_eq!((calls[0].name.as_str(), calls[0].arguments.as_str()), ("get_weather", r#"{"city":"Paris"}"#));
        assert_eq!(calls[0].id.len(), 9);
    }

    #[test]
    fn a_held_back_start_that_is_not_an_opening_is_text_after_all() {
        let mut s = ToolStream::new(ToolSyntax::Hermes);
        assert_eq!(s.push("a <tool"), "a ");
        assert_eq!(s.push("box>"), "<toolbox>");
        assert_eq!(s.push(" <"), " ");
        assert_eq!(s.finish(false), ("<".to_owned(), Vec::new(), "a <toolbox> <".to_owned()));
    }

    #[test]
    fn a_call_cut_short_is_dropped_and_one_that_never_was_is_text() {
        let mut s = ToolStream::new(ToolSyntax::Hermes);
        assert_eq!(s.push("Checking. <tool_call>\n{\"name\": \"get_w"), "Checking. ");
        assert_eq!(s.finish(true), (String::new(), Vec::new(), "Checking. ".to_owned()), "no call syntax as text");
        let mut s = ToolStream::new(ToolSyntax::Hermes);
        assert_eq!(s.push("<tool_call> is how I call."), "");
        let prose = "<tool_call> is how I call.".to_owned();
        assert_eq!(s.finish(false), (prose.clone(), Vec::new(), prose));
        let mut s = ToolStream::new(ToolSyntax::Hermes);
        assert_eq!(s.push("<tool_"), "");
        assert_eq!(s.finish(true), (String::new(), Vec::new(), String::new()), "the opening cut short");
    }

    #[test]
    fn each_syntax_reads_its_calls() {
        let two = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 1}\"}\n</tool_call>";
        let calls = read_calls(ToolSyntax::Hermes, two).unwrap();
        assert_eq!(calls.iter().map(|c| (c.name.as_str(), c.arguments.as_str())).collect::<Vec<_>>(), [("a", "{}"), ("b", "{\"x\": 1}")]);
        let llama = read_calls(ToolSyntax::Llama3, "{\"name\": \"a\", \"parameters\": {\"q\": \"x\"}}").unwrap();
        assert_eq!(llama[0].arguments, r#"{"q":"x"}"#);
        let mistral =
            read_calls(ToolSyntax::Mistral, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {}}]")
                .unwrap();
        assert_eq!(mistral.len(), 2);
        assert_eq!(read_calls(ToolSyntax::Hermes, "<tool_call>\nnot json\n</tool_call>"), None);
        let cut = read_calls(ToolSyntax::Hermes, &format!("{two}\n<tool_call>\n{{\"name\": \"c\", \"argu")).unwrap();
        assert_eq!(cut.len(), 2, "the whole calls before one cut short");
        assert_eq!(read_calls(ToolSyntax::Hermes, "<tool_call>\n{\"name\": \"a\"}\n</tool_call> and text"), None);
    }

    #[test]
    fn the_grammar_wraps_the_schema_in_the_syntax() {
        let generic = ToolFormat { native: false, syntax: ToolSyntax::Hermes };
        let msgs = [Message::new(Role::User, "weather?")];
        let p = plan(generic, &msgs, &[weather()], &ToolChoice::Required, false, fake_grammar).unwrap();
        let g = p.grammar.unwrap();
        assert!(g.triggers.is_empty(), "required: from the first token");
        assert!(
            g.text.starts_with("root ::= \"<tool_call>\" revis-ws revis-tool-call revis-ws \"</tool_call>\"\nrevis-ws ::= [ \\t\\n]{0,4}\nrevis-tool-call ::= object"),
            "{}",
            g.text
        );
        let p = plan(generic, &msgs, &[weather()], &ToolChoice::Auto, true, fake_grammar).unwrap();
        let g = p.grammar.unwrap();
        assert_eq!(g.triggers, ["<tool_call>"]);
        assert!(g.text.contains(&format!("{{0,{}}}", MAX_PARALLEL_CALLS - 1)), "{}", g.text);
        let e = plan(generic, &msgs, &[weather()], &ToolChoice::Named("nope".into()), false, fake_grammar).unwrap_err();
        assert!(e.to_string().contains("\"nope\""), "{e}");
        let p = plan(generic, &msgs, &[weather()], &ToolChoice::None, false, fake_grammar).unwrap();
        assert!(p.grammar.is_none() && p.messages == msgs, "none: not offered");
    }

    #[test]
    fn a_template_without_tools_gets_them_as_text() {
        let generic = ToolFormat { native: false, syntax: ToolSyntax::Hermes };
        let call = ToolCall { id: "call00001".into(), name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() };
        let msgs = [
            Message::new(Role::System, "Be brief."),
            Message::new(Role::User, "weather?"),
            Message { role: Role::Assistant, tool_calls: vec![call], ..Message::default() },
            Message { role: Role::Tool, content: "18 C".into(), tool_call_id: "call00001".into(), ..Message::default() },
            Message { role: Role::Tool, content: "sunny".into(), ..Message::default() },
        ];
        let p = plan(generic, &msgs, &[weather()], &ToolChoice::Auto, false, fake_grammar).unwrap();
        let roles: Vec<Role> = p.messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::System, Role::User, Role::Assistant, Role::User]);
        assert!(p.messages[0].content.starts_with("Be brief.\n\nYou can call functions"));
        assert!(p.messages[0].content.contains("\"name\":\"get_weather\""));
        assert_eq!(p.messages[2].content, "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>");
        assert_eq!(p.messages[3].content, "<tool_response>\n18 C\n</tool_response>\n<tool_response>\nsunny\n</tool_response>");
        assert!(p.tools.is_empty() && p.messages.iter().all(|m| m.tool_calls.is_empty()));
        let native = ToolFormat { native: true, syntax: ToolSyntax::Hermes };
        let p = plan(native, &msgs, &[weather()], &ToolChoice::Auto, false, fake_grammar).unwrap();
        assert_eq!((p.messages.len(), p.tools.len()), (5, 1), "a template with tools gets them as they are");
    }
}
