//! The Settings view: the look of the app, the model each tier uses and
//! the data folder, saved, and revisd restarted to read them.

use eframe::egui::{self};
use revis_client::Tier;

use super::App;
use crate::protocol::Command;
use crate::settings::{Appearance, Theme};
use crate::state::Connection;

impl App {
    pub(super) fn settings(&mut self, ui: &mut egui::Ui) {
        ui.heading("Settings");
        ui.strong("Appearance");
        let mut a = self.state.appearance;
        ui.horizontal(|ui| {
            egui::ComboBox::from_label("Theme").selected_text(a.theme.words()).show_ui(ui, |ui| {
                for t in Theme::ALL {
                    ui.selectable_value(&mut a.theme, t, t.words());
                }
            });
            ui.add_space(16.0);
            ui.add(egui::Slider::new(&mut a.text_percent, Appearance::TEXT_PERCENT).step_by(5.0).suffix(" %").text("Text size"))
                .on_hover_text("Ctrl+plus and Ctrl+minus change it too; Ctrl+0 sets it back");
        });
        self.set_appearance(a);
        ui.add_space(8.0);
        let Some(mut draft) = self.state.settings_draft.clone() else {
            ui.label("Reading the settings…");
            return;
        };
        ui.strong("Models per tier");
        let names: Vec<&str> = revis_models::catalog().iter().map(|e| e.name).collect();
        ui.weak(format!("A catalog model ({}) or the path of a .gguf file; empty = the default.", names.join(", ")));
        egui::Grid::new("models").num_columns(2).spacing([8.0, 6.0]).show(ui, |ui| {
            for tier in Tier::ALL {
                let l = ui.label(format!("{tier} model:"));
                let v = draft.tiers.entry(tier).or_default();
                ui.add(egui::TextEdit::singleline(v).hint_text(revis_models::DEFAULT_MODEL).desired_width(320.0)).labelled_by(l.id);
                ui.end_row();
            }
        });
        ui.add_space(8.0);
        ui.strong("Data folder");
        ui.label(format!("Conversations, models and keys are in {}", draft.data_dir.display()));
        ui.horizontal(|ui| {
            let l = ui.label("Use from the next start:");
            ui.add(egui::TextEdit::singleline(&mut draft.next_data_dir).hint_text("the default folder").desired_width(320.0))
                .labelled_by(l.id);
        });
        ui.add_space(8.0);
        let changed = self.state.settings.as_ref().is_none_or(|s| !same(s, &draft));
        if ui.add_enabled(changed, egui::Button::new("Save settings")).clicked() {
            self.send(Command::SaveSettings(draft.clone()));
        }
        super::outcome(ui, &self.state.settings_note);
        // Models take effect when revisd starts: once saved, offer that now
        // (again after a failed try).
        if self.state.settings_note.is_some() {
            let connected = matches!(self.state.connection, Some(Connection::Connected(_)));
            let can = connected && !self.state.streaming && !self.state.restarting;
            if ui.add_enabled(can, egui::Button::new("Restart revisd now")).clicked() {
                self.send(Command::RestartDaemon);
            }
        }
        self.state.settings_draft = Some(draft);
    }
}

/// Equal, counting an empty model as no model.
fn same(a: &crate::settings::Settings, b: &crate::settings::Settings) -> bool {
    let set = |s: &crate::settings::Settings| {
        s.tiers.iter().filter(|(_, m)| !m.trim().is_empty()).map(|(t, m)| (*t, m.trim().to_owned())).collect::<Vec<_>>()
    };
    set(a) == set(b) && a.next_data_dir.trim() == b.next_data_dir.trim()
}
