//! The Server mode view: this machine's daemon serving paired machines
//! (on or off), its pairing window and code, and the devices paired with
//! it (revoked here).

use std::time::{Duration, Instant};

use eframe::egui::{self, RichText};

use super::App;
use crate::protocol::{Command, PairingEvent};

impl App {
    pub(super) fn server(&mut self, ui: &mut egui::Ui) {
        ui.heading("Server mode");
        ui.label("Your other machines can run tasks on this one, encrypted and only once paired.");
        ui.add_space(8.0);
        let Some(server) = self.state.server.clone() else {
            ui.label("Waiting for revisd…");
            return;
        };
        let mut on = self.state.server_wanted.unwrap_or(server.enabled);
        let r = ui.add_enabled(self.state.server_wanted.is_none(), egui::Checkbox::new(&mut on, "Let my other Macs use this one"));
        if r.changed() {
            self.state.server_wanted = Some(on);
            self.send(Command::SetServerMode(on));
        }
        if !server.enabled {
            ui.weak("Off: revisd listens only on this machine's private socket.");
        } else {
            let id = self.state.status.as_ref().map(|s| s.device_id.clone()).unwrap_or_default();
            ui.label(format!(
                "On: listening on {} (mutual TLS){}; {} connected.",
                server.listen_address,
                if server.advertised { ", visible on the network" } else { "" },
                server.remote_connections
            ));
            ui.label(format!("This machine's device ID: {id}"));
            if !server.lending_refused.is_empty() {
                ui.colored_label(ui.visuals().warn_fg_color, format!("Lending is on, but {}", server.lending_refused));
            } else if server.lending {
                ui.label(format!("Lending: paired devices may run layers of their models here ({} now).", server.lending_sessions));
            }
            ui.add_space(8.0);
            match self.state.pairing.clone() {
                Some(PairingEvent::Opened { code, expires_at, listen_address, .. }) => {
                    let left = expires_at.saturating_duration_since(Instant::now());
                    ui.label("On the other machine, pair with this one and type this code:");
                    ui.label(RichText::new(&code).size(32.0).monospace().strong());
                    ui.weak(format!("Valid for {} s more, once. Address: {listen_address}", left.as_secs()));
                    ui.ctx().request_repaint_after(Duration::from_secs(1));
                    if ui.button("Cancel pairing").clicked() {
                        self.send(Command::ClosePairing);
                    }
                }
                other => {
                    match other {
                        Some(PairingEvent::Paired { name, .. }) => {
                            ui.label(format!("Paired with {name}."));
                        }
                        Some(PairingEvent::Closed { reason }) => {
                            ui.weak(format!("Pairing closed: {reason}."));
                        }
                        _ => {}
                    }
                    if ui.button("Pair a device").clicked() {
                        self.send(Command::OpenPairing);
                    }
                }
            }
        }
        ui.add_space(12.0);
        ui.separator();
        ui.strong("Devices that may use this machine");
        if self.state.devices.is_empty() {
            ui.weak("None yet.");
        }
        let mut revoke = None;
        egui::Grid::new("devices").num_columns(4).striped(true).spacing([16.0, 6.0]).show(ui, |ui| {
            for d in &self.state.devices {
                ui.label(&d.name).on_hover_text(format!("device ID {}", d.device_id));
                ui.label(format!("{} open connection(s)", d.connections));
                ui.label(if d.last_seen == 0 { "never connected".to_owned() } else { "has connected".to_owned() });
                if ui.button(format!("Revoke {}", d.name)).clicked() {
                    revoke = Some(d.device_id.clone());
                }
                ui.end_row();
            }
        });
        if let Some(d) = revoke {
            self.send(Command::Revoke(d));
        }
    }
}
