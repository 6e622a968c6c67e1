//! No daemon answers: the app starts one (as `revis chat` does) and uses it.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use revis_gui::state::Connection;

use crate::{daemon_status, harness, options, ready, wait_until};

/// Stops the daemon the app started, by the PID it reports, when the test ends.
struct Reaper(Option<i32>);

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            // SAFETY: kill with the PID the daemon reported about itself.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
    }
}

#[test]
fn the_app_starts_revisd_when_none_answers() {
    let home = tempfile::tempdir().unwrap();
    let data = home.path().join("data");
    let models = data.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let model = revis_testkit::smollm2();
    std::os::unix::fs::symlink(&model, models.join(model.file_name().unwrap())).unwrap();
    // revisd as a new user's would run: this data dir, no config file.
    let wrapper = home.path().join("revisd");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec env -u REVIS_CONFIG REVIS_DATA_DIR='{}' XDG_CONFIG_HOME='{}' '{}' \"$@\"\n",
            data.display(),
            home.path().join("config").display(),
            revis_testkit::binary("revisd").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = home.path().join("run/revis/revisd.sock");
    let mut opts = options(&socket, &data, 16);
    opts.start_daemon = true;
    opts.spawn = revis_client::SpawnOptions { revisd: Some(wrapper), log: Some(home.path().join("revisd.log")), ..Default::default() };
    let mut h = harness(opts);
    let mut reaper = Reaper(None);
    wait_until(&mut h, "the app to say it starts revisd", |h| {
        matches!(h.state().state.connection, Some(Connection::Starting | Connection::Connected(_)))
    });
    ready(&mut h);
    let log = || std::fs::read_to_string(home.path().join("revisd.log")).unwrap_or_default();
    assert!(socket.exists(), "revisd listens on the app's socket; log:\n{}", log());
    let pid = daemon_status(&socket).pid;
    reaper.0 = Some(pid as i32);
    assert_eq!(h.state().state.status.as_ref().unwrap().pid, pid);
    drop(h);
    drop(reaper);
    let deadline = Instant::now() + Duration::from_secs(10);
    while socket.exists() {
        assert!(Instant::now() < deadline, "revisd {pid} did not stop");
        std::thread::yield_now();
    }
}
