//! One model across two machines (`tiers.X.split`, `revisd lend`): the
//! lender "desk" runs in namespace a, this machine (the test's thread, its
//! revisd and the split engine that revisd starts) in namespace b, and
//! llama.cpp's RPC traffic crosses the veth only inside mutual TLS.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use revis_client::wire::v1 as pb;
use revis_client::{Client, Keyring};
use revis_daemon::remote::split::NODE_SILENCE;
use revis_testkit::netns::{Netns, NetnsPair};
use revis_testkit::{Running, TestDaemon, binary, gemma3};

use crate::impersonation::NOBODY;
use crate::server_mode::{listen_addr, open_pairing, pairing_end};
use crate::{generate, greedy, long_answer, user};

/// SmolLM2-135M has 30 layers; `split_local = 0.5` keeps 15 here.
const PLACEMENT: &str = "layers 1-15 here, 16-30 on desk";

/// The lender on a chosen port (0: any): server mode on (not advertised),
/// lending as asked, one thread, in its own namespace, so nothing
/// else can hold it: server mode switched off and on again comes back
/// where the laptop paired it.
fn desk_on(net: &NetnsPair, lend: bool, port: u16) -> Running {
    desk_with(net, lend, port, "")
}

/// [`desk_on`] with more `[server]` settings.
fn desk_with(net: &NetnsPair, lend: bool, port: u16, extra: &str) -> Running {
    TestDaemon::new()
        .daemon("threads = 1")
        .netns(&net.a.name)
        .server(&format!(
            "enabled = true\nlisten = \"0.0.0.0:{port}\"\nadvertise = false\nname = \"desk\"\nlend = {lend}\npeer_timeout_ms = 2000\n{extra}"
        ))
        .start()
}

/// desk lending (with `extra` server settings), paired with a keyring of
/// the test's, this thread on the other end of the veth: what a paired
/// device's lending session needs. Every field is bound by the caller.
struct LendingDesk {
    net: NetnsPair,
    desk: Running,
    _dir: tempfile::TempDir,
    /// desk's server-mode port.
    addr: SocketAddr,
    desk_id: revis_trust::DeviceId,
    /// The paired keyring's lending client, pinned to desk.
    paired: tokio_rustls::TlsConnector,
}

async fn lending_desk(extra: &str) -> LendingDesk {
    let net = NetnsPair::new();
    net.b.enter();
    let desk = desk_with(&net, true, 0, extra);
    let dir = tempfile::tempdir().unwrap();
    let mut keyring = Keyring::open(&dir.path().join("client")).unwrap();
    let addr = pair(&mut keyring, &net, &desk).await;
    let desk_id = keyring.store.find("desk").unwrap().unwrap().device_id;
    let paired = tokio_rustls::TlsConnector::from(revis_trust::lend_client_config(&keyring.identity, desk_id).unwrap());
    LendingDesk { net, desk, _dir: dir, addr, desk_id, paired }
}

/// This machine's revisd: tier2 (SmolLM2) split with desk, half the layers
/// each; tier1 and tier3 run Gemma 3 here, whole.
fn laptop(keyring: &Path) -> Running {
    TestDaemon::new()
        .daemon("threads = 1")
        .tier_model("tier1", gemma3())
        .tier_model("tier3", gemma3())
        .tier("tier2", "split = [\"desk\"]\nsplit_local = 0.5")
        .server(&format!("keyring = {:?}", keyring.display().to_string()))
        .start()
}

/// Pairs this machine's client keyring with desk, reached over the veth.
async fn pair(keyring: &mut Keyring, net: &NetnsPair, node: &Running) -> SocketAddr {
    let mut local = node.client().await;
    let port = listen_addr(&mut local).await.port();
    let (code, mut events) = open_pairing(&mut local).await;
    let addr = SocketAddr::from((net.a.addr, port));
    revis_client::pair(keyring, addr, "desk", &code.parse().unwrap(), "laptop").await.unwrap();
    assert!(matches!(pairing_end(&mut events).await, pb::pairing_event::Event::Paired(_)));
    addr
}

