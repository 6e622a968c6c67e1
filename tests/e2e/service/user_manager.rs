//! [`UserManager`]: a real `systemd --user` of the test's own, for a machine
//! (a container, CI) where systemd is installed but is not PID 1.
//!
//! systemd runs as a user manager only where the system was booted with it
//! (`/run/systemd/system` exists), and takes the cgroup it starts in as the
//! root of its tree, moving every process it finds there into its
//! `init.scope`. So it starts in namespaces of its own: a mount namespace
//! where a directory of the test's, mounted on `/run/systemd`, holds that
//! marker (the machine's own `/run/systemd` is left alone), and a cgroup
//! namespace rooted at a new,
//! empty cgroup below the test's own, with the cgroup file systems mounted
//! again there, so all it creates and moves stays in that cgroup. Only the
//! hierarchies systemd tracks processes with (cgroup2, and v1's
//! `name=systemd` on a hybrid layout) are joined and mounted; the resource
//! controllers stay the test's. Needs root, as the network namespace tests.
//!
//! A user manager logs to `/dev/console` (or, asked to, `/dev/kmsg`): in
//! its mount namespace a file of the test's is mounted on `/dev/kmsg`, so
//! its log lands there and not on the machine's console or kernel log. No
//! journald runs, so the units' output goes to /dev/null (a drop-in in
//! `/run/systemd/user.conf.d` says so: otherwise each start would log a
//! warning from a process that opens that file anew, over its first lines).
//!
//! Dropping it stops the manager by its PID (SIGTERM: it stops its units
//! and exits; SIGKILL after [`STOP_TIMEOUT`], then any process left in its
//! cgroup), and removes its cgroups.

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long the manager may take to answer `systemctl --user` after it starts.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the manager may take to stop its units and exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// Between two looks at a condition waited on.
pub const POLL: Duration = Duration::from_millis(20);
/// Where systemd looks for cgroup file systems.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The manager's cgroups are named with this, the test process's PID and a counter.
const PREFIX: &str = "revis-systemd-";

/// The systemd binary, where Debian and others put it.
const SYSTEMD: &[&str] = &["/usr/lib/systemd/systemd", "/lib/systemd/systemd"];

/// A running `systemd --user`, with its runtime directory (where
/// `systemctl --user` reaches it: `$XDG_RUNTIME_DIR/systemd/private`).
pub struct UserManager {
    child: Child,
    /// Its cgroup in each hierarchy it joined, as the test sees them.
    cgroups: Vec<PathBuf>,
    runtime: PathBuf,
    /// What it sees as `/run/systemd`.
    _run_systemd: tempfile::TempDir,
    /// Its standard output and error, then what it logged (through `/dev/kmsg`).
    logs: [PathBuf; 2],
}

/// One cgroup hierarchy systemd tracks processes with.
struct Hierarchy {
    /// Where it is mounted (`/sys/fs/cgroup` or below).
    mount: PathBuf,
    /// `cgroup2`, or `cgroup` (v1).
    fstype: &'static str,
    /// The mount data for it: empty for cgroup2, `name=systemd` for v1.
    data: &'static str,
    /// The test process's cgroup in it, relative to the mount.
    own: PathBuf,
}

impl UserManager {
    /// Starts `systemd --user` with exactly the variables in `env` (they
    /// must include `HOME` and `XDG_RUNTIME_DIR`, an existing directory)
    /// and waits until it answers `systemctl --user`. Its output goes to
    /// `log`, what it logs to `log` with the extension `kmsg`. Panics
    /// saying why when it cannot run here.
    pub fn start(env: &[(&str, &Path)], log: PathBuf) -> UserManager {
        let systemd = SYSTEMD.iter().map(Path::new).find(|p| p.exists()).unwrap_or_else(|| {
            panic!("no systemd binary at {SYSTEMD:?}: this test runs a real `systemd --user` (Debian: apt-get install systemd)")
        });
        // SAFETY: geteuid cannot fail.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "this test runs `systemd --user` in mount and cgroup namespaces of its own, which needs root (as CI and the network namespace tests)"
        );
        let runtime = env.iter().find(|(k, _)| *k == "XDG_RUNTIME_DIR").expect("XDG_RUNTIME_DIR is given").1.to_path_buf();
        remove_abandoned();

