//! No daemon answers: the app starts one (as `revis chat` does) and uses it.

use std::time::{Duration, Instant};

use revis_gui::state::Connection;

use crate::{Reaper, daemon_status, harness, new_user_options, ready, wait_until};

#[test]
fn the_app_starts_revisd_when_none_answers() {
    let home = tempfile::tempdir().unwrap();
    let data = home.path().join("data");
    let models = data.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let model = revis_testkit::smollm2();
    std::os::unix::fs::symlink(&model, models.join(model.file_name().unwrap())).unwrap();
    // revisd as a new user's would run: this data dir, no config file; the app opens its own database.
    let (opts, socket) = new_user_options(home.path());
    let mut h = harness(opts);
    let reaper = Reaper(socket.clone());
    wait_until(&mut h, "the app to say it starts revisd", |h| {
        matches!(h.state().state.connection, Some(Connection::Starting | Connection::Connected(_)))
    });
    ready(&mut h);
    let log = || std::fs::read_to_string(home.path().join("revisd.log")).unwrap_or_default();
    assert!(socket.exists(), "revisd listens on the app's socket; log:\n{}", log());
    let pid = daemon_status(&socket).pid;
    assert_eq!(h.state().state.status.as_ref().unwrap().pid, pid);
    drop(h);
    drop(reaper);
    let deadline = Instant::now() + Duration::from_secs(10);
    while socket.exists() {
        assert!(Instant::now() < deadline, "revisd {pid} did not stop");
        // Polled, not spun: revisd needs the cores to shut down.
        std::thread::sleep(Duration::from_millis(10));
    }
}
