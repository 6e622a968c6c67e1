//! Developer tasks, run as `cargo xtask <task>`:
//!   chat  build revis (release), then `revis chat` (which pulls the default
//!         model and starts revisd if needed): a fresh machine to a chat.
//!   test  install what the tests need, build, pull both models, check
//!         formatting and clippy (warnings are errors), run every test;
//!         `test --busy` runs them with one core kept busy by another process.
//!   deps  install the system packages the build needs (Debian/Ubuntu, macOS).
//!   layers  check the crate graph: no dependency points up a layer, and
//!         the client's policy and apps never touch the wire: they turn no
//!         wire feature on and compile without it (run by `test`).
//!   fitness  check the tree's shape: no import circle between a crate's
//!         modules, files within the line budget or named with a reason, the
//!         bench's feature list unified, ARCHITECTURE.md's paths and names
//!         real (run by `test`).
//!   screenshots  render the GUI's main views to docs/screenshots/ (real
//!         daemon, SmolLM2, egui's headless wgpu renderer).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, bail};

mod fitness;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("chat") => chat(&args[1..]),
        Some("test") => test(&args[1..]),
        Some("deps") => deps(true),
        Some("layers") => layers(),
        Some("fitness") => fitness::check(&root()),
        Some("screenshots") => screenshots(),
        _ => {
            eprintln!("usage: cargo xtask chat [ARGS...] | test [--busy] [NEXTEST ARGS...] | deps | layers | fitness | screenshots");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    eprintln!("+ {cmd:?}");
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn have(program: &str) -> bool {
    Command::new("sh").arg("-c").arg(format!("command -v {program} >/dev/null 2>&1")).status().is_ok_and(|s| s.success())
}

/// A C/C++ toolchain, make and cmake (llama.cpp), libclang (bindgen), protoc
/// (the gRPC code) and, on Linux, systemd-analyze (the service tests verify
/// the generated units).
fn deps(for_tests: bool) -> anyhow::Result<()> {
    let libclang = ["/usr/lib/llvm-14/lib", "/usr/lib/llvm-15/lib", "/usr/lib/llvm-16/lib", "/usr/lib/x86_64-linux-gnu"].iter().any(|d| {
        std::fs::read_dir(d).is_ok_and(|mut r| r.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("libclang"))))
    });
    // systemd-analyze (Linux) verifies the service units in the tests, and one test starts a
    // `systemd --user` of its own (tests/e2e/service.rs); systemd need not be PID 1.
    let systemd = !for_tests || cfg!(target_os = "macos") || have("systemd-analyze");
    // The GUI's headless tests render with Mesa's CPU drivers (EGL + llvmpipe,
    // or lavapipe); the multi-machine tests make network namespaces with `ip`.
    let gui = !for_tests || cfg!(target_os = "macos") || installed(TEST_PACKAGES);
    let compilers = have("cc") && have("c++") && have("make");
    if compilers && have("cmake") && have("protoc") && (libclang || cfg!(target_os = "macos")) && systemd && gui {
        return Ok(());
    }
    if cfg!(target_os = "macos") {
        return run(Command::new("brew").args(["install", "cmake", "protobuf"]));
    }
    if !have("apt-get") {
        bail!("install a C++ compiler, make, cmake, libclang and protoc (protobuf-compiler), then run this again");
    }
    apt(&["update", "-qq"])?;
    apt(&["install", "-y", "-qq", "build-essential", "cmake", "libclang-dev", "protobuf-compiler"])?;
    if !systemd {
        apt(&["install", "-y", "-qq", "systemd"])?;
    }
    if !gui {
        let mut args = vec!["install", "-y", "-qq"];
        args.extend_from_slice(TEST_PACKAGES);
        apt(&args)?;
    }
    Ok(())
}

/// Debian packages only the tests need: EGL and Mesa's CPU renderers for
/// the GUI (llvmpipe for GL, lavapipe for Vulkan), iproute2 (`ip`) for
/// the network namespaces of the multi-machine tests, util-linux
/// (`setpriv`) for a revisd that cannot make one, and curl for the agent
/// programs ([`agents`]).
const TEST_PACKAGES: &[&str] =
    &["libegl1", "libegl-mesa0", "libgl1-mesa-dri", "mesa-vulkan-drivers", "iproute2", "util-linux", "curl", "ca-certificates"];

