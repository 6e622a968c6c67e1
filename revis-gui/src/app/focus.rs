//! The ids of the text boxes that keyboard shortcuts focus: the chat view
//! gives its boxes these ids, the window's shortcuts focus them by it.

/// The search box and the message box, for the shortcuts that focus them.
pub const SEARCH_ID: &str = "conversation-search";
pub const INPUT_ID: &str = "message-input";
