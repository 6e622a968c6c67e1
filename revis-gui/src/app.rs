//! The window: a navigation rail and seven views (chat, tiers, nodes,
//! server mode, models, memory, settings), each in a file of its own under
//! `app/`. Each frame first applies the I/O side's events
//! to the [`State`], then draws it; every action becomes a [`Command`].

mod chat;
mod focus;
mod markdown;
mod memory;
mod models;
mod nodes;
mod server;
mod settings;
mod tiers;

use std::time::Duration;

use eframe::egui::{self, Key, KeyboardShortcut, Modifiers};

use crate::io_thread::IoThread;
use crate::options::Options;
use crate::protocol::Command;
use crate::settings::Appearance;
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
        let state = State {
            appearance: Appearance::load(&opts.config),
            learning: Some(crate::settings::learning(&opts.config)),
            ..State::default()
        };
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
            View::Memory => egui::CentralPanel::default().show(ui, |ui| self.memory(ui)).inner,
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
            View::Memory => self.open_memory(),
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
            ctx.memory_mut(|m| m.request_focus(egui::Id::unique(focus::SEARCH_ID)));
        }
        if pressed(ctrl(Key::L)) {
            self.state.view = Some(View::Chat);
            ctx.memory_mut(|m| m.request_focus(egui::Id::unique(focus::INPUT_ID)));
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
}

/// What an action did, or why it failed, under the control that asked for it.
fn outcome(ui: &mut egui::Ui, note: &Option<Result<String, String>>) {
    match note {
        Some(Ok(m)) => {
            ui.label(m);
        }
        Some(Err(e)) => {
            ui.colored_label(ui.visuals().error_fg_color, e);
        }
        None => {}
    }
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