/// Every field is bound by the caller: one left out would drop (the namespaces with it).
struct TwoMachines {
    net: NetnsPair,
    desk: Running,
    laptop: Running,
    dir: tempfile::TempDir,
}

async fn two_machines() -> TwoMachines {
    two_machines_on(0).await
}

/// [`two_machines`] with desk's server mode on `port` (0: any).
async fn two_machines_on(port: u16) -> TwoMachines {
    let net = NetnsPair::new();
    net.b.enter();
    let desk = desk_on(&net, true, port);
    let dir = tempfile::tempdir().unwrap();
    let keyring_dir = dir.path().join("client");
    let mut keyring = Keyring::open(&keyring_dir).unwrap();
    pair(&mut keyring, &net, &desk).await;
    let laptop = laptop(&keyring_dir);
    TwoMachines { net, desk, laptop, dir }
}

fn tier2(text: &str, max_tokens: u32) -> pb::GenerateRequest {
    pb::GenerateRequest { tier: "tier2".into(), messages: vec![user(text)], sampling: greedy(), max_tokens, ..Default::default() }
}

/// The children of a process we started (`/proc/PID/task/*/children`).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(list.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
    }
    out
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline")).map(|b| String::from_utf8_lossy(&b).replace('\0', " ")).unwrap_or_default()
}

/// The lender's RPC worker: the child of desk's revisd that runs `rpc-worker`.
fn worker_of(desk: &Running) -> u32 {
    let pids: Vec<u32> = children(desk.pid()).into_iter().filter(|p| cmdline(*p).contains("rpc-worker")).collect();
    assert_eq!(pids.len(), 1, "one RPC worker under desk's revisd: {pids:?}");
    pids[0]
}

/// The ports listening on 127.0.0.1 in `pid`'s network namespace, as that
/// namespace sees them (`/proc/PID/net/tcp`, state 0A).
fn loopback_listeners(pid: u32) -> Vec<u16> {
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|row| {
            let f: Vec<&str> = row.split_whitespace().collect();
            let (host, port) = f.get(1)?.split_once(':')?;
            (host == "0100007F" && f.get(3) == Some(&"0A")).then(|| u16::from_str_radix(port, 16).ok()).flatten()
        })
        .collect()
}

/// On a thread of its own in `ns`, as `uid`: `f` (setns and the raw
/// setresuid change only the calling thread).
fn as_uid_in<T: Send>(uid: u32, ns: &Netns, f: impl FnOnce() -> T + Send) -> T {
    use std::os::fd::AsRawFd;
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = std::fs::File::open(format!("/var/run/netns/{}", ns.name)).unwrap();
            // SAFETY: a valid namespace descriptor; setns changes only this thread.
            assert_eq!(unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) }, 0, "{}", std::io::Error::last_os_error());
            // SAFETY: the raw syscall changes only this thread's credentials; the thread ends after `f`.
            let r = unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) };
            assert_eq!(r, 0, "setresuid({uid}): {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .unwrap()
    })
}

/// Whether `uid`, on the machine whose namespace is `ns`, can connect to 127.0.0.1:`port`.
fn reaches(uid: u32, ns: &Netns, port: u16) -> bool {
    as_uid_in(uid, ns, || std::net::TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_secs(2)).is_ok())
}

/// A lending session of a paired device, its RPC HELLO answered.
async fn paired_session(
    connector: &tokio_rustls::TlsConnector,
    addr: SocketAddr,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut session = connector.connect(revis_trust::server_name(), tcp).await.unwrap();
    session.write_all(&hello()).await.unwrap();
    let mut answer = [0u8; 8 + 28];
    session.read_exact(&mut answer).await.expect("the worker answers a paired device");
    assert_eq!((answer[0], answer[8]), (28, 7), "a HELLO answer of RPC protocol 7: {answer:?}");
    session
}

