//! The window: a navigation rail and six views (chat, tiers, nodes, server
//! mode, models, settings). Each frame first applies the I/O side's events
//! to the [`State`], then draws it; every action becomes a [`Command`].

mod chat;
mod markdown;
mod models;

use std::time::{Duration, Instant};

use eframe::egui::{self, Key, KeyboardShortcut, Modifiers, RichText};
use revis_client::ensemble::{EnsembleSpec, Method};
use revis_client::nodes::Health;
use revis_client::{ModelState, Tier};

use crate::io_thread::IoThread;
use crate::options::Options;
use crate::protocol::{Command, PairingEvent};
use crate::settings::{Appearance, Theme};
use crate::state::{Connection, State, View};

pub struct App {
    pub state: State,
    io: IoThread,
    socket: std::path::PathBuf,
    /// Parsed Markdown and its images, for answers.
    markdown: egui_commonmark::CommonMarkCache,
    /// The message list's layout (see [`Layout`]).
    pub layout: Layout,
    /// The look applied to the window last (None: not yet).
    applied: Option<Appearance>,
}

/// What the message list knows of its messages' heights, to lay out only
/// those near the viewport.
#[derive(Default, Debug)]
pub struct Layout {
    /// Each message's height when last laid out (None: never yet).
    heights: Vec<Option<f32>>,
    /// The width and the conversation they were laid out for.
    width: f32,
    key: Option<revis_store::ConversationId>,
    /// How many messages the last frame laid out.
    pub laid_out: usize,
}

impl App {
    /// Starts the I/O side; `ctx` is repainted whenever an event arrives.
    pub fn new(opts: Options, ctx: &egui::Context) -> App {
        let ctx = ctx.clone();
        Self::with_wake(opts, move || ctx.request_repaint())
    }

    /// Starts the I/O side; `wake` is called after each event.
    pub fn with_wake(opts: Options, wake: impl Fn() + Send + Sync + 'static) -> App {
        let state = State { appearance: Appearance::load(&opts.config), ..State::default() };
        App {
            state,
            socket: opts.socket.clone(),
            io: IoThread::start(opts, wake),
            markdown: Default::default(),
            layout: Layout::default(),
            applied: None,
        }
    }

    /// Waits up to `limit` for the I/O side's next event and applies it
    /// (for tests and screenshots; the window never waits).
    pub fn wait_event(&mut self, limit: Duration) -> bool {
        match self.io.recv_timeout(limit) {
            Some(e) => {
                self.state.apply(e);
                true
            }
            None => false,
        }
    }

    /// The daemon's socket this app uses.
    pub fn socket(&self) -> Option<std::path::PathBuf> {
        Some(self.socket.clone())
    }

    pub fn send(&self, c: Command) {
        self.io.send(c);
    }

    fn drain(&mut self) {
        while let Some(e) = self.io.try_recv() {
            self.state.apply(e);
        }
    }

    /// One frame.
    pub fn ui(&mut self, ui: &mut egui::Ui) {
        self.drain();
        if self.applied != Some(self.state.appearance) {
            self.state.appearance.apply(ui.ctx());
            // The text size is the app's setting (saved), so egui's own Ctrl+/- zoom is off.
            ui.ctx().options_mut(|o| o.zoom_with_keyboard = false);
            self.applied = Some(self.state.appearance);
        }
        self.shortcuts(ui.ctx());
        egui::Panel::top("status").show(ui, |ui| self.status_bar(ui));
        egui::Panel::left("nav").resizable(false).exact_size(130.0).show(ui, |ui| {
            ui.add_space(6.0);
            for v in View::ALL {
                if ui.selectable_label(self.state.view() == v, v.title()).clicked() {
                    self.open_view(v);
                }
            }
        });
        match self.state.view() {
            View::Chat => self.chat(ui),
            View::Tiers => {
                egui::CentralPanel::default()
                    .show(ui, |ui| egui::ScrollArea::vertical().auto_shrink(false).show(ui, |ui| self.tiers(ui)).inner)
                    .inner
            }
            View::Nodes => egui::CentralPanel::default().show(ui, |ui| self.nodes(ui)).inner,
            View::Server => egui::CentralPanel::default().show(ui, |ui| self.server(ui)).inner,
            View::Models => {
                egui::CentralPanel::default()
                    .show(ui, |ui| egui::ScrollArea::both().auto_shrink(false).show(ui, |ui| self.models(ui)).inner)
                    .inner
            }
            View::Settings => egui::CentralPanel::default().show(ui, |ui| self.settings(ui)).inner,
        }
    }

    pub fn open_view(&mut self, v: View) {
        self.state.view = Some(v);
        match v {
            View::Nodes if self.state.nodes.is_empty() && !self.state.nodes_loading => {
                self.state.nodes_loading = true;
                self.send(Command::RefreshNodes);
            }
            View::Tiers => {
                self.send(Command::RefreshStatus);
                // The nodes' health, for the ensembles' members.
                if self.state.nodes.is_empty() && !self.state.nodes_loading {
                    self.state.nodes_loading = true;
                    self.send(Command::RefreshNodes);
                }
            }
            View::Server => self.send(Command::RefreshStatus),
            View::Models => self.send(Command::ListModels),
            _ => {}
        }
    }