/// Whether dpkg has all of `packages` installed.
fn installed(packages: &[&str]) -> bool {
    !have("dpkg-query")
        || Command::new("dpkg-query")
            .args(["-W", "-f", "${Status}\n"])
            .args(packages)
            .output()
            .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).lines().all(|l| l.ends_with(" installed")))
}

/// `apt-get ARGS`, through sudo unless this is root.
fn apt(args: &[&str]) -> anyhow::Result<()> {
    let mut c = Command::new(if unsafe_is_root() { "apt-get" } else { "sudo" });
    if !unsafe_is_root() {
        c.arg("apt-get");
    }
    run(c.args(args).env("DEBIAN_FRONTEND", "noninteractive"))
}

fn unsafe_is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

fn build() -> anyhow::Result<()> {
    run(cargo().args(["build", "--release", "--workspace", "--bins"]))
}

fn chat(args: &[String]) -> anyhow::Result<()> {
    deps(false)?;
    build()?;
    run(Command::new(root().join("target/release/revis")).arg("chat").args(args))
}

/// The GUI's screenshot test, writing its PNGs into docs/screenshots/.
fn screenshots() -> anyhow::Result<()> {
    deps(true)?;
    run(cargo().args(["build", "--release", "-p", "revisd", "-p", "revis-cli"]))?;
    run(Command::new(root().join("target/release/revis")).args(["pull", "smollm2-135m-instruct"]))?;
    let out = root().join("docs/screenshots");
    std::fs::create_dir_all(&out)?;
    run(cargo().args(["nextest", "run", "--release", "-p", "revis-gui", "-E", "test(screenshots)"]).env("REVIS_SCREENSHOTS", &out))?;
    eprintln!("screenshots are in {}", out.display());
    Ok(())
}

fn test(args: &[String]) -> anyhow::Result<()> {
    // `--busy`: the tests run with one core kept busy by another process,
    // as on a person's machine (nothing in the suite may need a quiet one).
    let busy = args.iter().any(|a| a == "--busy");
    let args: Vec<&String> = args.iter().filter(|a| *a != "--busy").collect();
    deps(true)?;
    python_venv()?;
    agents()?;
    nextest()?;
    build()?;
    // Both test models, through the same code path a user's `revis pull` takes.
    for model in ["smollm2-135m-instruct", "gemma3-270m"] {
        run(Command::new(root().join("target/release/revis")).args(["pull", model]))?;
    }
    lint()?;
    // The ci profile (.config/nextest.toml): a time limit for every test,
    // and JUnit timings, of which the slowest are printed, pass or fail.
    let spinner = busy.then(Spinner::start).transpose()?;
    let result = run(cargo().args(["nextest", "run", "--release", "--workspace", "--profile", "ci"]).args(args));
    if let Some(s) = spinner {
        eprintln!("xtask: the busy process used {:.0} s of CPU while the tests ran", s.stop());
    }
    let junit = target_dir()?.join("nextest/ci/junit.xml");
    match std::fs::read_to_string(&junit) {
        Ok(xml) => {
            eprintln!("xtask: the {SLOWEST} slowest tests (all timings: {}):", junit.display());
            for (secs, name) in slowest(&xml, SLOWEST) {
                eprintln!("{secs:>9.1} s  {name}");
            }
        }
        Err(e) => eprintln!("xtask: no test timings ({}: {e})", junit.display()),
    }
    result
}

/// A process spinning on a core at normal priority for as long as it is
/// held (`cargo xtask test --busy`); ended by its PID.
struct Spinner(std::process::Child);

impl Spinner {
    fn start() -> anyhow::Result<Spinner> {
        eprintln!("xtask: --busy: one core is kept busy by another process while the tests run");
        let child = Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .stdin(std::process::Stdio::null())
            .spawn()
            .context("starting the busy process")?;
        Ok(Spinner(child))
    }

