//! A model's own chat template (the GGUF's `tokenizer.chat_template`, Jinja)
//! rendered as Hugging Face's `apply_chat_template` renders it: minijinja
//! with blocks trimmed and left-stripped, loop controls, Python's string
//! methods (`minijinja_contrib::pycompat`), `raise_exception`,
//! `strftime_now`, and a `tojson` that writes what Python's `json.dumps`
//! writes (`", "` and `": "` between items, keys in their order, non-ASCII
//! kept). Each rendering has a fuel budget ([`TEMPLATE_FUEL`]), so a
//! template that loops without end fails instead of hanging a tokenizer
//! thread; the sizes a template may ask for at once (`indent`, `tojson`'s
//! indent, format widths) are bounded ([`MAX_TEMPLATE_WIDTH`]), as is the
//! text it makes ([`MAX_RENDERED_BYTES`]). The time a rendering takes is
//! bounded by revisd (`daemon.render_timeout_s`, `rpc/prompt.rs`), which
//! stops using a template past it; memory built up step by step within the
//! fuel (a string doubled in a loop) is bounded by rendering in a process
//! of its own with an address-space limit ([`crate::render`]).

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::{Map, Value as Json, json};

use crate::tools::{ToolFormat, ToolSyntax};
use crate::{EngineError, Message, Tool};

/// Instructions one rendering may run (minijinja's fuel): some thousand
/// times what a long chat with tools takes, so only a runaway template
/// meets it.
pub const TEMPLATE_FUEL: u64 = 50_000_000;

/// The widest a template may ask `indent`, `tojson(indent=…)` or a format
/// width (`"%5s"`, `"{:>5}"`) to be: a GGUF's template is another's text,
/// and `indent(30000000000)` asked for 30 GB at once (revisd aborted). Real
/// templates use 2 or 4.
pub const MAX_TEMPLATE_WIDTH: usize = 1_000;

/// The longest text one rendering may make; a prompt is at most the
/// context (131,072 tokens, some bytes each), so only a runaway template
/// meets it.
pub const MAX_RENDERED_BYTES: usize = 16 << 20;

/// A compiled chat template and the special tokens it is given.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    tools: ToolFormat,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("bos", &self.bos).field("eos", &self.eos).field("tools", &self.tools).finish()
    }
}

impl ChatTemplate {
    /// Compiles `source`; `bos` and `eos` are the model's special tokens as
    /// text (the template's `bos_token` and `eos_token`).
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<ChatTemplate, EngineError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(|state, value, method, args| {
            if method == "format"
                && let Some(s) = value.as_str()
            {
                check_format_widths(s)?;
            }
            minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
        });
        env.add_filter("tojson", tojson);
        env.add_filter("indent", indent);
        env.add_filter("format", |state: &minijinja::State, format: &Value, args: minijinja::value::Rest<Value>| {
            if let Some(s) = format.as_str() {
                check_format_widths(s)?;
            }
            minijinja::filters::format(state, format, args)
        });
        env.add_function("raise_exception", |message: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_function("strftime_now", |format: String| Value::from(strftime(&format, now_utc())));
        env.add_template_owned("chat_template", source.to_owned())
            .map_err(|e| EngineError::Template(format!("the model's chat template does not compile: {e}")))?;
        Ok(ChatTemplate { env, bos: bos.to_owned(), eos: eos.to_owned(), tools: ToolFormat::of_template(source) })
    }

    /// How this template offers functions and writes their calls.
    pub fn tool_format(&self) -> ToolFormat {
        self.tools
    }

    /// The text `apply_chat_template` makes of `messages` and `tools`
    /// (`tools` = None when empty), `bos_token` included where the template
    /// writes it.
    pub fn render(&self, messages: &[Message], tools: &[Tool], add_generation_prompt: bool) -> Result<String, EngineError> {
        self.render_context(&self.context(messages, tools, add_generation_prompt))
    }

    /// What the template is given to render `messages` and `tools`: the
    /// messages in OpenAI's shape and the special tokens as text.
    pub fn context(&self, messages: &[Message], tools: &[Tool], add_generation_prompt: bool) -> Json {
        json!({
            "messages": messages.iter().map(message_json).collect::<Vec<_>>(),
            "tools": (!tools.is_empty()).then(|| tools.iter().map(Tool::openai_json).collect::<Vec<_>>()),
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos,
            "eos_token": self.eos,
        })
    }

