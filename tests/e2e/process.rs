//! The daemon as a process: config errors, socket safety, other users, shutdown.

use std::process::Command;
use std::time::{Duration, Instant};

use revis_client::wire::v1 as pb;
use revis_daemon::server::{SHUTDOWN_GRACE, SHUTDOWN_HARD};
use revis_testkit::{TestDaemon, binary};
use tonic_health::pb::health_check_response::ServingStatus;

use crate::{ask, generate, long_answer};

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
fn check_config_shows_each_tiers_model_and_context_and_a_missing_file_is_said_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("revisd.toml");
    let (smol, gemma) = (revis_testkit::smollm2(), revis_testkit::gemma3());
    std::fs::write(&config, format!("[tiers.tier1]\nmodel = {smol:?}\n[tiers.tier2]\nmodel = {gemma:?}\ncontext = 1024\n")).unwrap();
    let check =
        |config: &std::path::Path| Command::new(binary("revisd")).arg("--config").arg(config).arg("--check-config").output().unwrap();
    let out = check(&config);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}{}", String::from_utf8_lossy(&out.stderr));
    // Unset: what SmolLM2 was trained for; set: what the person wrote.
    assert!(said.contains("tier1: ") && said.contains("(context 8192 tokens)"), "{said}");
    assert!(said.contains("tier2: ") && said.contains("(context 1024 tokens)"), "{said}");
    let out = check(&dir.path().join("missing.toml"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!((out.status.code(), err.matches("No such file").count()), (Some(64), 1), "{err}");
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
        revis_client::wire::v1::admin_client::AdminClient::new(channel).status(revis_client::wire::v1::StatusRequest {}).await.unwrap_err()
    });
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    assert!(refused.message().contains("uid 65534 may not use this revisd"), "{refused:?}");
}

/// A health Watch on the Inference service, open and reporting SERVING.
async fn watch_health(c: &revis_client::Client) -> tonic::Streaming<tonic_health::pb::HealthCheckResponse> {
    let mut health = tonic_health::pb::health_client::HealthClient::new(c.wire().channel);
    let req = tonic_health::pb::HealthCheckRequest { service: "revis.v1.Inference".into() };
    let mut watch = health.watch(req).await.unwrap().into_inner();
    assert_eq!(watch.message().await.unwrap().unwrap().status, ServingStatus::Serving as i32);
    watch
}

/// Waits (at most the grace period) for the watch to report NOT_SERVING.
async fn not_serving(watch: &mut tonic::Streaming<tonic_health::pb::HealthCheckResponse>) {
    let next = tokio::time::timeout(SHUTDOWN_GRACE, watch.message()).await.expect("a health change within the grace period");
    assert_eq!(next.unwrap().expect("the watch goes on").status, ServingStatus::NotServing as i32);
}

/// Reads a Generate stream to its end, noting when each event arrived.
async fn timed_events(
    mut stream: tonic::Streaming<pb::GenerateEvent>,
) -> (Vec<(Instant, pb::generate_event::Event)>, Option<tonic::Status>) {
    let mut events = Vec::new();
    loop {
        match stream.message().await {
            Ok(Some(e)) => events.push((Instant::now(), e.event.expect("an event"))),
            Ok(None) => return (events, None),
            Err(s) => return (events, Some(s)),
        }
    }
}