        static COUNT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let name = format!("{PREFIX}{}-{}", std::process::id(), COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let hierarchies = hierarchies();
        let mut cgroups = Vec::new();
        for h in &hierarchies {
            let dir = h.mount.join(&h.own).join(&name);
            std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating the manager's cgroup {}: {e}", dir.display()));
            cgroups.push(dir);
        }
        // Everything the child does between fork and exec, prepared here: it may not allocate.
        let c = |s: &str| CString::new(s).expect("no NUL");
        let cpath = |p: &Path| CString::new(p.as_os_str().as_encoded_bytes()).expect("no NUL");
        let procs: Vec<CString> = cgroups.iter().map(|d| cpath(&d.join("cgroup.procs"))).collect();
        let unified_root = hierarchies.iter().any(|h| h.mount == Path::new(CGROUP_ROOT));
        let remounts: Vec<(CString, CString, CString)> = hierarchies.iter().map(|h| (cpath(&h.mount), c(h.fstype), c(h.data))).collect();
        let (tmpfs, cgroup_root, empty, mode) = (c("tmpfs"), c(CGROUP_ROOT), c(""), c("mode=0755"));
        let run_systemd = tempfile::tempdir().expect("a directory for /run/systemd");
        std::fs::create_dir(run_systemd.path().join("system")).unwrap();
        std::fs::create_dir(run_systemd.path().join("user.conf.d")).unwrap();
        std::fs::write(
            run_systemd.path().join("user.conf.d/revis-test.conf"),
            "[Manager]\nDefaultStandardOutput=null\nDefaultStandardError=null\n",
        )
        .unwrap();
        let (run_systemd_source, run_systemd_target) = (cpath(run_systemd.path()), c("/run/systemd"));
        // systemd's own packages create /run/systemd; where it is missing, so is the mount point.
        std::fs::create_dir_all("/run/systemd").expect("creating /run/systemd");

        let log_file = std::fs::File::create(&log).expect("the manager's log file");
        let kmsg_log = log.with_extension("kmsg");
        std::fs::File::create(&kmsg_log).expect("the manager's kmsg file");
        // Where there is no /dev/kmsg to mount over (some containers), it logs nothing.
        let kmsg = Path::new("/dev/kmsg").exists();
        let (kmsg_source, kmsg_target) = (cpath(&kmsg_log), c("/dev/kmsg"));
        let mut cmd = Command::new(systemd);
        cmd.arg("--user")
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v.as_os_str())))
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("SYSTEMD_LOG_TARGET", if kmsg { "kmsg" } else { "null" })
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log"))
            .stderr(log_file);
        // SAFETY: only system calls on memory prepared above (async-signal-safe).
        unsafe {
            cmd.pre_exec(move || {
                let fail = |what: &str| {
                    let e = std::io::Error::last_os_error();
                    libc::write(2, what.as_ptr().cast(), what.len());
                    e
                };
                // The manager goes when the test does, even killed.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(fail("revis test: prctl(PR_SET_PDEATHSIG) failed\n"));
                }
                for p in &procs {
                    let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                        return Err(fail("revis test: joining the manager's cgroup failed\n"));
                    }
                    libc::close(fd);
                }
                if libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWCGROUP) != 0 {
                    return Err(fail("revis test: unshare(CLONE_NEWNS | CLONE_NEWCGROUP) failed\n"));
                }
                let none = std::ptr::null();
                if libc::mount(none, c"/".as_ptr(), none, libc::MS_REC | libc::MS_PRIVATE, none.cast()) != 0 {
                    return Err(fail("revis test: making the mounts private failed\n"));
                }
                if kmsg && libc::mount(kmsg_source.as_ptr(), kmsg_target.as_ptr(), none, libc::MS_BIND, none.cast()) != 0 {
                    return Err(fail("revis test: mounting the log file on /dev/kmsg failed\n"));
                }
                if libc::mount(run_systemd_source.as_ptr(), run_systemd_target.as_ptr(), none, libc::MS_BIND, none.cast()) != 0 {
                    return Err(fail("revis test: mounting a directory on /run/systemd failed\n"));
                }
                let fs_flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
                // A hybrid or v1 layout: the hierarchies are mounted in a tmpfs at /sys/fs/cgroup.
                if !unified_root && libc::mount(tmpfs.as_ptr(), cgroup_root.as_ptr(), tmpfs.as_ptr(), fs_flags, mode.as_ptr().cast()) != 0 {
                    return Err(fail("revis test: mounting a tmpfs on /sys/fs/cgroup failed\n"));
                }
                for (target, fstype, data) in &remounts {
                    if !unified_root && libc::mkdir(target.as_ptr(), 0o755) != 0 {
                        return Err(fail("revis test: making a cgroup mount point failed\n"));
                    }
                    let data = if data.is_empty() { empty.as_ptr() } else { data.as_ptr() };
                    if libc::mount(fstype.as_ptr(), target.as_ptr(), fstype.as_ptr(), fs_flags, data.cast()) != 0 {
                        return Err(fail("revis test: mounting a cgroup file system in the new cgroup namespace failed\n"));
                    }
                }
                Ok(())
            });
        }
        let child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) => {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                for dir in cgroups.iter().rev() {
                    let _ = remove_tree(dir, STOP_TIMEOUT);
                }
                panic!(
                    "starting `systemd --user` in namespaces of its own (root with CAP_SYS_ADMIN, as the network namespace tests): {e}\n{text}"
                );
            }
        };
        let mut manager = UserManager { child, cgroups, runtime, _run_systemd: run_systemd, logs: [log, kmsg_log] };
        manager.wait_ready();
        manager
    }

    /// Waits until `systemctl --user` reaches the manager.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting on the manager") {
                panic!("`systemd --user` exited at start ({status}); its log:\n{}", self.log_text());
            }
            let out = self.systemctl(&["show", "--property=Version", "--value"]);
            if out.status.success() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "`systemd --user` did not answer systemctl within {READY_TIMEOUT:?}: {}\nits log:\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.log_text()
            );
            std::thread::sleep(POLL);
        }
    }

    /// `systemctl --user ARGS` against this manager.
    pub fn systemctl(&self, args: &[&str]) -> Output {
        Command::new("systemctl")
            .arg("--user")
            .args(args)
            .env("XDG_RUNTIME_DIR", &self.runtime)
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .output()
            .expect("systemctl runs")
    }

    /// One property of `unit`, as `systemctl --user show` has it.
    pub fn property(&self, unit: &str, name: &str) -> String {
        let out = self.systemctl(&["show", unit, &format!("--property={name}"), "--value"]);
        assert!(out.status.success(), "systemctl --user show {unit}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// What the manager wrote and logged.
    pub fn log_text(&self) -> String {
        self.logs.iter().map(|p| std::fs::read_to_string(p).unwrap_or_default()).collect()
    }

    /// Whether `pid` lives in the manager's cgroup (one of its units' processes).
    pub fn runs(&self, pid: u32) -> bool {
        self.cgroups.first().is_some_and(|root| procs_in(root).contains(&pid))
    }
}

impl Drop for UserManager {
    fn drop(&mut self) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: a signal to the manager, our own child, not yet reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_TIMEOUT;
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() >= deadline {
                eprintln!("`systemd --user` ({pid}) did not stop within {STOP_TIMEOUT:?} of SIGTERM: killed");
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(POLL);
        }
        // Whatever it started and left behind (after a SIGKILL only).
        if let Some(root) = self.cgroups.first() {
            for p in procs_in(root) {
                // SAFETY: a process the manager started for this test.
                unsafe { libc::kill(p as libc::pid_t, libc::SIGKILL) };
            }
        }
        for dir in self.cgroups.iter().rev() {
            if let Err(e) = remove_tree(dir, STOP_TIMEOUT) {
                eprintln!("removing the manager's cgroup {}: {e}", dir.display());
            }
        }
    }
}

