//! The Nodes view: other machines' daemons, discovered on the LAN and
//! paired, with their health; pairing with a code, and forgetting a node.

use eframe::egui::{self};
use revis_client::nodes::Health;

use super::App;
use crate::protocol::Command;

impl App {
    pub(super) fn nodes(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            ui.heading("Nodes");
            if ui.add_enabled(!self.state.nodes_loading, egui::Button::new("Look again")).clicked() {
                self.state.nodes_loading = true;
                self.send(Command::RefreshNodes);
            }
            if self.state.nodes_loading {
                ui.weak("looking…");
            }
        });
        ui.label("Your other machines: those found on the network, and those paired with this one.");
        if let Some(n) = &self.state.nodes_note {
            ui.weak(n);
        }
        ui.add_space(8.0);
        if self.state.nodes.is_empty() && !self.state.nodes_loading {
            ui.label("No machines yet. On the other machine, open revis and turn on server mode, then pair with it here.");
        }
        let mut pick = None;
        let mut forget = None;
        for n in &self.state.nodes {
            egui::Frame::group(ui.style()).show(ui, |ui| {
                ui.set_width(ui.available_width());
                ui.horizontal(|ui| {
                    ui.strong(&n.name).on_hover_text(format!("device ID {}", n.device_id));
                    ui.label(n.address.as_deref().unwrap_or("address unknown"));
                    ui.label(match (n.paired, n.discovered) {
                        (true, true) => "paired, on the network",
                        (true, false) => "paired",
                        (false, _) => "not paired",
                    });
                    if n.paired {
                        if ui.button(format!("Forget {}", n.name)).clicked() {
                            forget = Some(n.device_id.clone());
                        }
                    } else if ui.button(format!("Pair with {}", n.name)).clicked() {
                        pick = Some(n.name.clone());
                    }
                });
                match &n.health {
                    Health::Unknown if n.paired => {
                        ui.weak("checking…");
                    }
                    Health::Unknown => {
                        if let Some(w) = &n.warning {
                            ui.colored_label(ui.visuals().warn_fg_color, w);
                        }
                    }
                    Health::Ok { connect_ms, latency_ms, tiers, queue } => {
                        ui.label(format!("ok, {latency_ms:.1} ms (connect {connect_ms:.0} ms), queue {queue}"));
                        let tiers: Vec<String> = tiers.iter().map(|(t, m, s)| format!("{t}: {m} ({s})")).collect();
                        ui.weak(tiers.join(" · "));
                    }
                    Health::Failed(why) => {
                        ui.colored_label(ui.visuals().error_fg_color, why);
                    }
                }
            });
        }
        if let Some(p) = pick {
            self.state.pair_node = p;
        }
        if let Some(id) = forget {
            self.send(Command::Forget(id));
        }
        ui.add_space(12.0);
        ui.separator();
        ui.strong("Pair with a machine");
        ui.label("On the other machine, turn on server mode and press \"Pair a device\"; type the code it shows.");
        egui::Grid::new("pair").num_columns(2).spacing([8.0, 6.0]).show(ui, |ui| {
            let l = ui.label("Machine:");
            ui.add(egui::TextEdit::singleline(&mut self.state.pair_node).hint_text("its name, or HOST:PORT")).labelled_by(l.id);
            ui.end_row();
            let l = ui.label("Code:");
            ui.add(egui::TextEdit::singleline(&mut self.state.pair_code).hint_text("1234 5678")).labelled_by(l.id);
            ui.end_row();
        });
        let ready = !self.state.pair_node.trim().is_empty() && !self.state.pair_code.trim().is_empty() && !self.state.pairing_with;
        if ui.add_enabled(ready, egui::Button::new("Pair")).clicked() {
            self.state.pairing_with = true;
            self.state.pair_result = None;
            self.send(Command::Pair { node: self.state.pair_node.clone(), code: self.state.pair_code.clone() });
        }
        match &self.state.pair_result {
            Some(Ok(m)) => {
                ui.label(m);
            }
            Some(Err(e)) => {
                ui.colored_label(ui.visuals().error_fg_color, e);
            }
            None if self.state.pairing_with => {
                ui.weak("pairing…");
            }
            None => {}
        }
    }
}