    /// Ends it; returns the CPU seconds it used (from /proc; 0 where unknown).
    fn stop(mut self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0.id())).unwrap_or_default();
        // utime and stime, fields 14 and 15, after the command's closing parenthesis.
        let fields: Vec<&str> = stat.rsplit_once(')').map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
        let ticks: f64 = fields.get(11..13).map_or(0.0, |f| f.iter().filter_map(|v| v.parse::<f64>().ok()).sum());
        let _ = self.0.kill();
        let _ = self.0.wait();
        ticks / 100.0
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How many of the slowest tests `test` prints.
const SLOWEST: usize = 20;

/// The `n` slowest test cases of a JUnit report, slowest first, as
/// (seconds, "classname name").
fn slowest(junit: &str, n: usize) -> Vec<(f64, String)> {
    let attr = |tag: &str, key: &str| -> Option<String> {
        let start = tag.find(&format!(" {key}=\""))? + key.len() + 3;
        Some(tag[start..].split('"').next()?.to_owned())
    };
    let mut cases: Vec<(f64, String)> = junit
        .split("<testcase")
        .skip(1)
        .filter_map(|case| {
            let tag = &case[..case.find('>')?];
            let secs = attr(tag, "time")?.parse().ok()?;
            Some((secs, format!("{} {}", attr(tag, "classname").unwrap_or_default(), attr(tag, "name")?)))
        })
        .collect();
    cases.sort_by(|a, b| b.0.total_cmp(&a.0));
    cases.truncate(n);
    cases
}

/// The workspace's target directory (CARGO_TARGET_DIR or `target/`).
fn target_dir() -> anyhow::Result<PathBuf> {
    let out = cargo().args(["metadata", "--format-version", "1", "--no-deps", "--offline"]).output().context("cargo metadata")?;
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).context("cargo metadata's JSON")?;
    Ok(PathBuf::from(meta["target_directory"].as_str().context("no target_directory in cargo metadata")?))
}

/// The Python the third-party client tests run (Google's grpcio, OpenAI's
/// and Ollama's packages, pinned in tests/python/requirements.txt): a
/// virtual environment in the target directory (`target/python`, where
/// revis-testkit's `python()` finds it). Debian and Ubuntu refuse pip
/// installs into the system Python (PEP 668), and a user's Python is theirs.
fn python_venv() -> anyhow::Result<()> {
    let venv = target_dir()?.join("python");
    let python = venv.join("bin/python3");
    let requirements = root().join("tests/python/requirements.txt");
    let stamp = venv.join("requirements.txt");
    let wanted = std::fs::read_to_string(&requirements).with_context(|| format!("reading {}", requirements.display()))?;
    if python.is_file() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        return Ok(());
    }
    let make = || Command::new("python3").args(["-m", "venv", "--clear"]).arg(&venv).status().is_ok_and(|s| s.success());
    if !make() {
        // Debian and Ubuntu ship venv's pip bootstrap (ensurepip) apart.
        if cfg!(target_os = "linux") && have("apt-get") {
            apt(&["update", "-qq"])?;
            apt(&["install", "-y", "-qq", "python3-venv"])?;
        }
        if !make() {
            bail!("`python3 -m venv` failed: the tests need Python 3 with its venv module (Debian/Ubuntu: python3-venv)");
        }
    }
    run(Command::new(&python).args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r"]).arg(&requirements))?;
    std::fs::write(&stamp, wanted)?;
    Ok(())
}

/// The agent programs the tests run against `revis serve`
/// (tests/e2e/agents.rs): Claude Code's and Codex's native Linux x86-64
/// builds, as npm's registry serves them to `npm install`, pinned by
/// version and SHA-512, unpacked in `target/agents/NAME` (where
/// revis-testkit's `agent()` finds them). No Node.js is needed: each
/// package's launcher only finds and starts this binary.
const AGENTS: &[(&str, &str, &str, &str)] = &[
    (
        "claude",
        "https://registry.npmjs.org/@anthropic-ai/claude-code-linux-x64/-/claude-code-linux-x64-2.1.332.tgz",
        "7f8256873c18bad2481d2702eff75838f5fab36f2db7b6400e1b0e8bccf0387ab97c53c4b94782861d8d31f8a74a0d06ad472463169e79b0b88740ea88accb73",
        "package/claude",
    ),
    (
        "codex",
        "https://registry.npmjs.org/@openai/codex/-/codex-0.171.0-linux-x64.tgz",
        "97ae8d664420764d82de96dc7d42c3cf8db2114079f3531503a23e638dd6a78388a84cbbdc709d999d064e37801d8db272e1f8374d1df55b0baf04f58f1b214f",
        "package/vendor/x86_64-unknown-linux-musl/bin/codex",
    ),
];