/// The hierarchies systemd tracks processes with, from this process's
/// mounts and cgroups: `/sys/fs/cgroup` itself when it is cgroup2 (the
/// unified layout), else `name=systemd` and, when mounted, the cgroup2 one
/// below it (hybrid).
fn hierarchies() -> Vec<Hierarchy> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("/proc/self/mountinfo");
    let own = std::fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
    // `ID:CONTROLLERS:PATH`: `0::PATH` for cgroup2.
    let own_path = |controllers: &str| {
        own.lines()
            .find_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, c, p) = (f.next()?, f.next()?, f.next()?);
                (c == controllers).then(|| PathBuf::from(p))
            })
            .unwrap_or_else(|| panic!("no `{controllers}` line in /proc/self/cgroup:\n{own}"))
    };
    let mut found = Vec::new();
    for line in mountinfo.lines() {
        // `ID PARENT DEV ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS`
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else { continue };
        let (root, mount) = (fields[3], Path::new(fields[4]));
        let (fstype, options) = (fields.get(dash + 1).copied().unwrap_or(""), fields.get(dash + 3).copied().unwrap_or(""));
        if !mount.starts_with(CGROUP_ROOT) {
            continue;
        }
        let (fstype, data, controllers) = match fstype {
            "cgroup2" => ("cgroup2", "", ""),
            "cgroup" if options.split(',').any(|o| o == "name=systemd") => ("cgroup", "name=systemd", "name=systemd"),
            _ => continue,
        };
        // The path in /proc/self/cgroup is from the hierarchy's root; the mount may show a subtree.
        let own = own_path(controllers);
        let own = own.strip_prefix(root).unwrap_or_else(|_| panic!("{} shows {root}, not our cgroup {}", mount.display(), own.display()));
        found.push(Hierarchy { mount: mount.to_path_buf(), fstype, data, own: own.to_path_buf() });
    }
    let unified = found.iter().any(|h| h.mount == Path::new(CGROUP_ROOT));
    let systemd_v1 = found.iter().any(|h| h.data == "name=systemd");
    assert!(
        unified || systemd_v1,
        "systemd needs /sys/fs/cgroup to be a cgroup2 mount, or a tmpfs with a `name=systemd` hierarchy in it; here:\n{}",
        mountinfo.lines().filter(|l| l.contains(CGROUP_ROOT)).collect::<Vec<_>>().join("\n")
    );
    // Unified: only the one at the root matters.
    if unified {
        found.retain(|h| h.mount == Path::new(CGROUP_ROOT));
    }
    found
}

/// The processes in the cgroup `dir` and below.
fn procs_in(dir: &Path) -> Vec<u32> {
    let mut pids: Vec<u32> =
        std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default().lines().filter_map(|l| l.trim().parse().ok()).collect();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            pids.extend(procs_in(&entry.path()));
        }
    }
    pids
}

/// Removes the cgroup `dir` and those below it, deepest first. A cgroup
/// whose last process just exited may still be busy a moment: retried
/// for `patience`.
fn remove_tree(dir: &Path, patience: Duration) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&entry.path(), patience)?;
        }
    }
    let deadline = Instant::now() + patience;
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => std::thread::sleep(POLL),
            Err(e) => return Err(e),
        }
    }
}

/// Removes the empty cgroups of test processes that died before their
/// [`UserManager`] dropped (a test killed outright). Only empty ones: a
/// cgroup with a process in it cannot be removed.
fn remove_abandoned() {
    for h in hierarchies() {
        let parent = h.mount.join(&h.own);
        for entry in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)).and_then(|rest| rest.split('-').next()) else {
                continue;
            };
            if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
                let _ = remove_tree(&entry.path(), Duration::ZERO);
            }
        }
    }
}
