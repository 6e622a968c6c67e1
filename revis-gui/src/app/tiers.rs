//! The Tiers view: each tier's model and state, load and unload, where it
//! runs (here or offloaded to paired nodes), and its ensemble.

use eframe::egui::{self};
use revis_client::ensemble::{EnsembleSpec, Method};
use revis_client::nodes::Health;
use revis_client::{ModelState, Tier};

use super::App;
use crate::protocol::Command;

impl App {
    pub(super) fn tiers(&mut self, ui: &mut egui::Ui) {
        ui.heading("Tiers");
        ui.label("Each tier is a role: tier1 small and fast, tier2 the conversation, tier3 the heaviest work.");
        ui.add_space(8.0);
        let Some(status) = self.state.status.clone() else {
            ui.label("Waiting for revisd…");
            return;
        };
        let here = if status.name.is_empty() { "this machine".to_owned() } else { format!("this machine ({})", status.name) };
        egui::Grid::new("tiers").num_columns(7).striped(true).spacing([16.0, 6.0]).show(ui, |ui| {
            for h in ["Tier", "Model", "Runs on", "State", "Memory", "", "Offload"] {
                ui.strong(h);
            }
            ui.end_row();
            for t in &status.tiers {
                ui.label(t.tier.as_str());
                // A model given by path shows its file name; the whole path on hover.
                let short = std::path::Path::new(&t.model).file_name().map_or(t.model.clone(), |f| f.to_string_lossy().into_owned());
                let shared: Vec<&str> = t.shared_with.iter().map(|t| t.as_str()).collect();
                let shared = if shared.is_empty() { String::new() } else { format!("\nloaded once, shared with {}", shared.join(", ")) };
                ui.label(short).on_hover_text(format!("{}{shared}", t.model_path));
                let placement = self.state.placements.get(&t.tier);
                match placement.map(|p| p.runs_on.as_str()) {
                    // A split tier: its layers' placement ("layers 1-15 here, 16-30 on desk").
                    None | Some("this machine") if !t.split.is_empty() => ui.label(&t.split),
                    None | Some("this machine") => ui.label(&here),
                    Some(elsewhere) => ui.label(elsewhere),
                };
                let busy = self.state.tier_busy.contains(&t.tier);
                ui.label(if busy { "working…" } else { t.state.as_str() });
                ui.label(if t.memory_bytes > 0 { format!("{} MiB", t.memory_bytes >> 20) } else { "–".into() });
                let loaded = t.state != ModelState::Unloaded;
                let (verb, cmd) = if loaded { ("Unload", Command::Unload(t.tier)) } else { ("Load", Command::Load(t.tier)) };
                if ui.add_enabled(!busy, egui::Button::new(format!("{verb} {}", t.tier))).clicked() {
                    self.state.tier_busy.insert(t.tier);
                    self.send(cmd);
                }
                // Offload: run this tier on a paired node; its model leaves this machine.
                let mut on = placement.is_some_and(|p| p.offloaded);
                let toggle = ui
                    .checkbox(&mut on, format!("Offload {}", t.tier))
                    .on_hover_text("Run this tier's tasks on a paired machine that serves it, and free its memory here. It comes back here by itself when no paired machine answers.");
                if toggle.changed() {
                    if let Some(p) = self.state.placements.get_mut(&t.tier) {
                        p.offloaded = on;
                    }
                    self.send(Command::SetOffload { tier: t.tier, on });
                }
                ui.end_row();
            }
        });
        ui.add_space(8.0);
        for (tier, note) in &self.state.tier_notes {
            match note {
                Ok(m) => ui.label(format!("{tier}: {m}")),
                Err(e) => ui.colored_label(ui.visuals().error_fg_color, format!("{tier}: {e}")),
            };
        }
        ui.add_space(12.0);
        self.ensembles(ui);
        ui.add_space(8.0);
        ui.weak(format!("revisd uses {} MiB in all; queue {}/{}.", status.rss_bytes >> 20, status.queue_depth, status.queue_capacity));
    }