fn agents() -> anyhow::Result<()> {
    if !cfg!(all(target_os = "linux", target_arch = "x86_64")) {
        eprintln!("xtask: the agent programs' tests are pinned to Linux x86-64 builds; not fetched here");
        return Ok(());
    }
    let dir = target_dir()?.join("agents");
    for (name, url, sha512, binary) in AGENTS {
        let home = dir.join(name);
        let stamp = home.join("sha512");
        if std::fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == *sha512) && home.join(binary).is_file() {
            continue;
        }
        eprintln!("xtask: fetching {name} for the agent tests ({url})");
        let _ = std::fs::remove_dir_all(&home);
        std::fs::create_dir_all(&home)?;
        let tgz = home.join("package.tgz");
        run(Command::new("curl").args(["-fsSL", "--retry", "3", "-o"]).arg(&tgz).arg(url))?;
        let out = Command::new("sha512sum").arg(&tgz).output().context("sha512sum")?;
        let got = String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or_default().to_owned();
        if got != *sha512 {
            bail!("{url} has SHA-512 {got}, not the pinned {sha512}");
        }
        run(Command::new("tar").arg("-xzf").arg(&tgz).arg("-C").arg(&home))?;
        std::fs::remove_file(&tgz)?;
        std::fs::write(&stamp, sha512)?;
    }
    Ok(())
}

/// cargo-nextest runs the suite (per-test time limits, one daemon test at a
/// time, JUnit timings); installed from crates.io when missing.
fn nextest() -> anyhow::Result<()> {
    if have("cargo-nextest") {
        return Ok(());
    }
    eprintln!("xtask: installing cargo-nextest (it runs the tests: per-test time limits, one end-to-end test at a time)");
    run(cargo().args(["install", "--locked", "cargo-nextest"]))
}

/// The lint gates the suite runs behind: rustfmt's layout and clippy with
/// warnings as errors, tests included.
fn lint() -> anyhow::Result<()> {
    layers()?;
    fitness::check(&root())?;
    run(cargo().args(["fmt", "--all", "--check"]))?;
    run(cargo().args(["clippy", "--release", "--workspace", "--all-targets", "--", "-D", "warnings"]))
}

/// The workspace's crates in layers, lowest first. A crate may depend only
/// on crates of lower layers (dev-dependencies included), so no arrow in the
/// graph points up or sideways.
const LAYERS: &[&[&str]] = &[
    // Foundations: the wire contract, the engine, storage, trust, models.
    &["revis-proto", "revis-engine", "revis-store", "revis-trust", "revis-models"],
    // The two sides of the wire: the daemon's core, the client layer.
    &["revis-daemon", "revis-client"],
    // Over the client layer: the brain (pure policy), the HTTP APIs, the service units, test fixtures.
    &["revis-orchestrator", "revis-http", "revis-service", "revis-testkit"],
    // Programs and suites.
    &["revis-cli", "revis-gui", "revisd", "revis-bench", "revis-tests", "xtask"],
];

/// Crates that speak only revis-client's domain API: no protobuf, no gRPC.
const DOMAIN_ONLY: &[&str] = &["revis-orchestrator", "revis-http", "revis-cli", "revis-gui"];
/// What they may not depend on (normal or build dependencies).
const WIRE_CRATES: &[&str] = &["revis-proto", "tonic", "tonic-prost", "tonic-health", "tonic-reflection", "prost", "prost-types"];
/// revis-client's feature that makes the wire public (`revis_client::wire`,
/// `Client::wire`, the raw stubs): for the end-to-end tests and the
/// benchmarks only. Without it those names do not exist, so a crate that
/// never turns it on cannot call a stub: the compiler refuses.
const WIRE_FEATURE: &str = "wire";

