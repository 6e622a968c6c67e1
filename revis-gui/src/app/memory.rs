//! The Memory view: what revis has learned about the person (each fact
//! with where and when they said it, and the words it rests on), each fact
//! forgotten or edited, all forgotten, a fact told directly, and a switch
//! for whether the chat learns at all.

use eframe::egui;
use revis_orchestrator::conversation::provenance;

use super::App;
use crate::protocol::{Command, MemoryCommand};

impl App {
    pub(super) fn memory(&mut self, ui: &mut egui::Ui) {
        ui.heading("Memory");
        ui.label("What revis knows about you goes into every conversation. It learns only from sentences in which you speak of yourself, and keeps the words you wrote.");
        ui.add_space(6.0);
        let mut learning = self.state.learning.unwrap_or(true);
        let switch = ui
            .add_enabled(!self.state.streaming, egui::Checkbox::new(&mut learning, "Learn from what I say in chats"))
            .on_hover_text("Off: new conversations teach revis nothing until you turn it on again (for as long as the app runs); what it knows is still used");
        if switch.changed() {
            self.state.learning = Some(learning);
            self.send(Command::SetLearning(learning));
        }
        ui.add_space(8.0);
        let mut todo: Option<MemoryCommand> = None;
        ui.horizontal(|ui| {
            let l = ui.label("Tell revis:");
            let field = ui
                .add(egui::TextEdit::singleline(&mut self.state.fact_draft).hint_text("I'm vegetarian").desired_width(360.0))
                .labelled_by(l.id);
            let enter = field.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
            if (ui.add_enabled(!self.state.fact_draft.trim().is_empty(), egui::Button::new("Add")).clicked() || enter)
                && !self.state.fact_draft.trim().is_empty()
            {
                todo = Some(MemoryCommand::Add(std::mem::take(&mut self.state.fact_draft)));
            }
        });
        super::outcome(ui, &self.state.facts_note);
        ui.add_space(8.0);
        let Some(facts) = self.state.facts.clone() else {
            ui.label("Reading what revis knows…");
            return;
        };
        if facts.is_empty() {
            ui.label("revis has not learned anything about you yet.");
        }
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        egui::ScrollArea::vertical().auto_shrink(false).max_height(ui.available_height() - 40.0).show(ui, |ui| {
            for f in &facts {
                ui.separator();
                let editing = self.state.fact_edit.as_ref().is_some_and(|(id, _)| *id == f.id);
                if editing {
                    let mut done: Option<bool> = None;
                    ui.horizontal(|ui| {
                        let l = ui.label(format!("Fact {}:", f.id));
                        if let Some((_, text)) = &mut self.state.fact_edit {
                            ui.add(egui::TextEdit::singleline(text).desired_width(420.0)).labelled_by(l.id);
                        }
                        if ui.button("Save").clicked() {
                            done = Some(true);
                        }
                        if ui.button("Cancel").clicked() {
                            done = Some(false);
                        }
                    });
                    match done {
                        Some(true) => {
                            if let Some((id, text)) = self.state.fact_edit.take() {
                                todo = Some(MemoryCommand::Edit { id, text });
                            }
                        }
                        Some(false) => self.state.fact_edit = None,
                        None => {}
                    }
                } else {
                    ui.horizontal(|ui| {
                        ui.label(format!("{}.", f.id));
                        ui.label(&f.text);
                    });
                }
                ui.horizontal(|ui| {
                    ui.weak(provenance(f, now));
                    if !editing {
                        if ui.small_button(format!("Edit fact {}", f.id)).clicked() {
                            self.state.fact_edit = Some((f.id, edit_text(&f.text)));
                        }
                        if ui.small_button(format!("Forget fact {}", f.id)).clicked() {
                            todo = Some(MemoryCommand::Forget(f.id));
                        }
                    }
                });
            }
        });
        if !facts.is_empty() {
            ui.add_space(6.0);
            if ui.button("Forget everything").on_hover_text("Every fact; one comes back only if you say it again").clicked() {
                todo = Some(MemoryCommand::ForgetAll);
            }
        }
        if let Some(cmd) = todo {
            self.send(Command::Memory(cmd));
        }
    }

    /// The Memory view opened: its facts read (again).
    pub(super) fn open_memory(&mut self) {
        self.send(Command::Memory(MemoryCommand::List));
    }
}

/// What the edit box starts with: the person's words without the quotation around them.
fn edit_text(text: &str) -> String {
    text.strip_prefix("The user said: \"").and_then(|t| t.strip_suffix('"')).unwrap_or(text).to_owned()
}