/// The shutdown contract (revis_daemon::server): on SIGTERM health goes
/// NOT_SERVING and new work is refused with UNAVAILABLE at once; running
/// work goes on for SHUTDOWN_GRACE and is then cut (UNAVAILABLE); a stream
/// that stays open after that (here a health Watch, which nothing cancels)
/// holds the exit back for SHUTDOWN_HARD at most.
// Multi-threaded: our connection answers the daemon's goodbye while this
// thread blocks waiting for it to exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_refuses_new_work_cuts_running_work_after_the_grace_and_exits_by_the_deadline() {
    let mut d = TestDaemon::new().start();
    let c = d.client().await;
    let mut watch = watch_health(&c).await;
    let mut stream = c.wire().inference.generate(long_answer(2000)).await.unwrap().into_inner();
    // The answer is under way: its first text came.
    loop {
        match stream.message().await.unwrap().and_then(|e| e.event) {
            Some(pb::generate_event::Event::Delta(_)) => break,
            Some(pb::generate_event::Event::Started(_)) => {}
            other => panic!("expected text, got {other:?}"),
        }
    }
    let t0 = Instant::now();
    d.signal(libc::SIGTERM);

    not_serving(&mut watch).await;
    // How long the daemon took, on this machine now, to act on the signal
    // and tell us: the measure of its lag that the deadlines below allow.
    let noticed = t0.elapsed();
    // New work is refused: as the client sees it, on the connection already
    // open (which it then dials again), and on a new connection.
    let hi = revis_client::GenerateParams { messages: vec![revis_client::Message::user("Hi")], ..Default::default() };
    let refused = tokio::time::timeout(SHUTDOWN_GRACE, c.generate(&hi)).await.expect("refused, not held");
    let refused = refused.err().expect("a new Generate during the drain is refused").into_call();
    assert_eq!(refused.code, revis_client::Code::Unavailable, "{refused:?}");
    match revis_client::Client::connect(&d.socket).await {
        Err(revis_client::ClientError::NotRunning { .. }) => {}
        Err(e) => panic!("a new connection during the drain: {e}"),
        Ok(_) => panic!("a new connection was accepted during the drain"),
    }
    let refused_at = t0.elapsed();
    assert!(refused_at < SHUTDOWN_GRACE, "the refusals came {refused_at:?} after SIGTERM, after the grace period");

    // The running answer went on through the grace period, then was cut.
    let (events, end) = timed_events(stream).await;
    let cut_at = t0.elapsed();
    assert!(events.iter().all(|(_, e)| !matches!(e, pb::generate_event::Event::Done(_))), "the 2000-token answer cannot finish");
    let end = end.expect("the answer is cut with a status");
    assert_eq!(end.code(), tonic::Code::Unavailable, "{}", end.message());
    // The cut comes at the next token step after the grace period: allow
    // the daemon's measured lag and two of the token steps measured meanwhile.
    let step = events.windows(2).map(|w| w[1].0 - w[0].0).max().expect("text came during the grace period");
    let cut_by = SHUTDOWN_GRACE + noticed + 2 * step;
    eprintln!("SIGTERM noticed after {noticed:?}; slowest token step {step:?}; cut after {cut_at:?} (allowed {cut_by:?})");
    assert!(cut_at >= SHUTDOWN_GRACE, "running work was cut {cut_at:?} after SIGTERM, before the grace period ({SHUTDOWN_GRACE:?})");
    assert!(cut_at < cut_by, "running work was cut only {cut_at:?} after SIGTERM");

    // The watch is still open: the daemon waits for it until the hard
    // deadline (which starts at the cut), no longer.
    let status = d.wait_exit(SHUTDOWN_GRACE + SHUTDOWN_HARD + Duration::from_secs(5)).expect("the daemon exited");
    let exit_at = t0.elapsed();
    let exit_by = cut_at + SHUTDOWN_HARD + noticed + 2 * step;
    eprintln!("exited after {exit_at:?} (allowed {exit_by:?})");
    assert!(status.success(), "{status:?}");
    assert!(exit_at >= SHUTDOWN_GRACE + SHUTDOWN_HARD, "exited {exit_at:?} after SIGTERM although a stream was still open");
    assert!(exit_at < exit_by, "exited {exit_at:?} after SIGTERM");
    assert!(d.log_text().contains("exiting anyway"), "{}", d.log_text());
    assert!(!d.socket.exists(), "socket removed on exit");
    drop(watch);
}