/// Checks [`LAYERS`] and [`DOMAIN_ONLY`] against `cargo metadata`, then
/// compiles the [`DOMAIN_ONLY`] crates on their own: in a workspace build
/// cargo unifies features, so the tests' [`WIRE_FEATURE`] would reach them;
/// alone, revis-client is built without it and a stub does not compile.
fn layers() -> anyhow::Result<()> {
    let out = cargo().args(["metadata", "--format-version", "1", "--no-deps", "--offline"]).output().context("cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let problems = layer_problems(&meta);
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("xtask layers: {p}");
        }
        bail!("{} layering problem(s)", problems.len());
    }
    let mut check = cargo();
    check.args(["check", "--release", "--quiet"]);
    for name in DOMAIN_ONLY {
        check.args(["-p", name]);
    }
    run(&mut check).context("the domain-only crates do not compile without revis-client's wire feature")?;
    eprintln!("xtask: crate layers hold");
    Ok(())
}

fn layer_of(name: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&name))
}

/// Whether a dependency entry of `cargo metadata` turns on revis-client's [`WIRE_FEATURE`].
fn enables_wire(dep: &serde_json::Value) -> bool {
    dep["name"] == "revis-client" && dep["features"].as_array().is_some_and(|f| f.iter().any(|f| f == WIRE_FEATURE))
}

/// The workspace crates whose own build (dev-dependencies aside) turns on
/// revis-client's [`WIRE_FEATURE`], each with the dependency it comes
/// through: a dependency entry or a feature of its own that names it, or
/// another workspace crate that turns it on.
fn wire_enablers(packages: &[serde_json::Value]) -> std::collections::BTreeMap<String, String> {
    let mut on = std::collections::BTreeMap::new();
    let wanted = format!("revis-client/{WIRE_FEATURE}");
    loop {
        let before = on.len();
        for pkg in packages {
            let name = pkg["name"].as_str().unwrap_or_default();
            if on.contains_key(name) {
                continue;
            }
            let own_feature = pkg["features"]
                .as_object()
                .is_some_and(|fs| fs.values().flat_map(|v| v.as_array().into_iter().flatten()).any(|f| f == &wanted[..]));
            let through =
                pkg["dependencies"].as_array().into_iter().flatten().filter(|d| d["kind"].as_str() != Some("dev")).find_map(|d| {
                    let dep = d["name"].as_str().unwrap_or_default();
                    (enables_wire(d) || on.contains_key(dep)).then(|| dep.to_owned())
                });
            if let Some(via) = through.or_else(|| own_feature.then(|| "a feature of its own".to_owned())) {
                on.insert(name.to_owned(), via);
            }
        }
        if on.len() == before {
            return on;
        }
    }
}