/// Streams `req` and calls `act` once after `after` deltas; the stream's end.
async fn stream_then(client: &mut Client, req: pb::GenerateRequest, after: usize, act: impl FnOnce()) -> Result<usize, tonic::Status> {
    let mut stream = client.wire().inference.generate(req).await?.into_inner();
    let (mut deltas, mut act) = (0, Some(act));
    while let Some(ev) = stream.message().await? {
        if let Some(pb::generate_event::Event::Delta(_)) = ev.event {
            deltas += 1;
            if deltas == after
                && let Some(a) = act.take()
            {
                a();
            }
        }
    }
    Ok(deltas)
}

/// The same greedy answers as the whole model on one machine, the split
/// shown in Status, the session counted on the lender.
#[tokio::test(flavor = "current_thread")]
async fn a_split_model_answers_as_the_whole_model_does() {
    let TwoMachines { net: _net, desk, laptop, dir: _dir } = two_machines().await;
    let whole = TestDaemon::new().daemon("threads = 1").start();
    let (mut split, mut one) = (laptop.client().await, whole.client().await);
    for prompt in ["What is the capital of France?", "Write a short poem about the sea."] {
        let a = generate(&mut split, tier2(prompt, 48)).await.expect("the split tier answers");
        let b = generate(&mut one, tier2(prompt, 48)).await.unwrap();
        let text = |x: &crate::Answer| x.deltas.iter().map(|d| d.text.as_str()).collect::<String>();
        assert_eq!(text(&a), text(&b), "{prompt:?}: split and whole differ");
        assert_eq!(a.done.generated_tokens, b.done.generated_tokens);
        assert!(a.done.generated_tokens > 0);
    }
    let status = split.status().await.unwrap();
    let t2 = status.tier(revis_client::Tier::Tier2).unwrap();
    assert_eq!(t2.split, PLACEMENT);
    assert_eq!(t2.state, revis_client::ModelState::Ready);
    let t1 = status.tier(revis_client::Tier::Tier1).unwrap();
    assert!(t1.split.is_empty(), "tier1 is whole: {t1:?}");
    let server = desk.client().await.status().await.unwrap().server.unwrap();
    assert!(server.lending);
    assert_eq!(server.lending_sessions, 1, "the split engine's one session");
    assert!(desk.log_text().contains("lending session open"), "the layers ran on desk");
}

/// The lender's RPC worker killed mid-answer, then the veth cut mid-answer:
/// each time the call ends UNAVAILABLE naming desk, this revisd and its
/// other tiers go on, and the next call on the split tier works again.
#[tokio::test(flavor = "current_thread")]
async fn a_lost_lender_ends_the_answer_with_unavailable_and_the_next_one_works() {
    let TwoMachines { net, desk, laptop, dir: _dir } = two_machines().await;
    let mut c = laptop.client().await;
    let first = generate(&mut c, tier2("What is the capital of France?", 24)).await.unwrap();
    let story = || tier2("Write a long story about a dragon who learns to fly.", 300);

    let worker = worker_of(&desk);
    let r = stream_then(&mut c, story(), 5, || {
        // SAFETY: a child of the desk revisd this test started, found by its PID.
        unsafe { libc::kill(worker as i32, libc::SIGKILL) };
    })
    .await;
    let e = r.expect_err("the answer cannot finish without desk's layers");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains("desk"), "names the node: {}", e.message());

    // This machine's other tiers never depended on desk.
    let t1 = generate(&mut c, pb::GenerateRequest { tier: "tier1".into(), ..tier2("Say hello.", 8) }).await.unwrap();
    assert!(t1.done.generated_tokens > 0);
    // desk starts another worker; this revisd another engine.
    let again = generate(&mut c, tier2("What is the capital of France?", 24)).await.expect("the split tier recovers");
    assert_eq!(again.deltas, first.deltas, "the same greedy answer as before the loss");
    assert_ne!(worker_of(&desk), worker);

    let r = stream_then(&mut c, story(), 5, || net.set_link(false)).await;
    let e = r.expect_err("the answer cannot finish across a cut link");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains("desk"), "names the node: {}", e.message());
    net.set_link(true);
    let again = generate(&mut c, tier2("What is the capital of France?", 24)).await.expect("the split tier recovers after the link");
    assert_eq!(again.deltas, first.deltas);
    assert!(laptop.log_text().contains("split engine starting"));
}