/// An answer under way when SIGTERM comes and short enough to end within
/// the grace period ends normally; the daemon exits as soon as nothing is
/// left, without waiting out the grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_running_work_finish_within_the_grace_and_exits_once_drained() {
    let mut d = TestDaemon::new().start();
    let mut c = d.client().await;
    let mut watch = watch_health(&c).await;
    // Warm: the model is loaded, so the answer below starts at once.
    generate(&mut c, ask("Hi")).await.unwrap();
    let req = pb::GenerateRequest { max_tokens: 48, ..ask("Write a very long essay about mountains.") };
    let mut stream = c.wire().inference.generate(req).await.unwrap().into_inner();
    assert!(matches!(stream.message().await.unwrap().and_then(|e| e.event), Some(pb::generate_event::Event::Started(_))));
    let reader = tokio::spawn(timed_events(stream));
    let t0 = Instant::now();
    d.signal(libc::SIGTERM);
    not_serving(&mut watch).await;
    let draining = Instant::now();
    drop(watch);

    let (events, end) = reader.await.unwrap();
    assert!(end.is_none(), "the answer was cut: {end:?}");
    let Some((done_at, pb::generate_event::Event::Done(done))) = events.last() else { panic!("the answer ended without Done") };
    // Whole, ended as its finish reason says (the model may end its turn first).
    let length = done.finish_reason == pb::FinishReason::Length as i32;
    assert!(length || done.finish_reason == pb::FinishReason::End as i32, "{done:?}");
    assert_eq!(length, done.generated_tokens == 48, "{done:?}");
    assert!(done.generated_tokens > 0, "{done:?}");
    assert!(done_at.duration_since(t0) < SHUTDOWN_GRACE);
    assert!(
        events.iter().any(|(at, e)| matches!(e, pb::generate_event::Event::Delta(_)) && *at > draining),
        "no text came after the drain began: the answer was not running during it"
    );
    let status = d.wait_exit(SHUTDOWN_GRACE + SHUTDOWN_HARD + Duration::from_secs(5)).expect("the daemon exited");
    let exit_at = t0.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(exit_at < SHUTDOWN_GRACE, "exited {exit_at:?} after SIGTERM: it waited out the grace period with nothing running");
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
            ServerReflectionClient::new(c.wire().channel).server_reflection_info(tokio_stream::iter([req])).await.unwrap().into_inner();
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

    let socket = runtime.join("revis/revisd.sock");
    let _end = EndDaemon(socket.clone());
    let prompt = "Name a colour.";
    let out = revis(&["run", "--temperature", "0", "--max-tokens", "16", prompt]);
    let daemon_log = std::fs::read_to_string(home.path().join("data/revisd.log")).unwrap_or_default();
    assert!(out.status.success(), "{}\n{daemon_log}", String::from_utf8_lossy(&out.stderr));
    assert!(socket.exists(), "the daemon listens on the default socket");
    // What it printed is the daemon's own greedy answer to the prompt,
    // asked again over gRPC (greedy equals greedy across the two routes).
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let again = rt.block_on(async {
        let mut c = revis_client::Client::connect(&socket).await.expect("the started daemon answers");
        generate(&mut c, pb::GenerateRequest { max_tokens: 16, ..ask(prompt) }).await.unwrap().done.text
    });
    assert!(!again.trim().is_empty(), "an empty answer proves nothing");
    assert_eq!(shown.trim_end(), again.trim_end());
    // The second command finds the running daemon.
    let status = revis(&["status", "--json"]);
    assert!(status.status.success());
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let pid = v["pid"].as_i64().expect("pid") as i32;
    // End the daemon we started, by its PID, and see it go. Not our child:
    // its exit is seen as its socket going away, looked at every 10 ms.
    // SAFETY: kill with the PID the daemon reported about itself.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while socket.exists() {
        assert!(Instant::now() < deadline, "daemon {pid} did not stop");
        std::thread::sleep(Duration::from_millis(10));
    }
}