    /// The Tiers view's ensembles: per tier, the switch, the members, the
    /// method and what is set now. Switching on sends the fields' ensemble
    /// (the I/O side checks it, saves it and answers); off keeps the
    /// members. While one is on, a new method, or members changed and the
    /// field left (or Enter), is sent again.
    fn ensembles(&mut self, ui: &mut egui::Ui) {
        ui.strong("Ensembles");
        ui.label(
            "Two or more models answer a tier together: tiers served here (tier1) or by a paired node (desk/tier3), separated by commas.",
        );
        let Some(stored) = self.state.ensembles.clone() else {
            ui.weak("Reading the ensembles…");
            return;
        };
        for tier in Tier::ALL {
            let spec = stored.get(&tier);
            let base = spec.cloned().unwrap_or_default();
            let pending = self.state.ensemble_wanted.get(&tier).copied();
            let mut on = pending.unwrap_or(base.enabled);
            let fields = self.state.ensemble_fields.entry(tier).or_default();
            let mut send: Option<Result<EnsembleSpec, String>> = None;
            ui.add_space(4.0);
            ui.horizontal(|ui| {
                let r = ui.add_enabled(pending.is_none(), egui::Checkbox::new(&mut on, format!("Ensemble {tier}"))).on_hover_text(format!(
                    "Answer {tier} with the models listed, together. Off: {tier} answers alone (the list is kept)."
                ));
                if r.changed() {
                    send = Some(if on { fields.spec(&base) } else { Ok(EnsembleSpec { enabled: false, ..base.clone() }) });
                }
                ui.weak(spec.map_or_else(|| "no ensemble".to_owned(), EnsembleSpec::describe));
            });
            // Each member's health, where the ensemble is on: a node's as last probed.
            if let Some(spec) = spec.filter(|s| s.enabled) {
                let members: Vec<String> = spec.members.iter().map(|m| member_health(m, &self.state.nodes)).collect();
                ui.horizontal_wrapped(|ui| {
                    ui.add_space(24.0);
                    ui.weak(format!("Members: {}", members.join(" · ")));
                });
            }
            ui.horizontal(|ui| {
                ui.add_space(24.0);
                let l = ui.label(format!("Members of {tier}'s ensemble:"));
                let edit = egui::TextEdit::singleline(&mut fields.members).hint_text("tier2, desk/tier3").desired_width(220.0);
                let members = ui.add(edit).labelled_by(l.id);
                let method = fields.method;
                egui::ComboBox::from_label(format!("Method of {tier}'s ensemble")).selected_text(method.as_str()).show_ui(ui, |ui| {
                    for m in Method::ALL {
                        ui.selectable_value(&mut fields.method, m, m.as_str()).on_hover_text(method_help(m));
                    }
                });
                // Already on: a change applies at once (not while the switch's own change is on its way).
                let members_changed = members.lost_focus() && fields.members().ok().as_ref() != Some(&base.members);
                if base.enabled && pending.is_none() && send.is_none() && (members_changed || fields.method != method) {
                    send = Some(fields.spec(&base));
                }
            });
            if let Some(why) = self.state.ensemble_notes.get(&tier) {
                ui.horizontal(|ui| {
                    ui.add_space(24.0);
                    ui.colored_label(ui.visuals().error_fg_color, why);
                });
            }
            match send {
                Some(Ok(spec)) => {
                    self.state.ensemble_notes.remove(&tier);
                    self.state.ensemble_wanted.insert(tier, spec.enabled);
                    self.send(Command::SetEnsemble { tier, spec });
                }
                // Members that do not parse: nothing is sent, the switch stays as it was.
                Some(Err(why)) => {
                    self.state.ensemble_notes.insert(tier, why);
                }
                None => {}
            }
        }
    }
}

/// An ensemble member and how it is, in words: this machine's tiers are
/// here; a node's as its last probe found it (the Nodes view probes them).
fn member_health(m: &revis_client::ensemble::MemberSpec, nodes: &[revis_client::nodes::NodeRow]) -> String {
    let Some(node) = &m.node else { return format!("{m} (this machine)") };
    match nodes.iter().find(|n| &n.name == node || &n.device_id == node).map(|n| &n.health) {
        Some(Health::Ok { latency_ms, .. }) => format!("{m} (answers, {latency_ms:.1} ms)"),
        Some(Health::Failed(why)) => format!("{m} (not answering: {why}; the others answer without it)"),
        _ => format!("{m} (not checked yet)"),
    }
}

/// What an ensemble method does, in a sentence.
fn method_help(m: Method) -> &'static str {
    match m {
        Method::Confident => "Each member drafts the next words; the draft its own model is surest of wins.",
        Method::Cross => "Each member drafts; every member scores every draft; the best-scored wins, and members that win more count more.",
        Method::Merge => "The first member drafts; where it is unsure, the members' likeliest next words are mixed.",
    }
}