/// Status answers while a split engine starts, with the tier Loading: here
/// a start whose TLS handshake desk never answers (its revisd stopped), so
/// it lasts until the node's connect limit gives up, then fails naming desk.
#[tokio::test(flavor = "current_thread")]
async fn status_answers_while_a_split_engine_starts() {
    let TwoMachines { net: _net, desk, laptop, dir: _dir } = two_machines().await;
    desk.signal(libc::SIGSTOP);
    let mut c = laptop.client().await;
    let answer = tokio::spawn(async move { generate(&mut c, tier2("What is the capital of France?", 4)).await });
    let deadline = Instant::now() + Duration::from_secs(30);
    while !laptop.log_text().contains("split engine starting") {
        assert!(Instant::now() < deadline, "no split engine started:\n{}", laptop.log_text());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let status = laptop.client().await.status().await.unwrap();
    assert!(!answer.is_finished(), "Status answered only after the start had ended");
    let t2 = status.tier(revis_client::Tier::Tier2).unwrap();
    assert_eq!(t2.state, revis_client::ModelState::Loading, "{t2:?}");
    assert!(t2.split.contains("starting"), "{t2:?}");
    let e = answer.await.unwrap().expect_err("desk cannot be reached");
    desk.signal(libc::SIGCONT);
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains("desk"), "names the node: {}", e.message());
}

/// One paired device holds at most `lend::MAX_SESSIONS_PER_DEVICE` lending
/// sessions: one more is refused, saying why, and the device's others go
/// on. Before, one device could take every session place (64 in all).
#[tokio::test(flavor = "current_thread")]
async fn a_paired_device_holds_at_most_four_lending_sessions() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let LendingDesk { net: _net, desk, _dir, addr, desk_id: _, paired } = lending_desk("").await;
    let limit = revis_daemon::remote::lend::MAX_SESSIONS_PER_DEVICE;
    let first = paired_session(&paired, addr).await;
    let mut held = vec![first];
    for _ in 1..limit {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        held.push(paired.connect(revis_trust::server_name(), tcp).await.unwrap());
    }
    let d = desk.client().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while (d.status().await.unwrap().server.unwrap().lending_sessions as usize) < limit {
        assert!(Instant::now() < deadline, "desk never counted {limit} sessions");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut one_more = paired.connect(revis_trust::server_name(), tcp).await.unwrap();
    let _ = one_more.write_all(&hello()).await;
    let mut said = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), one_more.read_to_end(&mut said)).await.expect("refused, not left waiting");
    let said = String::from_utf8_lossy(said.strip_prefix(revis_daemon::remote::lend::REFUSAL_MARK).expect("a refusal"));
    assert!(said.contains(&format!("holds {limit} lending sessions here already")), "{said:?}");
    assert_eq!(d.status().await.unwrap().server.unwrap().lending_sessions as usize, limit, "the others go on");
    drop(held);
}

