//! A conversation's messages: who speaks ([`Role`]), what they say, and the
//! function calls an assistant's message made ([`ToolCall`]).

use serde_json::Value as Json;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Role {
    System,
    #[default]
    User,
    Assistant,
    /// A tool's result, answering an assistant's [`ToolCall`].
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// The calls an assistant message made (see [`crate::tools`]).
    pub tool_calls: Vec<ToolCall>,
    /// A tool message: the call it answers (empty when the caller gave none).
    pub tool_call_id: String,
    /// A tool message: the function that answered (empty when unknown).
    pub name: String,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Message {
        Message { role, content: content.into(), ..Message::default() }
    }
}

/// A call the model made, or an earlier one in the conversation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolCall {
    /// Names the call, so a tool message can say which one it answers.
    pub id: String,
    pub name: String,
    /// The arguments, a JSON object as text.
    pub arguments: String,
}

impl ToolCall {
    /// The arguments as JSON (a string when they are not JSON).
    pub fn arguments_json(&self) -> Json {
        serde_json::from_str(&self.arguments).unwrap_or_else(|_| Json::String(self.arguments.clone()))
    }
}