    /// Renders a [`ChatTemplate::context`] (in revisd, in a rendering
    /// process of its own: [`crate::render`]).
    pub fn render_context(&self, context: &Json) -> Result<String, EngineError> {
        let template = self.env.get_template("chat_template").map_err(|e| EngineError::Template(e.to_string()))?;
        let text = template.render(Value::from_serialize(context)).map_err(|e| EngineError::Template(template_error(&e)))?;
        if text.len() > MAX_RENDERED_BYTES {
            return Err(EngineError::Template(format!(
                "the model's chat template made {} bytes of prompt; revis's limit is {MAX_RENDERED_BYTES}",
                text.len()
            )));
        }
        Ok(text)
    }
}

/// A rendering error as a sentence: the template's own message for
/// `raise_exception` (a conversation the model does not take), else
/// minijinja's, with where.
fn template_error(e: &Error) -> String {
    match (e.kind(), e.detail()) {
        (ErrorKind::InvalidOperation, Some(detail)) => format!("the model's chat template refuses this conversation: {detail}"),
        (ErrorKind::OutOfFuel, _) => format!("the model's chat template ran past its budget of {TEMPLATE_FUEL} instructions"),
        _ => format!("the model's chat template failed: {e}"),
    }
}

/// A message as templates read it: OpenAI's shape, tool-call arguments as
/// an object (as Hugging Face's templates expect), keys only where set.
fn message_json(m: &Message) -> Json {
    let mut o = Map::new();
    o.insert("role".into(), m.role.as_str().into());
    o.insert("content".into(), m.content.clone().into());
    if !m.tool_calls.is_empty() {
        let calls = m
            .tool_calls
            .iter()
            .map(|c| {
                json!({
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments_json()},
                })
            })
            .collect::<Vec<_>>();
        o.insert("tool_calls".into(), calls.into());
    }
    if !m.tool_call_id.is_empty() {
        o.insert("tool_call_id".into(), m.tool_call_id.clone().into());
    }
    if !m.name.is_empty() {
        o.insert("name".into(), m.name.clone().into());
    }
    Json::Object(o)
}

/// An error if `width` is over [`MAX_TEMPLATE_WIDTH`].
fn check_width(what: &str, width: usize) -> Result<(), Error> {
    if width > MAX_TEMPLATE_WIDTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("{what} {width} is over revis's limit of {MAX_TEMPLATE_WIDTH} for a chat template"),
        ));
    }
    Ok(())
}

/// An error if a format string names a width or precision over
/// [`MAX_TEMPLATE_WIDTH`]: the numbers of a `%` conversion (`%-30s`,
/// `%.5f`) or of a `{…:spec}` field (`{:>30}`, `{0:.5}`); the text around
/// them is not looked at.
fn check_format_widths(format: &str) -> Result<(), Error> {
    let numbers = |spec: &str| -> Vec<usize> {
        spec.split(|c: char| !c.is_ascii_digit()).filter(|r| !r.is_empty()).map(|r| r.parse().unwrap_or(usize::MAX)).collect()
    };
    let bytes = format.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                // Flags, width, precision: up to the conversion letter.
                let end = format[i + 1..]
                    .find(|c: char| !matches!(c, '-' | '+' | ' ' | '#' | '0'..='9' | '.'))
                    .map_or(bytes.len(), |e| i + 1 + e);
                for n in numbers(&format[i + 1..end]) {
                    check_width("a format width", n)?;
                }
                i = end + 1;
            }
            b'{' if bytes.get(i + 1) == Some(&b'{') => i += 2,
            b'{' => {
                let end = format[i..].find('}').map_or(bytes.len(), |e| i + e);
                if let Some((_, spec)) = format[i + 1..end].split_once(':') {
                    for n in numbers(spec) {
                        check_width("a format width", n)?;
                    }
                }
                i = end + 1;
            }
            _ => i += 1,
        }
    }
    Ok(())
}

