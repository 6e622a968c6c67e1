//! The daemon as a process: config errors, socket safety, other users, shutdown.

use std::process::Command;
use std::time::{Duration, Instant};

use revis_testkit::{TestDaemon, binary};
use tonic_health::pb::health_check_response::ServingStatus;

use crate::ask;

#[test]
fn a_bad_config_exits_64_and_names_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("revisd.toml");
    std::fs::write(&config, "[daemon]\nqueue_capacity = 0\n").unwrap();
    let out = Command::new(binary("revisd"))
        .args(["--config".as_ref(), config.as_os_str(), "--socket".as_ref(), dir.path().join("s.sock").as_os_str()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("daemon.queue_capacity"), "{err}");
    assert!(!dir.path().join("s.sock").exists(), "nothing was bound");
}

#[test]
fn the_socket_is_private_and_a_second_daemon_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let d = TestDaemon::new().start();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&d.socket), 0o600);
    assert_eq!(mode(d.socket.parent().unwrap()), 0o700);
    let out = Command::new(binary("revisd")).arg("--socket").arg(&d.socket).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already listening"));
}

#[test]
fn another_user_is_refused() {
    let d = TestDaemon::new().start();
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let nobody = 65534;
    // A copy of the client that `nobody` can execute wherever the checkout lives.
    let bin_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(bin_dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let revis = bin_dir.path().join("revis");
    std::fs::copy(binary("revis"), &revis).unwrap();
    std::fs::set_permissions(&revis, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run_as_nobody = || {
        Command::new(&revis)
            .arg("status")
            .arg("--socket")
            .arg(&d.socket)
            .env("REVIS_DATA_DIR", d.dir())
            .uid(nobody)
            .gid(nobody)
            .output()
            .unwrap()
    };
    // `revis` as nobody will not even connect: the socket's directory is
    // root's (tests/e2e/impersonation.rs).
    let refused = "is owned by uid 0, not by you (65534); another user may be impersonating revisd";
    let out = run_as_nobody();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains(refused), "{:?}", out);
    // Even if the files are opened up, the daemon checks the caller's uid.
    let open = std::fs::Permissions::from_mode(0o777);
    std::fs::set_permissions(d.dir(), open.clone()).unwrap();
    std::fs::set_permissions(d.socket.parent().unwrap(), open.clone()).unwrap();
    std::fs::set_permissions(&d.socket, open).unwrap();
    let out = run_as_nobody();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains(refused), "{:?}", out);
    // The daemon's own check, met by a connection made as nobody.
    let socket = d.socket.clone();
    let stream = crate::impersonation::as_uid(nobody, || std::os::unix::net::UnixStream::connect(&socket)).unwrap();
    stream.set_nonblocking(true).unwrap();
    let refused = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async move {
        let stream = std::sync::Mutex::new(Some(tokio::net::UnixStream::from_std(stream).unwrap()));
        let channel = tonic::transport::Endpoint::from_static("http://revisd.local")
            .connect_with_connector(tower::service_fn(move |_| {
                let s = stream.lock().unwrap().take().ok_or_else(|| std::io::Error::other("connected once"));
                async move { s.map(hyper_util::rt::TokioIo::new) }
            }))
            .await
            .unwrap();
        revis_client::v1::admin_client::AdminClient::new(channel).status(revis_client::v1::StatusRequest {}).await.unwrap_err()
    });
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    assert!(refused.message().contains("uid 65534 may not use this revisd"), "{refused:?}");
}

#[tokio::test]
async fn sigterm_drains_and_exits_in_time() {
    let mut d = TestDaemon::new().start();
    let mut c = d.client().await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(c.channel.clone());
    let serving = health.check(tonic_health::pb::HealthCheckRequest { service: "revis.v1.Inference".into() }).await.unwrap();
    assert_eq!(serving.into_inner().status, ServingStatus::Serving as i32);

    let mut long = ask("Write a very long essay about mountains.");
    long.max_tokens = 4000;
    let mut stream = c.inference.generate(long).await.unwrap().into_inner();
    stream.message().await.unwrap();
    let t0 = Instant::now();
    d.signal(libc::SIGTERM);
    // The running answer is cut after the grace period with a clear status.
    let end = loop {
        match stream.message().await {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the 4000-token answer cannot finish within the grace period"),
            Err(s) => break s,
        }
    };
    assert_eq!(end.code(), tonic::Code::Unavailable, "{}", end.message());
    let status = d.wait_exit(Duration::from_secs(10)).expect("exited within 10 s");
    assert!(status.success(), "{status:?}");
    assert!(t0.elapsed() < Duration::from_secs(8), "took {:?}", t0.elapsed());
    assert!(!d.socket.exists(), "socket removed on exit");
}