/// Where no network namespace can be made (a Linux that refuses this user
/// unprivileged user namespaces; here revisd without CAP_SYS_ADMIN), the
/// RPC worker and the split engine do not fall back to the shared loopback
/// unless `server.allow_shared_loopback` says so, and each refusal names
/// its cause and remedy where the person looks: `revisd lend`, status, and
/// on the borrower, the split tier's error and status. Before, both ran on
/// the shared 127.0.0.1 with one WARN line in the log, and the split answered.
#[tokio::test(flavor = "current_thread")]
async fn without_a_private_loopback_lending_and_split_tiers_refuse_and_say_why() {
    let net = NetnsPair::new();
    net.b.enter();
    let desk = TestDaemon::new()
        .daemon("threads = 1")
        .netns(&net.a.name)
        .without_namespaces()
        .server("enabled = true\nlisten = \"0.0.0.0:0\"\nadvertise = false\nname = \"desk\"\nlend = true\n")
        .start();
    let dir = tempfile::tempdir().unwrap();
    let keyring = dir.path().join("client");
    pair(&mut Keyring::open(&keyring).unwrap(), &net, &desk).await;
    let remedy = "server.allow_shared_loopback = true";

    // The lender: `revisd lend on` says so, and status keeps it.
    let out = Command::new(binary("revisd")).arg("--socket").arg(&desk.socket).args(["lend", "on"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    assert!(said.contains("Lending is on, but") && said.contains("shared loopback") && said.contains(remedy), "{said}");
    let server = desk.client().await.status().await.unwrap().server.unwrap();
    assert!(server.lending && server.lending_refused.contains(remedy), "{server:?}");
    assert_eq!(loopback_listeners(desk.pid()), Vec::<u16>::new(), "nothing of desk's listens on the loopback");
    assert!(children(desk.pid()).is_empty(), "no RPC worker runs: {:?}", children(desk.pid()));

    // A borrower whose own engine may use the shared loopback hears desk's reason.
    let laptop = |allow: bool| {
        TestDaemon::new()
            .daemon("threads = 1")
            .tier_model("tier1", gemma3())
            .tier_model("tier3", gemma3())
            .tier("tier2", "split = [\"desk\"]\nsplit_local = 0.5")
            .without_namespaces()
            .server(&format!("keyring = {:?}\nallow_shared_loopback = {allow}", keyring.display().to_string()))
            .start()
    };
    let allowed = laptop(true);
    let e = generate(&mut allowed.client().await, tier2("What is the capital of France?", 4)).await.expect_err("desk refuses");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains("desk") && e.message().contains("refused the session") && e.message().contains(remedy), "{e:?}");
    drop(allowed);

    // A borrower whose engine may not: it refuses before reaching desk.
    let refusing = laptop(false);
    let mut c = refusing.client().await;
    let e = generate(&mut c, tier2("What is the capital of France?", 4)).await.expect_err("no private loopback here");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains("this machine's shared loopback") && e.message().contains(remedy), "{e:?}");
    let t2 = c.status().await.unwrap().tier(revis_client::Tier::Tier2).cloned().unwrap();
    assert!(t2.split.contains("last start failed") && t2.split.contains(remedy), "{t2:?}");
    assert!(children(refusing.pid()).is_empty(), "no split engine runs: {:?}", children(refusing.pid()));
}