/// minijinja's `indent`, its width bounded.
fn indent(
    value: minijinja::value::StringInput<'_>,
    width: Option<usize>,
    first: Option<bool>,
    blank: Option<bool>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let w = match width {
        Some(w) => w,
        None => kwargs.get::<Option<usize>>("width")?.unwrap_or(4),
    };
    check_width("indent width", w)?;
    minijinja::filters::indent(value, width, first, blank, kwargs)
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`, as transformers' `tojson`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    if let Some(n) = indent {
        check_width("tojson indent", n)?;
    }
    let json = serde_json::to_value(&value).map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings")),
        // Python's defaults: no space before a newline when indenting.
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let style = PyJson { indent, item, key, sort_keys: sort_keys.unwrap_or(false), ascii: ensure_ascii.unwrap_or(false) };
    let mut out = String::new();
    style.write(&json, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

/// How Python's `json.dumps` was asked to write.
struct PyJson {
    indent: Option<usize>,
    item: String,
    key: String,
    sort_keys: bool,
    ascii: bool,
}

impl PyJson {
    fn write(&self, v: &Json, depth: usize, out: &mut String) {
        match v {
            Json::Array(items) if !items.is_empty() => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    self.separate(i, depth + 1, out);
                    self.write(item, depth + 1, out);
                }
                self.close(depth, out);
                out.push(']');
            }
            Json::Object(map) if !map.is_empty() => {
                out.push('{');
                let mut entries: Vec<_> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                for (i, (k, item)) in entries.into_iter().enumerate() {
                    self.separate(i, depth + 1, out);
                    self.string(k, out);
                    out.push_str(&self.key);
                    self.write(item, depth + 1, out);
                }
                self.close(depth, out);
                out.push('}');
            }
            Json::String(s) => self.string(s, out),
            Json::Number(n) if n.is_f64() => out.push_str(&python_float(n.as_f64().unwrap_or_default())),
            other => out.push_str(&other.to_string()),
        }
    }

    /// Before the `i`th item of a container.
    fn separate(&self, i: usize, depth: usize, out: &mut String) {
        if i > 0 {
            out.push_str(&self.item);
        }
        if let Some(n) = self.indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    }

    /// Before a non-empty container's closing bracket.
    fn close(&self, depth: usize, out: &mut String) {
        if let Some(n) = self.indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    }

    fn string(&self, s: &str, out: &mut String) {
        let quoted = Json::String(s.to_owned()).to_string();
        if !self.ascii {
            out.push_str(&quoted);
            return;
        }
        for c in quoted.chars() {
            if c.is_ascii() {
                out.push(c);
            } else {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
    }
}

/// A float as Python's `repr` writes it: integral values keep `.0`.
fn python_float(f: f64) -> String {
    if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e16 { format!("{f:.1}") } else { format!("{f}") }
}

/// Seconds since the Unix epoch.
fn now_utc() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

const MONTHS: [&str; 12] =
    ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// Python's `datetime.now().strftime(format)` for the directives chat
/// templates use (dates: `%d %b %B %m %y %Y %a %A %j`; times: `%H %M %S`;
/// `%%`), in UTC; other directives are kept as written.
fn strftime(format: &str, unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (y, m, d) = civil(days);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('B') => out.push_str(MONTHS[m as usize - 1]),
            Some('b') => out.push_str(&MONTHS[m as usize - 1][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('H') => out.push_str(&format!("{:02}", secs / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The date of a day counted from 1970-01-01 (proleptic Gregorian).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The day count of a date (the inverse of [`civil`]).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Whether a template offers functions itself, and how it writes calls.
impl ToolFormat {
    /// Read from the template's text: one that reads `tools` offers them;
    /// `[TOOL_CALLS]` is Mistral's syntax, `<|python_tag|>` or `ipython`
    /// Llama 3.1's; anything else calls in Hermes's `<tool_call>` form
    /// (Qwen, Hermes, SmolLM3, and revis's generic prompt).
    pub fn of_template(source: &str) -> ToolFormat {
        let syntax = if source.contains("[TOOL_CALLS]") {
            ToolSyntax::Mistral
        } else if source.contains("<|python_tag|>") || source.contains("ipython") {
            ToolSyntax::Llama3
        } else {
            ToolSyntax::Hermes
        };
        let native = source.contains("tools");
        ToolFormat { native, syntax: if native { syntax } else { ToolSyntax::Hermes } }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Role;

    fn render(source: &str, messages: &[Message]) -> String {
        ChatTemplate::new(source, "<s>", "</s>").unwrap().render(messages, &[], true).unwrap()
    }

    #[test]
    fn tojson_writes_what_python_json_dumps_writes() {
        let t = ChatTemplate::new("{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ s | tojson }}", "", "").unwrap();
        let env = &t.env;
        let out = env
            .get_template("chat_template")
            .unwrap()
            .render(minijinja::context! { x => Value::from_serialize(json!({"b": [1, 2.0, {}], "a": "Grüße"})), s => "東\"" })
            .unwrap();
        assert_eq!(
            out,
            "{\"b\": [1, 2.0, {}], \"a\": \"Grüße\"}|{\n  \"b\": [\n    1,\n    2.0,\n    {}\n  ],\n  \"a\": \"Grüße\"\n}|\"東\\\"\""
        );
    }

    #[test]
    fn a_raised_exception_is_the_templates_own_sentence() {
        let t = ChatTemplate::new("{{ raise_exception('Conversation roles must alternate') }}", "", "").unwrap();
        let e = t.render(&[Message::new(Role::User, "hi")], &[], true).unwrap_err().to_string();
        assert!(e.contains("refuses this conversation: Conversation roles must alternate"), "{e}");
    }

    #[test]
    fn sizes_a_template_asks_for_are_bounded_and_ordinary_ones_render() {
        // Each of these asked for 30 GB at once and aborted revisd.
        let hostile = [
            ("{{ messages[0].content | indent(30000000000) }}", "indent width 30000000000"),
            ("{{ messages[0].content | indent(width=30000000000) }}", "indent width 30000000000"),
            ("{{ messages | tojson(indent=30000000000) }}", "tojson indent 30000000000"),
            ("{{ '%30000000000s' | format('a') }}", "a format width 30000000000"),
            ("{{ '%.30000000000f' | format(1.5) }}", "a format width 30000000000"),
            ("{{ '{:>30000000000}'.format('a') }}", "a format width 30000000000"),
        ];
        let hi = [Message::new(Role::User, "hi\nthere")];
        for (source, said) in hostile {
            let e = ChatTemplate::new(source, "", "").unwrap().render(&hi, &[], false).unwrap_err().to_string();
            assert!(e.contains(said) && e.contains("limit of 1000"), "{source}: {e}");
        }
        let ordinary = "{{ messages[0].content | indent(4, first=true) }}|{{ '%-5s|%.2f' | format('a', 1.5) }}|\
                        {{ 'In 2026, {}: {:>4}'.format('x', 'y') }}|{{ {'a': 1} | tojson(indent=2) }}";
        let text = ChatTemplate::new(ordinary, "", "").unwrap().render(&hi, &[], false).unwrap();
        assert_eq!(text, "    hi\n    there|a    |1.50|In 2026, x:    y|{\n  \"a\": 1\n}");
        // Within the fuel but past the rendered size: refused, not sent on.
        let big = ChatTemplate::new("{% for i in range(200) %}{{ 'x' * 100000 }}{% endfor %}", "", "").unwrap();
        let e = big.render(&hi, &[], false).unwrap_err().to_string();
        assert!(e.contains("20000000 bytes") && e.contains(&MAX_RENDERED_BYTES.to_string()), "{e}");
    }

    #[test]
    fn a_template_that_never_ends_runs_out_of_fuel() {
        let t = ChatTemplate::new("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", "", "").unwrap();
        let e = t.render(&[Message::new(Role::User, "hi")], &[], true).unwrap_err().to_string();
        assert!(e.contains("budget"), "{e}");
    }

    #[test]
    fn blocks_are_trimmed_and_python_string_methods_work() {
        let source =
            "{% for m in messages %}\n  {% if m.content.startswith('x') %}{{ m.content.strip() | upper }}{% endif %}\n{% endfor %}";
        assert_eq!(render(source, &[Message::new(Role::User, "x y "), Message::new(Role::User, "z")]), "X Y");
    }

    #[test]
    fn strftime_writes_pythons_dates() {
        // 2026-12-04 13:05:09 UTC, a Friday.
        let t = 1_796_389_509;
        assert_eq!(strftime("%d %b %Y|%B %m %y|%A %a %j|%H:%M:%S %%", t), "04 Dec 2026|December 12 26|Friday Fri 338|13:05:09 %");
        assert_eq!(civil(days_from_civil(2024, 2, 29)), (2024, 2, 29));
    }

    #[test]
    fn the_tool_syntax_is_read_from_the_template() {
        assert_eq!(ToolFormat::of_template("{{ messages }}"), ToolFormat { native: false, syntax: ToolSyntax::Hermes });
        assert_eq!(ToolFormat::of_template("{% if tools %}[TOOL_CALLS]{% endif %}").syntax, ToolSyntax::Mistral);
        assert_eq!(ToolFormat::of_template("{% if tools %}<|python_tag|>{% endif %}").syntax, ToolSyntax::Llama3);
        assert!(ToolFormat::of_template("{% if tools %}<tool_call>{% endif %}").native);
    }
}