/// The services a daemon lists over server reflection `$version`, sorted.
macro_rules! reflected_services {
    ($version:ident) => {{
        use tonic_reflection::pb::$version::ServerReflectionRequest;
        use tonic_reflection::pb::$version::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::$version::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::$version::server_reflection_response::MessageResponse;

        let d = TestDaemon::new().start();
        let c = d.client().await;
        let req = ServerReflectionRequest { host: String::new(), message_request: Some(MessageRequest::ListServices(String::new())) };
        let mut responses =
            ServerReflectionClient::new(c.channel.clone()).server_reflection_info(tokio_stream::iter([req])).await.unwrap().into_inner();
        let Some(MessageResponse::ListServicesResponse(list)) = responses.message().await.unwrap().unwrap().message_response else {
            panic!("expected a service list")
        };
        let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
        names.sort();
        names
    }};
}

#[tokio::test]
async fn reflection_lists_the_services_for_standard_tools() {
    let names = reflected_services!(v1);
    assert_eq!(names, ["grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "revis.v1.Admin", "revis.v1.Inference"]);
}

/// grpcio-reflection and older grpcurl speak only reflection v1alpha.
#[tokio::test]
async fn reflection_v1alpha_lists_the_services_too() {
    let names = reflected_services!(v1alpha);
    assert_eq!(names, ["grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection", "revis.v1.Admin", "revis.v1.Inference"]);
}

/// Ends the daemon `revis` started on `socket` when the test ends, passed
/// or failed, by the PID the daemon reports about itself.
struct EndDaemon(std::path::PathBuf);

impl Drop for EndDaemon {
    fn drop(&mut self) {
        let Ok(out) = Command::new(binary("revis")).args(["status", "--json", "--socket"]).arg(&self.0).output() else { return };
        let pid = serde_json::from_slice::<serde_json::Value>(&out.stdout).ok().and_then(|v| v["pid"].as_i64());
        if let Some(pid) = pid.filter(|&p| p > 0) {
            // SAFETY: kill with the PID the daemon reported about itself.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
    }
}

/// A new user's first command: no daemon, no config. `revis run` starts one
/// (the model is already in the data dir here, so nothing is downloaded).
#[test]
fn revis_run_starts_a_daemon_when_none_answers() {
    let home = tempfile::tempdir().unwrap();
    let models = home.path().join("data/models");
    std::fs::create_dir_all(&models).unwrap();
    let model = revis_testkit::smollm2();
    std::os::unix::fs::symlink(&model, models.join(model.file_name().unwrap())).unwrap();
    let runtime = home.path().join("run");
    std::fs::create_dir(&runtime).unwrap();
    let revis = |args: &[&str]| {
        Command::new(binary("revis"))
            .args(args)
            .env("REVIS_DATA_DIR", home.path().join("data"))
            .env("XDG_RUNTIME_DIR", &runtime)
            .env_remove("REVIS_SOCKET")
            .env_remove("REVIS_CONFIG")
            .output()
            .unwrap()
    };
    // A socket the user chose is not the default: nothing is started there,
    // and the error says how to start it.
    let chosen = home.path().join("chosen.sock");
    let out = revis(&["run", "--socket", chosen.to_str().unwrap(), "Hi"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&format!("no revisd answers on {}", chosen.display())), "{err}");
    assert!(err.contains(&format!("to run one: revisd --socket '{}'", chosen.display())), "{err}");
    assert!(!chosen.exists() && !runtime.join("revis").exists(), "nothing was started");

    let _end = EndDaemon(runtime.join("revis/revisd.sock"));
    let out = revis(&["run", "--temperature", "0", "What is the capital of France?"]);
    let daemon_log = std::fs::read_to_string(home.path().join("data/revisd.log")).unwrap_or_default();
    assert!(out.status.success(), "{}\n{daemon_log}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Paris"));
    assert!(runtime.join("revis/revisd.sock").exists(), "the daemon listens on the default socket");
    // The second command finds the running daemon.
    let status = revis(&["status", "--json"]);
    assert!(status.status.success());
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let pid = v["pid"].as_i64().expect("pid") as i32;
    // End the daemon we started, by its PID, and see it go.
    // SAFETY: kill with the PID the daemon reported about itself.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while runtime.join("revis/revisd.sock").exists() {
        assert!(Instant::now() < deadline, "daemon {pid} did not stop");
        std::thread::yield_now();
    }
}