/// Runs `revisd --socket SOCKET ARGS...` as the lender's owner types it; must succeed.
fn revisd(socket: &Path, args: &[&str]) {
    let out = Command::new(binary("revisd"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .env("REVIS_MDNS_INTERFACES", "none")
        .env_remove("REVIS_CONFIG")
        .env_remove("REVIS_SOCKET")
        .output()
        .expect("run revisd");
    assert!(out.status.success(), "revisd {args:?}: {out:?}");
}

/// Streams a split answer that cannot end early, runs `act` after its third
/// delta, and returns how the answer ended and how long after `act` it did.
async fn cut_by(c: &mut Client, act: impl FnOnce()) -> (tonic::Status, Duration) {
    let mut acted = None;
    let req = pb::GenerateRequest { tier: "tier2".into(), ..long_answer(300) };
    let r = stream_then(c, req, 3, || {
        act();
        acted = Some(Instant::now());
    })
    .await;
    let took = acted.expect("the answer ran to its third delta").elapsed();
    (r.expect_err("the answer cannot finish once desk cuts its layers off"), took)
}

/// desk's owner takes the machine back while the laptop's split answer is
/// running, as a person types it: `revisd server off`, then (server mode on
/// again, and the split tier answering as before) `revisd revoke laptop`.
/// Each cuts the lending session there and then: the answer ends
/// UNAVAILABLE naming desk, well before the laptop would have taken desk's
/// silence for a loss (NODE_SILENCE), desk counts no session, and after the
/// revoke the split tier stays refused.
#[tokio::test(flavor = "current_thread")]
async fn server_mode_off_and_revoke_on_the_lender_cut_a_running_split_answer() {
    // desk's namespace is the test's own: any port is free there.
    let TwoMachines { net: _net, desk, laptop, dir: _dir } = two_machines_on(47_000).await;
    let mut c = laptop.client().await;
    let mut d = desk.client().await;
    let question = || tier2("What is the capital of France?", 8);
    let first = generate(&mut c, question()).await.expect("the split tier answers");
    let sessions = async |d: &mut Client| d.status().await.unwrap().server.unwrap().lending_sessions;
    assert_eq!(sessions(&mut d).await, 1);

    // The answer ended UNAVAILABLE naming desk, sooner than desk's silence would have ended it.
    let cut = |(e, took): (tonic::Status, Duration), what: &str| {
        eprintln!("{what}: the split answer ended {took:?} after: {e:?}");
        assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
        assert!(e.message().contains("desk"), "names the node: {}", e.message());
        assert!(took < NODE_SILENCE, "ended {took:?} after {what}: the session was not cut, desk fell silent");
    };
    cut(cut_by(&mut c, || revisd(&desk.socket, &["server", "off"])).await, "server mode off");
    desk.wait_for_log("lending session cut", 1, Duration::from_secs(10));
    assert!(!d.status().await.unwrap().server.unwrap().enabled);

    revisd(&desk.socket, &["server", "on"]);
    let again = generate(&mut c, question()).await.expect("the split tier answers once server mode is back");
    assert_eq!(again.deltas, first.deltas, "the same greedy answer as before the cut");
    assert_eq!(sessions(&mut d).await, 1);

    cut(cut_by(&mut c, || revisd(&desk.socket, &["revoke", "laptop"])).await, "the revoke");
    desk.wait_for_log("lending session cut", 2, Duration::from_secs(10));
    assert_eq!(sessions(&mut d).await, 0);
    // Revoked: desk lends it nothing more.
    let refused = generate(&mut c, question()).await.expect_err("a revoked device's split tier cannot run");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("desk"), "names the node: {}", refused.message());
}

/// Only paired devices reach the RPC server, only through the server-mode
/// port, only while lending is on; nothing else listens on the veth.
#[tokio::test(flavor = "current_thread")]
async fn strangers_and_plain_tcp_get_nothing_and_lending_off_cuts() {
    let LendingDesk { net, desk, _dir, addr, desk_id, paired } = lending_desk("").await;
    // A paired session reaches the worker (which it starts).
    let mut session = paired_session(&paired, addr).await;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    // Only the server-mode port listens on desk, on any address (the worker
    // listens in a namespace of its own).
    let ss = net.a.command("ss").args(["-ltnH"]).output().unwrap();
    let listening = String::from_utf8_lossy(&ss.stdout).into_owned();
    for line in listening.lines() {
        let local = line.split_whitespace().nth(3).unwrap_or_default();
        let (_, port) = local.rsplit_once(':').unwrap();
        assert_eq!(port, addr.port().to_string(), "only the server-mode port listens:\n{listening}");
    }

    // A stranger (a key never paired) with the lending protocol: refused in the handshake.
    let stranger = revis_trust::Identity::generate().unwrap();
    let connector = tokio_rustls::TlsConnector::from(revis_trust::lend_client_config(&stranger, desk_id).unwrap());
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut s = connector.connect(revis_trust::server_name(), tcp).await.unwrap();
    let _ = s.write_all(&hello()).await;
    let mut buf = [0u8; 16];
    assert!(matches!(s.read(&mut buf).await, Ok(0) | Err(_)), "a stranger gets nothing");

    // Plain TCP speaking the RPC protocol: nothing (it is not even TLS).
    let mut plain = std::net::TcpStream::connect(addr).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let _ = plain.write_all(&hello());
    let mut got = Vec::new();
    let _ = plain.read_to_end(&mut got);
    assert!(!got.starts_with(&[28, 0, 0, 0, 0, 0, 0, 0]), "no RPC answer to plain TCP: {got:?}");

    // Lending off: the open session is cut, a new one gets nothing.
    let off = desk.client().await.set_lending(false).await.unwrap();
    assert!(!off.lending);
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), session.read_to_end(&mut rest)).await.expect("the session is cut");
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut s = paired.connect(revis_trust::server_name(), tcp).await.unwrap();
    let _ = s.write_all(&hello()).await;
    let mut said = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut said)).await.expect("closed, not left hanging");
    // Only why, for the paired device to show: no answer of the worker's.
    let said = String::from_utf8_lossy(said.strip_prefix(revis_daemon::remote::lend::REFUSAL_MARK).expect("a refusal"));
    assert!(said.starts_with("lending is off on this machine") && said.ends_with('\n'), "lending off: {said:?}");
}

