//! The app against a real revisd with SmolLM2, driven headlessly through
//! egui_kittest: find widgets by their accessible names, type, click, and
//! wait for the I/O side's events (never for a fixed time).

mod admin;
mod chat;
mod conversations;
mod desktop;
mod discovery;
mod ensemble;
mod memory;
mod models;
mod offload;
mod rich;
mod screenshots;
mod start;

use std::path::Path;
use std::time::{Duration, Instant};

use egui_kittest::Harness;
use revis_gui::{App, Options};

/// How long any one step may take before the test fails.
pub const STEP: Duration = Duration::from_secs(120);

/// The app's options for a test: the test daemon's socket, a fresh data
/// dir and config, no mDNS, greedy answers; the database opened here, so
/// the test reads what the app stores (`opts.store`).
pub fn options(socket: &Path, data: &Path, max_tokens: u32) -> Options {
    Options {
        socket: socket.to_owned(),
        start_daemon: false,
        spawn: Default::default(),
        data_dir: data.to_owned(),
        store: Some(revis_store::Store::open(&data.join("db")).unwrap().store),
        config: data.join("config/revisd.toml"),
        typing_idle: Duration::from_secs(30),
        // Never multicast from a test in this network namespace.
        discovery: None,
        sampling: revis_client::Sampling { temperature: Some(0.0), ..Default::default() },
        max_tokens: Some(max_tokens),
        pull: revis_models::PullOptions { progress: revis_models::Progress::Quiet, ..Default::default() },
    }
}

/// The app in a test harness (events are pumped by [`wait_until`]).
pub fn harness(opts: Options) -> Harness<'static, App> {
    harness_with(Harness::builder().with_size([1000.0, 700.0]), opts)
}

pub fn harness_with(builder: egui_kittest::HarnessBuilder<App>, opts: Options) -> Harness<'static, App> {
    builder.with_max_steps(64).build_ui_state(|ui, app: &mut App| app.ui(ui), App::with_wake(opts, || {}))
}

/// Types an address and a code in the Nodes view's pairing form and presses
/// Pair; returns what the app said of it.
pub fn pair_in_app(h: &mut Harness<'static, App>, addr: &str, code: &str) -> Result<String, String> {
    use eframe::egui::accesskit::Role;
    use egui_kittest::kittest::Queryable;
    if !addr.is_empty() {
        h.get_by_role_and_label(Role::TextInput, "Machine:").focus();
        h.get_by_role_and_label(Role::TextInput, "Machine:").type_text(addr);
        h.run_ok();
    }
    h.state_mut().state.pair_code.clear();
    h.state_mut().state.pair_result = None;
    h.get_by_role_and_label(Role::TextInput, "Code:").focus();
    h.get_by_role_and_label(Role::TextInput, "Code:").type_text(code);
    h.run_ok();
    h.get_by_label("Pair").click();
    wait_until(h, "pairing", |h| h.state().state.pair_result.is_some());
    h.state().state.pair_result.clone().unwrap()
}

/// Replaces what a text field holds: select all, then type.
pub fn retype(h: &mut Harness<'static, App>, role: eframe::egui::accesskit::Role, label: &str, text: &str) {
    use egui_kittest::kittest::Queryable;
    h.get_by_role_and_label(role, label).focus();
    h.run_ok();
    h.key_press_modifiers(eframe::egui::Modifiers::COMMAND, eframe::egui::Key::A);
    h.get_by_role_and_label(role, label).type_text(text);
    h.run_ok();
}

/// Draws and applies the app's events, one at a time, until `done` holds;
/// fails after [`STEP`].
#[track_caller]
pub fn wait_until(h: &mut Harness<'static, App>, what: &str, mut done: impl FnMut(&Harness<'static, App>) -> bool) {
    let deadline = Instant::now() + STEP;
    loop {
        h.run_ok();
        if done(h) {
            return;
        }
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            let s = &h.state().state;
            let daemon = h.state().socket().map(|p| {
                block_on(async {
                    match revis_client::Client::connect(&p).await {
                        Ok(c) => format!("{:?}", c.status().await.map(|s| (s.busy, s.queue_depth))),
                        Err(e) => e.to_string(),
                    }
                })
            });
            panic!(
                "waited {}s for {what}; daemon (busy, queue) {daemon:?}; connection {:?}, streaming {}, {} messages, last answer {:?}, input {:?}, nodes {:?}, errors shown: {:?}",
                STEP.as_secs(),
                s.connection,
                s.streaming,
                s.messages.len(),
                s.last_answer(),
                s.input,
                s.nodes,
                s.errors
            )
        };
        h.state_mut().wait_event(left);
    }
}

/// Waits until the app is connected and has opened a conversation.
#[track_caller]
pub fn ready(h: &mut Harness<'static, App>) {
    wait_until(h, "the app to connect and open a conversation", |h| {
        let s = &h.state().state;
        s.connected() && s.status.is_some() && s.current.is_some()
    });
}

/// A client of its own, for checking the daemon's side.
pub fn daemon_status(socket: &Path) -> revis_client::DaemonStatus {
    block_on(async { revis_client::Client::connect(socket).await.unwrap().status().await.unwrap() })
}

pub fn block_on<T>(f: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

/// A `revisd` for the app to start that keeps to the test's folders: data
/// in `data`, config home under `home`, no `REVIS_CONFIG` from outside.
pub fn revisd_in(home: &Path, data: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let wrapper = home.join("revisd");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec env -u REVIS_CONFIG REVIS_DATA_DIR='{}' XDG_CONFIG_HOME='{}' '{}' \"$@\"\n",
            data.display(),
            home.join("config").display(),
            revis_testkit::binary("revisd").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    wrapper
}

/// The app as a new user's runs it in `home`: its own database in
/// `home/data`, revisd started when none answers (through [`revisd_in`],
/// its log in `home/revisd.log`) on `home/run/revis/revisd.sock`, which is
/// returned with the options.
pub fn new_user_options(home: &Path) -> (Options, std::path::PathBuf) {
    let data = home.join("data");
    let wrapper = revisd_in(home, &data);
    let socket = home.join("run/revis/revisd.sock");
    let mut opts = options(&socket, &data, 16);
    opts.store = None;
    opts.start_daemon = true;
    opts.spawn = revis_client::SpawnOptions { revisd: Some(wrapper), log: Some(home.join("revisd.log")), ..Default::default() };
    (opts, socket)
}

/// Ends whatever revisd answers on a socket when the test ends, passed or
/// failed, by the PID it reports about itself (the one the app started).
pub struct Reaper(pub std::path::PathBuf);

impl Drop for Reaper {
    fn drop(&mut self) {
        let pid = block_on(async {
            let c = revis_client::Client::connect(&self.0).await.ok()?;
            tokio::time::timeout(Duration::from_secs(5), c.status()).await.ok()?.ok().map(|s| s.pid)
        });
        if let Some(pid) = pid.filter(|&p| p > 0) {
            // SAFETY: kill with the PID the daemon reported about itself.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
    }
}
