//! The chat view: the conversations (search, rename, delete with undo), the
//! messages (answers as Markdown, only those near the viewport laid out),
//! each answer's actions and details, and the message box.

use std::time::{Duration, Instant};

use eframe::egui::{self, Key, KeyboardShortcut, Modifiers};
use revis_orchestrator::PrefillPhase;

use super::App;
use super::focus::{INPUT_ID, SEARCH_ID};
use crate::protocol::Command;
use crate::state::{Deep, Shown};

/// How long a deleted conversation can be brought back.
pub const UNDO_FOR: Duration = Duration::from_secs(10);
/// The height a message not yet laid out is assumed to have.
const UNLAID_HEIGHT: f32 = 60.0;

/// What a click in the message list asks for (applied after the list is drawn).
enum Action {
    Deeper(revis_store::MessageId),
    Edit(usize),
    CancelEdit,
    Resend(usize, String),
    Continue,
}

impl App {
    pub(super) fn chat(&mut self, ui: &mut egui::Ui) {
        egui::Panel::left("conversations").default_size(200.0).show(ui, |ui| self.conversations(ui));
        egui::Panel::bottom("input").show(ui, |ui| self.input(ui));
        egui::CentralPanel::default().show(ui, |ui| self.messages(ui));
    }

    fn conversations(&mut self, ui: &mut egui::Ui) {
        ui.add_space(6.0);
        let idle = !self.state.streaming;
        if ui.add_enabled(idle, egui::Button::new("New conversation")).on_hover_text("Ctrl+N").clicked() {
            self.new_conversation();
        }
        ui.add_space(4.0);
        let l = ui.label("Search conversations:");
        let search = egui::TextEdit::singleline(&mut self.state.search)
            .id(egui::Id::unique(SEARCH_ID))
            .hint_text("words in titles and messages (Ctrl+F)");
        if ui.add(search).labelled_by(l.id).changed() && !self.state.search.trim().is_empty() {
            self.send(Command::Search(self.state.search.clone()));
        }
        self.undo_bar(ui);
        ui.separator();
        let mut open = None;
        let mut rename: Option<(revis_store::ConversationId, String)> = None;
        let mut delete = None;
        egui::ScrollArea::vertical().show(ui, |ui| {
            let listed: Vec<revis_store::Conversation> = self.state.listed().into_iter().cloned().collect();
            if listed.is_empty() && !self.state.search.trim().is_empty() {
                ui.weak("No conversation holds that.");
            }
            for c in listed {
                let selected = self.state.current == Some(c.id);
                if let Some((id, title)) = self.state.renaming.as_mut().filter(|(id, _)| *id == c.id) {
                    let l = ui.label("New title:");
                    let r = ui.add(egui::TextEdit::singleline(title)).labelled_by(l.id);
                    r.request_focus();
                    if ui.input(|i| i.key_pressed(Key::Enter)) {
                        rename = Some((*id, title.clone()));
                    } else if ui.input(|i| i.key_pressed(Key::Escape)) {
                        rename = Some((*id, String::new()));
                    }
                    continue;
                }
                let title = if c.title.is_empty() { "(new conversation)" } else { &c.title };
                let r = ui.add_enabled(idle, egui::Button::selectable(selected, title));
                if r.clicked() && !selected {
                    open = Some(c.id);
                }
                if selected && idle {
                    ui.horizontal(|ui| {
                        if ui.small_button("Rename").on_hover_text("Rename this conversation").clicked() {
                            self.state.renaming = Some((c.id, c.title.clone()));
                        }
                        if ui
                            .small_button("Delete")
                            .on_hover_text("Delete this conversation (it can be undone for a few seconds)")
                            .clicked()
                        {
                            delete = Some(c.clone());
                        }
                    });
                }
            }
        });
        if let Some(id) = open {
            self.send(Command::OpenConversation(id));
        }
        if let Some((id, title)) = rename {
            self.state.renaming = None;
            // Escape (or an empty title) leaves it as it was.
            if !title.trim().is_empty() {
                self.send(Command::Rename { id, title });
            }
        }
        if let Some(c) = delete {
            self.delete(c);
        }
    }

    pub(super) fn new_conversation(&mut self) {
        if !self.state.streaming {
            self.state.editing = None;
            self.send(Command::NewConversation);
        }
    }

    /// Hides a conversation and offers its undo; the one deleted before is
    /// deleted for good now. The current one gives way to the next.
    fn delete(&mut self, c: revis_store::Conversation) {
        self.commit_delete();
        let was_current = self.state.current == Some(c.id);
        self.state.pending_delete = Some((c, Instant::now() + UNDO_FOR));
        if was_current {
            self.state.editing = None;
            match self.state.listed().first().map(|c| c.id) {
                Some(next) => self.send(Command::OpenConversation(next)),
                None => self.send(Command::NewConversation),
            }
        }
    }