/// No other user on desk, and no other process of its owner, reaches desk's
/// RPC worker (which has no authentication of its own): it listens in a
/// network namespace of its own, reached only over descriptors desk's revisd
/// hands it. A squatter on its port number in desk's namespace gets nothing.
#[tokio::test(flavor = "current_thread")]
async fn no_local_process_reaches_or_squats_the_lenders_rpc_worker() {
    let LendingDesk { net, desk, _dir, addr, desk_id: _, paired } = lending_desk("").await;
    let session = paired_session(&paired, addr).await;

    let ports = loopback_listeners(worker_of(&desk));
    assert!(!ports.is_empty(), "the worker listens on its loopback");
    for &port in &ports {
        for uid in [NOBODY, 0] {
            assert!(!reaches(uid, &net.a, port), "uid {uid} on desk connected to the RPC worker's port {port}");
        }
    }
    // Another user listening on the same port number on desk's loopback
    // takes no session: the next one is the worker's.
    let squatter = as_uid_in(NOBODY, &net.a, || std::net::TcpListener::bind(("127.0.0.1", ports[0])))
        .expect("the port number is free on desk's own loopback");
    squatter.set_nonblocking(true).unwrap();
    drop(session);
    let _next = paired_session(&paired, addr).await;
    assert_eq!(squatter.accept().map(|_| ()).map_err(|e| e.kind()), Err(std::io::ErrorKind::WouldBlock), "the squatter got a session");
}

/// No local process but the split engine rides this machine's tunnels to
/// desk (each carries this user's paired identity): the engine's RPC
/// endpoints are in a network namespace of its own, and this revisd listens
/// on no TCP port.
#[tokio::test(flavor = "current_thread")]
async fn no_local_process_rides_the_borrowers_tunnels() {
    let TwoMachines { net, desk: _desk, laptop, dir: _dir } = two_machines().await;
    let mut c = laptop.client().await;
    generate(&mut c, tier2("What is the capital of France?", 8)).await.expect("the split tier answers");
    let engines: Vec<u32> = children(laptop.pid()).into_iter().filter(|p| cmdline(*p).contains("split-engine")).collect();
    assert_eq!(engines.len(), 1, "one split engine: {engines:?}");
    let ports = loopback_listeners(engines[0]);
    assert!(!ports.is_empty(), "the engine's RPC endpoints listen on its loopback");
    for &port in &ports {
        for uid in [NOBODY, 0] {
            assert!(!reaches(uid, &net.b, port), "uid {uid} on this machine connected to the tunnel at port {port}");
        }
    }
    assert_eq!(loopback_listeners(laptop.pid()), Vec::<u16>::new(), "this machine listens on no loopback port");
    generate(&mut c, tier2("What is the capital of France?", 8)).await.expect("and the split tier still answers");
}

