//! A loaded model's tokenizer: its chat template (its own, rendered here or
//! in rendering processes, or llama.cpp's built-in one), tokenizing, and
//! the grammars it checks before a request is queued, with two small caches
//! of those that compiled lately.

use std::sync::Arc;

use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;

use crate::render::Renderers;
use crate::{ChatTemplate, EngineError, Message, Token, Tokenizer, Tool, ToolFormat};

/// A model's chat template: its own, or llama.cpp's built-in one where the
/// GGUF has none.
pub(super) enum Template {
    Jinja(Box<Jinja>),
    Builtin(LlamaChatTemplate),
}

/// A model's own template: compiled here (it is checked at load, and tells
/// how functions are offered), rendered here or in rendering processes
/// ([`crate::render`]).
pub(super) struct Jinja {
    pub(super) template: ChatTemplate,
    pub(super) source: String,
    pub(super) renderers: Option<Renderers>,
}

pub(super) struct LlamaTokenizer {
    pub(super) model: Arc<LlamaModel>,
    pub(super) template: Template,
    pub(super) n_ctx: u32,
    pub(super) add_bos: bool,
    /// Schemas compiled lately and their grammars, the latest first: an
    /// agent offers the same functions request after request.
    pub(super) grammars: std::sync::Mutex<Vec<(String, String)>>,
    /// Function-call grammars that compiled lately, the latest first.
    pub(super) checked: std::sync::Mutex<Vec<String>>,
    /// BOS as text, as a template writes it.
    pub(super) bos_text: String,
}

/// Compiled grammars a tokenizer keeps ([`LlamaTokenizer::grammars`]).
const GRAMMARS_KEPT: usize = 16;

impl Tokenizer for LlamaTokenizer {
    fn render(&self, messages: &[Message], tools: &[Tool], add_generation_prompt: bool) -> Result<String, EngineError> {
        if messages.is_empty() {
            return Ok(String::new());
        }
        match &self.template {
            Template::Jinja(t) => {
                let text = match &t.renderers {
                    None => t.template.render(messages, tools, add_generation_prompt)?,
                    Some(r) => r.render(&t.source, &t.template.context(messages, tools, add_generation_prompt))?,
                };
                // The template writes BOS as text where tokenizing adds it
                // (Gemma's `{{ bos_token }}`): once is enough.
                match text.strip_prefix(self.bos_text.as_str()) {
                    Some(rest) if self.add_bos && !self.bos_text.is_empty() => Ok(rest.to_owned()),
                    _ => Ok(text),
                }
            }
            Template::Builtin(t) => {
                let chat = messages
                    .iter()
                    .map(|m| LlamaChatMessage::new(m.role.as_str().to_owned(), m.content.clone()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| EngineError::Template(e.to_string()))?;
                self.model.apply_chat_template(t, &chat, add_generation_prompt).map_err(|e| EngineError::Template(e.to_string()))
            }
        }
    }

    fn tool_format(&self) -> ToolFormat {
        match &self.template {
            Template::Jinja(t) => t.template.tool_format(),
            Template::Builtin(_) => ToolFormat { native: false, syntax: crate::tools::ToolSyntax::Hermes },
        }
    }

    fn tokenize(&self, text: &str, add_bos: bool) -> Vec<Token> {
        to_ids(self.model.vocab().tokenize(text.as_bytes(), add_bos && self.add_bos, true))
    }

    fn tokenize_plain(&self, text: &str) -> Vec<Token> {
        to_ids(self.model.vocab().tokenize(text.as_bytes(), false, false))
    }

    fn n_ctx(&self) -> u32 {
        self.n_ctx
    }

    fn check_grammar(&self, grammar: &crate::Grammar) -> Result<(), EngineError> {
        let lock = || self.checked.lock().unwrap_or_else(|e| e.into_inner());
        if lock().contains(&grammar.text) {
            return Ok(());
        }
        LlamaSampler::grammar(&self.model, &grammar.text, "root")
            .map_err(|e| EngineError::Tools(format!("the functions' grammar does not compile: {e}")))?;
        let mut kept = lock();
        kept.insert(0, grammar.text.clone());
        kept.truncate(GRAMMARS_KEPT);
        Ok(())
    }

    fn json_grammar(&self, schema: Option<&str>) -> Result<String, EngineError> {
        let schema = schema.unwrap_or(r#"{"type":"object"}"#);
        let mut kept = self.grammars.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = kept.iter().position(|(s, _)| s == schema) {
            let hit = kept.remove(at);
            let grammar = hit.1.clone();
            kept.insert(0, hit);
            return Ok(grammar);
        }
        drop(kept);
        let grammar = self.compile_json_grammar(schema)?;
        let mut kept = self.grammars.lock().unwrap_or_else(|e| e.into_inner());
        kept.insert(0, (schema.to_owned(), grammar.clone()));
        kept.truncate(GRAMMARS_KEPT);
        Ok(grammar)
    }
}

impl LlamaTokenizer {
    /// A JSON schema's grammar, checked by compiling it once.
    fn compile_json_grammar(&self, schema: &str) -> Result<String, EngineError> {
        let value: serde_json::Value = serde_json::from_str(schema).map_err(|e| EngineError::InvalidSchema(format!("not JSON: {e}")))?;
        if !value.is_object() {
            return Err(EngineError::InvalidSchema("a JSON schema must be a JSON object".into()));
        }
        let grammar = llama_cpp_2::json_schema_to_grammar(schema).map_err(|e| EngineError::InvalidSchema(e.to_string()))?;
        // Compile it once here so a grammar llama.cpp rejects fails before queueing.
        LlamaSampler::grammar(&self.model, &grammar, "root")
            .map_err(|e| EngineError::InvalidSchema(crate::grammar::over_repetition_limit(&grammar).unwrap_or_else(|| e.to_string())))?;
        Ok(grammar)
    }
}

pub(super) fn to_ids(tokens: Vec<LlamaToken>) -> Vec<Token> {
    tokens.into_iter().map(|t| t.0 as Token).collect()
}