    /// Deletes for good the conversation waiting for its undo, if any.
    pub fn commit_delete(&mut self) {
        if let Some((c, _)) = self.state.pending_delete.take() {
            self.send(Command::Delete(c.id));
        }
    }

    fn undo_bar(&mut self, ui: &mut egui::Ui) {
        let Some((c, until)) = self.state.pending_delete.clone() else { return };
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return self.commit_delete();
        }
        ui.ctx().request_repaint_after(left.min(Duration::from_secs(1)));
        ui.horizontal_wrapped(|ui| {
            let title = if c.title.is_empty() { "a new conversation" } else { &c.title };
            ui.weak(format!("Deleted \u{201c}{title}\u{201d}."));
            if ui.small_button("Undo").on_hover_text("Bring the conversation back").clicked() {
                self.state.pending_delete = None;
                self.send(Command::OpenConversation(c.id));
            }
        });
    }

    fn messages(&mut self, ui: &mut egui::Ui) {
        let mut actions = Vec::new();
        // Heights laid out before hold for this width and this conversation
        // (a message added or removed at the end keeps the others').
        let width = ui.available_width();
        let key = self.state.current;
        if (self.layout.width - width).abs() > 0.5 || self.layout.key != key {
            self.layout.heights.clear();
            self.layout.width = width;
            self.layout.key = key;
        }
        self.layout.heights.resize(self.state.messages.len(), None);
        self.layout.laid_out = 0;
        egui::ScrollArea::vertical().stick_to_bottom(true).auto_shrink(false).show_viewport(ui, |ui, viewport| {
            if self.state.messages.is_empty() {
                ui.weak("Type a message below and press Enter.");
            }
            // Only messages within a screen of the viewport are laid out; the
            // others take the height they had (or an estimate) as empty space.
            let (top, bottom) = (viewport.min.y - viewport.height(), viewport.max.y + viewport.height());
            let (mut y, mut gap) = (0.0, 0.0);
            for i in 0..self.state.messages.len() {
                let h = self.layout.heights[i].unwrap_or(UNLAID_HEIGHT);
                let last = i + 1 == self.state.messages.len();
                if !last && (y + h < top || y > bottom) {
                    gap += h;
                    y += h;
                    continue;
                }
                if gap > 0.0 {
                    ui.add_space(gap);
                    gap = 0.0;
                }
                let start = ui.cursor().min.y;
                ui.push_id(i, |ui| self.message(ui, i, &mut actions));
                let h = ui.cursor().min.y - start;
                self.layout.heights[i] = Some(h);
                self.layout.laid_out += 1;
                y += h;
            }
            if gap > 0.0 {
                ui.add_space(gap);
            }
        });
        for a in actions {
            match a {
                Action::Deeper(id) => self.send(Command::GoDeeper(id)),
                Action::Edit(i) => self.state.editing = self.state.messages.get(i).map(|m| (i, m.text.clone())),
                Action::CancelEdit => self.state.editing = None,
                Action::Resend(i, text) => {
                    if let Some(c) = self.state.resent(i, text) {
                        self.send(c);
                    }
                }
                Action::Continue => {
                    if let Some(c) = self.state.continuing() {
                        self.send(c);
                    }
                }
            }
        }
    }

    fn message(&mut self, ui: &mut egui::Ui, i: usize, actions: &mut Vec<Action>) {
        let App { state, markdown, .. } = self;
        let m = &state.messages[i];
        let idle = !state.streaming;
        let last = i + 1 == state.messages.len();
        ui.add_space(6.0);
        ui.horizontal(|ui| {
            ui.strong(if m.from_user { "You" } else { "revis" });
            let note = match m.shown {
                Shown::Streaming => "answering…",
                Shown::Stopped => "stopped",
                Shown::Incomplete => "cut off before it ended",
                Shown::Failed => "failed",
                Shown::Complete => "",
            };
            if !note.is_empty() {
                ui.weak(note);
            }
            if m.from_user {
                if idle
                    && m.id.is_some()
                    && state.editing.is_none()
                    && ui.small_button("Edit").on_hover_text("Change this message and send it again").clicked()
                {
                    actions.push(Action::Edit(i));
                }
                return;
            }
            if !m.text.is_empty() && m.shown != Shown::Streaming && ui.small_button("Copy").on_hover_text("Copy the answer").clicked() {
                ui.ctx().copy_text(m.text.clone());
            }
            // The last answer can be written again, from the message that asked for it.
            let asked = state.messages[..i].iter().rposition(|m| m.from_user).filter(|&u| state.messages[u].id.is_some());
            if last
                && idle
                && m.shown != Shown::Streaming
                && let Some(u) = asked
                && ui.small_button("Regenerate").on_hover_text("Answer the same message again").clicked()
            {
                actions.push(Action::Resend(u, state.messages[u].text.clone()));
            }
            if last
                && idle
                && m.id.is_some()
                && matches!(m.shown, Shown::Stopped | Shown::Incomplete)
                && ui.small_button("Continue").on_hover_text("Go on from where the answer ended").clicked()
            {
                actions.push(Action::Continue);
            }
            if let Some(id) = m.id.filter(|_| m.shown == Shown::Complete && m.gears.deep == Deep::None)
                && ui
                    .add_enabled(idle, egui::Button::new("Go deeper").small())
                    .on_hover_text("Ask tier3 for a more thorough follow-up")
                    .clicked()
            {
                actions.push(Action::Deeper(id));
            }
        });
        if let Some(c) = &m.gears.correction {
            ui.weak(c);
        }
        if m.from_user {
            match state.editing.as_mut().filter(|(at, _)| *at == i) {
                Some((_, text)) => {
                    let l = ui.label("Edit message:");
                    ui.add(egui::TextEdit::multiline(text).desired_rows(2).desired_width(f32::INFINITY)).labelled_by(l.id);
                    ui.horizontal(|ui| {
                        let ready = !text.trim().is_empty();
                        if ui
                            .add_enabled(ready, egui::Button::new("Send edited"))
                            .on_hover_text("Everything after this message is replaced by the new answer")
                            .clicked()
                        {
                            actions.push(Action::Resend(i, text.trim().to_owned()));
                        }
                        if ui.button("Cancel edit").clicked() {
                            actions.push(Action::CancelEdit);
                        }
                    });
                }
                None => {
                    egui::Frame::new().fill(ui.visuals().faint_bg_color).inner_margin(6.0).corner_radius(4.0).show(ui, |ui| {
                        ui.set_width(ui.available_width());
                        ui.add(egui::Label::new(&m.text).selectable(true));
                    });
                }
            }
            return;
        }
        if let Some(notes) = &m.gears.checklist {
            egui::CollapsingHeader::new("Checklist (tier2)").id_salt("checklist").show(ui, |ui| {
                ui.weak(notes);
            });
        }
        super::markdown::show(ui, markdown, &m.text);
        if let Some(e) = &m.gears.escalation {
            ui.weak(e);
        }
        match &m.gears.deep {
            Deep::None => {}
            Deep::Asked => {
                ui.weak("tier3 will follow up when you pause.");
            }
            Deep::Writing => {
                ui.weak("tier3 is writing a deeper follow-up…");
            }
            Deep::Done(text) => {
                egui::CollapsingHeader::new("Deeper follow-up (tier3)").id_salt("deeper").default_open(true).show(ui, |ui| {
                    super::markdown::show(ui, markdown, text);
                });
            }
            Deep::Failed(why) => {
                ui.weak(format!("tier3's follow-up failed: {why}"));
            }
        }
        if let Some(f) = &m.footer {
            ui.label(egui::RichText::new(f).small().weak());
        }
    }

    fn input(&mut self, ui: &mut egui::Ui) {
        ui.add_space(4.0);
        let phase = match self.state.phase {
            Some(PrefillPhase::Queued) => "The answer will be warmed up when the current one ends.",
            Some(PrefillPhase::Computing) => "Warming up the answer while you type…",
            Some(PrefillPhase::Ready) => "Ready: the answer starts from a warm cache.",
            _ => "",
        };
        ui.horizontal(|ui| {
            if self.state.last_stats.is_none() && !phase.is_empty() {
                ui.weak(phase);
            }
        });
        ui.horizontal(|ui| {
            let label = ui.label("Message:");
            let was_empty = self.state.input.is_empty();
            let width = ui.available_width() - 70.0;
            let edit = egui::TextEdit::multiline(&mut self.state.input)
                .id(egui::Id::unique(INPUT_ID))
                .desired_rows(2)
                .desired_width(width.max(100.0))
                .hint_text("Ask anything; Enter sends, Shift+Enter starts a new line")
                .return_key(KeyboardShortcut::new(Modifiers::SHIFT, Key::Enter));
            let r = ui.add(edit).labelled_by(label.id);
            if r.changed() {
                // The typing signal: the first key starts the pre-prefill and holds background work.
                if self.state.input.is_empty() {
                    self.send(Command::InputCleared);
                } else {
                    self.send(Command::Keystroke { first: was_empty, draft: self.state.input.clone() });
                }
            }
            let enter = r.has_focus() && ui.input(|i| i.key_pressed(Key::Enter) && i.modifiers.is_none());
            if self.state.streaming {
                if ui.button("Stop").on_hover_text("Stop the answer (Esc)").clicked() {
                    self.send(Command::Stop);
                }
            } else {
                let send = ui.add_enabled(!self.state.input.trim().is_empty(), egui::Button::new("Send")).clicked();
                if (send || enter) && !self.state.input.trim().is_empty() {
                    let text = std::mem::take(&mut self.state.input).trim().to_owned();
                    self.state.sent(text.clone());
                    self.send(Command::Send(text));
                    r.request_focus();
                }
            }
        });
        ui.add_space(4.0);
    }
}