fn layer_problems(meta: &serde_json::Value) -> Vec<String> {
    let mut problems = Vec::new();
    let empty = Vec::new();
    let packages = meta["packages"].as_array().unwrap_or(&empty);
    let wire = wire_enablers(packages);
    for pkg in packages {
        let name = pkg["name"].as_str().unwrap_or_default();
        let Some(mine) = layer_of(name) else {
            problems.push(format!("{name} is in no layer: add it to LAYERS in xtask/src/main.rs"));
            continue;
        };
        for dep in pkg["dependencies"].as_array().unwrap_or(&empty) {
            let dep_name = dep["name"].as_str().unwrap_or_default();
            let kind = dep["kind"].as_str().unwrap_or("normal");
            if let Some(theirs) = layer_of(dep_name)
                && theirs >= mine
            {
                problems.push(format!("{name} (layer {mine}) depends on {dep_name} (layer {theirs}): dependencies point down only"));
            }
            if DOMAIN_ONLY.contains(&name) && kind != "dev" && WIRE_CRATES.contains(&dep_name) {
                problems.push(format!("{name} depends on {dep_name}: it speaks revis-client's domain API only"));
            }
        }
        if DOMAIN_ONLY.contains(&name)
            && let Some(via) = wire.get(name)
        {
            problems.push(format!(
                "{name} turns on revis-client's `{WIRE_FEATURE}` feature (through {via}): it speaks revis-client's domain API only"
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(packages: serde_json::Value) -> serde_json::Value {
        serde_json::json!({ "packages": packages })
    }

    #[test]
    fn the_slowest_tests_come_first_from_a_junit_report() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites name="nextest-run" tests="3" failures="0" errors="0" time="31.5">
    <testsuite name="revis-tests::e2e" tests="3" disabled="0" errors="0" failures="0">
        <testcase name="cache::warm" classname="revis-tests::e2e" timestamp="2026-12-04T12:00:00Z" time="2.250">
        </testcase>
        <testcase name="lan::cut" classname="revis-tests::e2e" timestamp="2026-12-04T12:00:02Z" time="29.000"/>
        <testcase name="fast" classname="revis-store::it" time="0.250"></testcase>
    </testsuite>
</testsuites>"#;
        assert_eq!(slowest(xml, 2), [(29.0, "revis-tests::e2e lan::cut".to_owned()), (2.25, "revis-tests::e2e cache::warm".to_owned())]);
        assert_eq!(slowest(xml, 20).len(), 3);
        assert!(slowest("", 20).is_empty());
    }

    #[test]
    fn an_upward_or_wire_dependency_is_a_problem_and_a_downward_one_is_not() {
        let ok = meta(serde_json::json!([
            {"name": "revis-client", "dependencies": [{"name": "revis-proto", "kind": null, "features": []}, {"name": "tonic", "kind": null, "features": []}]},
            {"name": "revis-proto", "dependencies": []},
        ]));
        assert!(layer_problems(&ok).is_empty(), "{:?}", layer_problems(&ok));
        let bad = meta(serde_json::json!([
            {"name": "revis-client", "dependencies": [{"name": "revis-orchestrator", "kind": null, "features": []}]},
            {"name": "revis-orchestrator", "dependencies": [{"name": "tonic", "kind": null, "features": []}, {"name": "prost", "kind": "dev", "features": []}]},
            {"name": "revis-new", "dependencies": []},
        ]));
        let problems = layer_problems(&bad);
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert!(problems[0].contains("revis-client (layer 1) depends on revis-orchestrator (layer 2)"));
        assert!(problems[1].contains("revis-orchestrator depends on tonic"));
        assert!(problems[2].contains("revis-new is in no layer"));
    }

    #[test]
    fn only_tests_and_benchmarks_turn_the_wire_on() {
        let client =
            |kind: Option<&str>, features: &[&str]| serde_json::json!({"name": "revis-client", "kind": kind, "features": features});
        let packages = meta(serde_json::json!([
            {"name": "revis-client", "dependencies": [], "features": {"wire": []}},
            // The GUI's own tests may speak the wire: a dev-dependency.
            {"name": "revis-gui", "dependencies": [client(None, &[]), client(Some("dev"), &["wire"])]},
            {"name": "revis-bench", "dependencies": [client(None, &["wire"])]},
            {"name": "revis-tests", "dependencies": [client(Some("dev"), &["wire"])]},
            // Directly, through a feature of its own, through a crate below that turns it on.
            {"name": "revis-orchestrator", "dependencies": [client(None, &["wire", "other"])]},
            {"name": "revis-http", "dependencies": [client(None, &[])], "features": {"raw": ["revis-client/wire"]}},
            {"name": "revis-testkit", "dependencies": [client(None, &["wire"])]},
            {"name": "revis-cli", "dependencies": [{"name": "revis-testkit", "kind": null, "features": []}]},
        ]));
        let problems = layer_problems(&packages);
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert!(
            problems[0].starts_with("revis-orchestrator turns on revis-client's `wire` feature (through revis-client)"),
            "{}",
            problems[0]
        );
        assert!(
            problems[1].contains("revis-http turns on revis-client's `wire` feature (through a feature of its own)"),
            "{}",
            problems[1]
        );
        assert!(problems[2].contains("revis-cli turns on revis-client's `wire` feature (through revis-testkit)"), "{}", problems[2]);
    }
}