    /// Ctrl+N a new conversation, Ctrl+F search, Ctrl+L the message box,
    /// Esc stops an answer, Ctrl+plus / Ctrl+minus / Ctrl+0 the text size,
    /// (Ctrl+Q, egui's own, closes the window, which keeps its size and place.)
    fn shortcuts(&mut self, ctx: &egui::Context) {
        let ctrl = |k| KeyboardShortcut::new(Modifiers::COMMAND, k);
        let pressed = |s: KeyboardShortcut| ctx.input_mut(|i| i.consume_shortcut(&s));
        if pressed(ctrl(Key::N)) {
            self.state.view = Some(View::Chat);
            self.new_conversation();
        }
        if pressed(ctrl(Key::F)) {
            self.state.view = Some(View::Chat);
            ctx.memory_mut(|m| m.request_focus(egui::Id::unique(chat::SEARCH_ID)));
        }
        if pressed(ctrl(Key::L)) {
            self.state.view = Some(View::Chat);
            ctx.memory_mut(|m| m.request_focus(egui::Id::unique(chat::INPUT_ID)));
        }
        if self.state.streaming && pressed(KeyboardShortcut::new(Modifiers::NONE, Key::Escape)) {
            self.send(Command::Stop);
        }
        let step = if pressed(ctrl(Key::Plus)) || pressed(ctrl(Key::Equals)) {
            Some(10i32)
        } else if pressed(ctrl(Key::Minus)) {
            Some(-10)
        } else if pressed(ctrl(Key::Num0)) {
            Some(100 - self.state.appearance.text_percent as i32)
        } else {
            None
        };
        if let Some(step) = step {
            let (lo, hi) = (*Appearance::TEXT_PERCENT.start(), *Appearance::TEXT_PERCENT.end());
            self.set_appearance(Appearance {
                text_percent: (self.state.appearance.text_percent as i32 + step).clamp(lo as i32, hi as i32) as u32,
                ..self.state.appearance
            });
        }
    }

    /// Applies a new look (next frame) and saves it.
    pub fn set_appearance(&mut self, a: Appearance) {
        if a != self.state.appearance {
            self.state.appearance = a;
            self.send(Command::SaveAppearance(a));
        }
    }

    fn status_bar(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            ui.strong("revis");
            match &self.state.connection {
                None | Some(Connection::Connecting) => {
                    ui.label("Connecting to revisd…");
                }
                Some(Connection::Starting) => {
                    ui.label("No revisd was running: starting it (the first start may download the default model)…");
                }
                Some(Connection::Connected(_)) => {
                    let s = self.state.status.as_ref();
                    let text = s.map_or_else(
                        || "Connected to revisd".to_owned(),
                        |s| {
                            format!(
                                "revisd {} on {}: {} MiB, {}",
                                s.version,
                                if s.name.is_empty() { "this machine" } else { &s.name },
                                s.rss_bytes >> 20,
                                if s.busy { "working" } else { "idle" }
                            )
                        },
                    );
                    ui.label(text);
                }
                Some(Connection::Failed(why)) => {
                    ui.colored_label(ui.visuals().error_fg_color, format!("revisd is not available: {why}"));
                    if ui.button("Try again").clicked() {
                        self.send(Command::Connect);
                    }
                }
            }
        });
        if !self.state.errors.is_empty() {
            let mut dismiss = false;
            ui.horizontal_wrapped(|ui| {
                let last = self.state.errors.last().cloned().unwrap_or_default();
                ui.colored_label(ui.visuals().warn_fg_color, last);
                dismiss = ui.button("Dismiss").clicked();
            });
            if dismiss {
                self.state.errors.clear();
            }
        }
    }

    fn tiers(&mut self, ui: &mut egui::Ui) {
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

    fn nodes(&mut self, ui: &mut egui::Ui) {
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

    fn server(&mut self, ui: &mut egui::Ui) {
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

    fn settings(&mut self, ui: &mut egui::Ui) {
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
        match &self.state.settings_note {
            Some(Ok(m)) => {
                ui.label(m);
            }
            Some(Err(e)) => {
                ui.colored_label(ui.visuals().error_fg_color, e);
            }
            None => {}
        }
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

/// Equal, counting an empty model as no model.
fn same(a: &crate::settings::Settings, b: &crate::settings::Settings) -> bool {
    let set = |s: &crate::settings::Settings| {
        s.tiers.iter().filter(|(_, m)| !m.trim().is_empty()).map(|(t, m)| (*t, m.trim().to_owned())).collect::<Vec<_>>()
    };
    set(a) == set(b) && a.next_data_dir.trim() == b.next_data_dir.trim()
}

impl eframe::App for App {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        App::ui(self, ui);
    }

    /// A conversation deleted with its undo still offered is deleted for
    /// good now (the I/O side does it before it ends).
    fn on_exit(&mut self) {
        self.commit_delete();
    }
}