/// A paired device that asks desk's worker for a buffer past
/// `server.lend_memory_mb` has its session ended at once, and the same
/// worker serves the next one. Before the bound, the worker took the
/// 4 GiB (zero-filled) and waited for its bytes.
#[tokio::test(flavor = "current_thread")]
async fn a_session_asking_past_the_lending_memory_is_ended_and_the_worker_goes_on() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let LendingDesk { net: _net, desk, _dir, addr, desk_id: _, paired } = lending_desk("lend_memory_mb = 1024").await;
    let mut session = paired_session(&paired, addr).await;
    let worker = worker_of(&desk);
    // SET_TENSOR (command 6), announcing a 4 GiB payload.
    let mut m = vec![6u8];
    m.extend_from_slice(&(4u64 << 30).to_le_bytes());
    session.write_all(&m).await.unwrap();
    let mut buf = [0u8; 16];
    let end =
        tokio::time::timeout(Duration::from_secs(10), session.read(&mut buf)).await.expect("ended at once, not left waiting for 4 GiB");
    assert!(matches!(end, Ok(0) | Err(_)), "{end:?}");
    assert_eq!(worker_of(&desk), worker, "the same worker goes on");
    let _next = paired_session(&paired, addr).await;
}

/// The RPC worker as an ordinary user (not root: as revisd runs on a
/// person's machine) enters a user and network namespace of its own, says
/// so, and answers a session handed to it as a descriptor.
#[test]
fn an_ordinary_users_rpc_worker_listens_on_a_private_loopback() {
    use std::os::fd::{AsFd, AsRawFd};
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixStream;
    use std::os::unix::process::CommandExt;
    // A copy of revisd that uid 65534 can run wherever this checkout lives.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = dir.path().join("revisd");
    std::fs::copy(binary("revisd"), &exe).unwrap();
    let cache = dir.path().join("rpc-cache");
    std::fs::create_dir(&cache).unwrap();
    std::os::unix::fs::chown(&cache, Some(NOBODY), Some(NOBODY)).unwrap();
    let (sessions, theirs) = UnixStream::pair().unwrap();
    let (mut ready, ready_theirs) = UnixStream::pair().unwrap();
    let (a, b) = (theirs.as_raw_fd(), ready_theirs.as_raw_fd());
    let mut cmd = Command::new(&exe);
    cmd.args(["rpc-worker", "--threads", "1", "--memory-limit", &(2u64 << 30).to_string(), "--cache-dir"])
        .arg(&cache)
        .env(revis_daemon::remote::lend::SESSIONS_FD, a.to_string())
        .env("REVIS_WORKER_READY_FD", b.to_string())
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(std::process::Stdio::piped());
    // SAFETY: only fcntl between fork and exec, on descriptors open until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            for fd in [a, b] {
                if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut worker = cmd.spawn().expect("start the worker as uid 65534");
    drop((theirs, ready_theirs));
    ready.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut said = String::new();
    let _ = ready.read_to_string(&mut said);
    let netns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    let (theirs_ns, ours_ns) = (netns(&worker.id().to_string()), netns("self"));
    let ports = loopback_listeners(worker.id());
    // A session, as revisd hands one over.
    let (mut mine, its) = UnixStream::pair().unwrap();
    let handed = revis_daemon::remote::private_net::send_fd(&sessions, 0, its.as_fd());
    drop(its);
    mine.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut answer = [0u8; 8 + 28];
    let answered = mine.write_all(&hello()).and_then(|()| mine.read_exact(&mut answer));
    let _ = worker.kill();
    let _ = worker.wait();
    assert_eq!(said.trim(), "ready (private loopback)");
    assert_ne!(theirs_ns, ours_ns, "a network namespace of its own");
    assert!(!ports.is_empty(), "it listens on its own loopback");
    handed.expect("the session handed over");
    answered.expect("an answer through the session");
    assert_eq!((answer[0], answer[8]), (28, 7), "a HELLO answer of RPC protocol 7: {answer:?}");
}

/// llama.cpp's RPC HELLO (protocol 7): command 14, a 24-byte payload of
/// connection capabilities (none). A server answers 28 bytes, version first.
fn hello() -> Vec<u8> {
    let mut m = vec![14u8];
    m.extend_from_slice(&24u64.to_le_bytes());
    m.extend_from_slice(&[0u8; 24]);
    m
}
