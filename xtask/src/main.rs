//! Developer tasks, run as `cargo xtask <task>`:
//!   chat  build revis (release), then `revis chat` (which pulls the default
//!         model and starts revisd if needed): a fresh machine to a chat.
//!   test  install what the tests need, build, pull both models, check
//!         formatting and clippy (warnings are errors), run every test.
//!   deps  install the system packages the build needs (Debian/Ubuntu, macOS).
//!   layers  check the crate graph: no dependency points up a layer, and
//!         the client's policy and apps never touch the wire (run by `test`).
//!   screenshots  render the GUI's main views to docs/screenshots/ (real
//!         daemon, SmolLM2, egui's headless wgpu renderer).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, bail};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("chat") => chat(&args[1..]),
        Some("test") => test(&args[1..]),
        Some("deps") => deps(true),
        Some("layers") => layers(),
        Some("screenshots") => screenshots(),
        _ => {
            eprintln!("usage: cargo xtask chat [ARGS...] | test [NEXTEST ARGS...] | deps | layers | screenshots");
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
/// the GUI (llvmpipe for GL, lavapipe for Vulkan), and iproute2 (`ip`) for
/// the network namespaces of the multi-machine tests.
const TEST_PACKAGES: &[&str] = &["libegl1", "libegl-mesa0", "libgl1-mesa-dri", "mesa-vulkan-drivers", "iproute2"];

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
    deps(true)?;
    python_venv()?;
    nextest()?;
    build()?;
    // Both test models, through the same code path a user's `revis pull` takes.
    for model in ["smollm2-135m-instruct", "gemma3-270m"] {
        run(Command::new(root().join("target/release/revis")).args(["pull", model]))?;
    }
    lint()?;
    // The ci profile (.config/nextest.toml): a time limit for every test,
    // and JUnit timings, of which the slowest are printed, pass or fail.
    let result = run(cargo().args(["nextest", "run", "--release", "--workspace", "--profile", "ci"]).args(args));
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
/// What their sources may not name: revis-client's wire module and its raw stubs.
const WIRE_WORDS: &[&str] = &["revis_client::wire", "wire::v1", ".inference.", ".admin."];

/// Checks [`LAYERS`] and [`DOMAIN_ONLY`] against `cargo metadata` and the sources.
fn layers() -> anyhow::Result<()> {
    let out = cargo().args(["metadata", "--format-version", "1", "--no-deps", "--offline"]).output().context("cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let problems = layer_problems(&meta, &root());
    if problems.is_empty() {
        eprintln!("xtask: crate layers hold");
        return Ok(());
    }
    for p in &problems {
        eprintln!("xtask layers: {p}");
    }
    bail!("{} layering problem(s)", problems.len())
}

fn layer_of(name: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&name))
}

fn layer_problems(meta: &serde_json::Value, root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let empty = Vec::new();
    for pkg in meta["packages"].as_array().unwrap_or(&empty) {
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
        if DOMAIN_ONLY.contains(&name) {
            let manifest = Path::new(pkg["manifest_path"].as_str().unwrap_or_default());
            let src = manifest.parent().unwrap_or(root).join("src");
            for file in rust_files(&src) {
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                for (n, line) in text.lines().enumerate() {
                    if let Some(word) = WIRE_WORDS.iter().find(|w| line.contains(*w)) {
                        problems.push(format!("{}:{}: `{word}`: {name} speaks revis-client's domain API only", file.display(), n + 1));
                    }
                }
            }
        }
    }
    problems
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
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
        let dir = std::env::temp_dir().join(format!("revis-xtask-layers-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("src")).unwrap();
        std::fs::write(dir.join("src/lib.rs"), "fn f(c: revis_client::Client) { c.admin.clone(); }\n").unwrap();
        let manifest = dir.join("Cargo.toml").to_string_lossy().into_owned();
        let ok = meta(serde_json::json!([
            {"name": "revis-client", "manifest_path": "/nowhere/Cargo.toml", "dependencies": [{"name": "revis-proto", "kind": null}, {"name": "tonic", "kind": null}]},
            {"name": "revis-proto", "manifest_path": "/nowhere/Cargo.toml", "dependencies": []},
        ]));
        assert!(layer_problems(&ok, &dir).is_empty(), "{:?}", layer_problems(&ok, &dir));
        let bad = meta(serde_json::json!([
            {"name": "revis-client", "manifest_path": "/nowhere/Cargo.toml", "dependencies": [{"name": "revis-orchestrator", "kind": null}]},
            {"name": "revis-orchestrator", "manifest_path": manifest, "dependencies": [{"name": "tonic", "kind": null}, {"name": "prost", "kind": "dev"}]},
            {"name": "revis-new", "manifest_path": "/nowhere/Cargo.toml", "dependencies": []},
        ]));
        let problems = layer_problems(&bad, &dir);
        assert_eq!(problems.len(), 4, "{problems:#?}");
        assert!(problems[0].contains("revis-client (layer 1) depends on revis-orchestrator (layer 2)"));
        assert!(problems[1].contains("revis-orchestrator depends on tonic"));
        assert!(problems[2].contains("`.admin.`"), "the raw stub in its source: {}", problems[2]);
        assert!(problems[3].contains("revis-new is in no layer"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
