//! The Models view: the catalog as this machine sees it (size, memory,
//! expected speed, downloaded or not), downloads by catalog name or
//! Hugging Face reference with progress and cancel, and which model each
//! tier uses. A first run without a model starts here.

use eframe::egui;
use revis_client::Tier;

use super::App;
use crate::protocol::Command;

impl App {
    pub(super) fn models(&mut self, ui: &mut egui::Ui) {
        ui.heading("Models");
        if let Some(why) = &self.state.need_model {
            ui.colored_label(ui.visuals().warn_fg_color, why);
            ui.add_space(4.0);
        }
        let Some(info) = self.state.models.clone() else {
            ui.label("Reading the catalog and measuring this machine…");
            return;
        };
        let machine = format!("This machine: {}. Models are kept in {}.", info.machine, info.dir);
        if info.busy {
            ui.colored_label(ui.visuals().warn_fg_color, machine);
        } else {
            ui.label(machine);
        }
        let uses: Vec<String> = Tier::ALL
            .iter()
            .map(|t| {
                let named = self.state.settings.as_ref().and_then(|s| s.tiers.get(t)).filter(|m| !m.trim().is_empty());
                format!("{t}: {}", named.map_or(info.default_model.as_str(), |m| m.as_str()))
            })
            .collect();
        ui.weak(format!("Tiers use {} (the default model is {}).", uses.join(", "), info.default_model));
        ui.add_space(8.0);
        self.download_progress(ui);
        let busy = self.state.pull.is_some();
        let mut pull = None;
        let mut use_for = None;
        egui::Grid::new("catalog").num_columns(5).striped(true).spacing([14.0, 6.0]).show(ui, |ui| {
            for h in ["Model", "Size", "Memory", "Speed here", ""] {
                ui.strong(h);
            }
            ui.end_row();
            for r in &info.rows {
                ui.horizontal(|ui| {
                    ui.label(&r.name).on_hover_text(format!("{} ({} parameters)", r.description, r.params));
                    if r.recommended {
                        ui.weak("fits best");
                    }
                });
                ui.label(&r.size);
                if r.fits_memory {
                    ui.label(&r.memory);
                } else {
                    ui.colored_label(ui.visuals().warn_fg_color, &r.memory).on_hover_text("more than half of this machine's memory");
                }
                ui.label(format!("~{:.0} tokens/s{}", r.tokens_per_s, if r.measured { " (measured here)" } else { "" }));
                if r.downloaded {
                    use_menu(ui, &r.name, &mut use_for);
                } else if ui.add_enabled(!busy, egui::Button::new(format!("Download {}", r.name))).clicked() {
                    pull = Some((r.name.clone(), r.fits));
                }
                ui.end_row();
            }
            for (name, size) in &info.other {
                ui.label(name);
                ui.label(size);
                ui.label("");
                ui.label("");
                use_menu(ui, name, &mut use_for);
                ui.end_row();
            }
        });
        ui.weak("A model with \"Use\" is downloaded.");
        ui.add_space(10.0);
        ui.strong("Any GGUF model on Hugging Face");
        ui.weak("hf:OWNER/REPO (its Q4_K_M file), hf:OWNER/REPO:QUANT, or hf:OWNER/REPO/FILE.gguf");
        ui.horizontal(|ui| {
            let l = ui.label("Hugging Face model:");
            ui.add(egui::TextEdit::singleline(&mut self.state.pull_name).hint_text("hf:OWNER/REPO").desired_width(320.0)).labelled_by(l.id);
            let ready = !busy && !self.state.pull_name.trim().is_empty();
            if ui.add_enabled(ready, egui::Button::new("Download")).clicked() {
                // Its size is known once the Hub is asked: the I/O side checks it before downloading.
                pull = Some((self.state.pull_name.trim().to_owned(), true));
            }
        });
        if let Some((name, fits)) = pull {
            self.state.pull_note = None;
            if fits {
                self.start_pull(name, false);
            } else {
                let why = self.too_large(&name);
                self.state.pull_confirm = Some((name, why));
            }
        }
        if let Some((tier, model)) = use_for {
            self.send(Command::UseModel { tier, model });
        }
        if let Some(Ok(m) | Err(m)) = &self.state.settings_note
            && self.state.view() == crate::state::View::Models
        {
            ui.add_space(6.0);
            ui.label(m);
        }
    }

    /// `anyway`: the user said yes to a model too large for this machine.
    fn start_pull(&mut self, name: String, anyway: bool) {
        self.state.pull = Some((name.clone(), "starting".into(), 0, None));
        self.send(Command::Pull { name, anyway });
    }

    /// Why a catalog model is large for this machine, in a sentence.
    fn too_large(&self, name: &str) -> String {
        let row = self.state.models.as_ref().and_then(|m| m.rows.iter().find(|r| r.name == name));
        match row {
            Some(r) if r.fits_memory => format!("It would write about {:.0} tokens/s here, slower than reading speed.", r.tokens_per_s),
            Some(r) => format!("It needs about {} of memory, more than half of this machine's; other programs may slow down.", r.memory),
            None => String::new(),
        }
    }

    /// The download under way, the question before a large one, or how the last one ended.
    fn download_progress(&mut self, ui: &mut egui::Ui) {
        if let Some((name, why)) = self.state.pull_confirm.clone() {
            ui.colored_label(ui.visuals().warn_fg_color, format!("{name} is large for this machine. {why}"));
            ui.horizontal(|ui| {
                if ui.button("Download anyway").clicked() {
                    self.state.pull_confirm = None;
                    self.start_pull(name, true);
                }
                if ui.button("Not now").clicked() {
                    self.state.pull_confirm = None;
                }
            });
            ui.add_space(8.0);
        }
        if let Some((model, label, done, total)) = self.state.pull.clone() {
            ui.label(format!("Downloading {model}: {label}"));
            ui.horizontal(|ui| {
                let size = revis_models::choose::human_bytes;
                let (fraction, text) = match total {
                    Some(t) if t > 0 => (done as f32 / t as f32, format!("{} of {}", size(done), size(t))),
                    _ => (0.0, size(done)),
                };
                ui.add(egui::ProgressBar::new(fraction).text(text).desired_width(360.0));
                if ui.button("Cancel download").on_hover_text("What was fetched is kept: downloading again resumes from it").clicked() {
                    self.send(Command::CancelPull);
                }
            });
            ui.add_space(8.0);
        }
        match &self.state.pull_note {
            Some(Ok(m)) => {
                ui.label(m);
                ui.add_space(8.0);
            }
            Some(Err(e)) => {
                ui.colored_label(ui.visuals().error_fg_color, format!("The download did not finish: {e}"));
                ui.add_space(8.0);
            }
            None => {}
        }
    }
}

/// "Use NAME" and a tier to use it for.
fn use_menu(ui: &mut egui::Ui, name: &str, chosen: &mut Option<(Tier, String)>) {
    ui.menu_button(format!("Use {name}"), |ui| {
        for t in Tier::ALL {
            if ui.button(format!("for {t}")).clicked() {
                *chosen = Some((t, name.to_owned()));
                ui.close();
            }
        }
    });
}
