//! The machine a run measured: CPU, cores, memory, load, and its memory read
//! bandwidth (a multi-threaded read loop over a buffer far larger than the caches).

use std::process::Command;

/// What the report says about the machine.
#[derive(Clone, Debug)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub memory_gib: f64,
    pub os: String,
}

impl Machine {
    pub fn detect() -> Machine {
        let cpu = lscpu_field("Model name").or_else(|| sysctl("machdep.cpu.brand_string")).unwrap_or_else(|| "unknown CPU".to_owned());
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Machine { cpu, cores, memory_gib: memory_bytes() as f64 / (1u64 << 30) as f64, os: os_line() }
    }
}

fn lscpu_field(name: &str) -> Option<String> {
    let out = Command::new("lscpu").env("LC_ALL", "C").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')).map(|v| v.trim().to_owned()))
        .filter(|v| !v.is_empty())
}

fn sysctl(name: &str) -> Option<String> {
    let out = Command::new("sysctl").arg("-n").arg(name).output().ok()?;
    let s = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (!s.is_empty()).then_some(s)
}

fn memory_bytes() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let total_kb = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()));
    if let Some(kb) = total_kb {
        return kb * 1024;
    }
    sysctl("hw.memsize").and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn os_line() -> String {
    let out = Command::new("uname").args(["-srm"]).output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).unwrap_or_default()
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> Option<[f64; 3]> {
    let mut l = [0f64; 3];
    // SAFETY: getloadavg writes at most 3 doubles into the array.
    let n = unsafe { libc::getloadavg(l.as_mut_ptr(), 3) };
    (n == 3).then_some(l)
}

/// The current time in UTC, as `date -u` would print it (ISO 8601).
pub fn utc_now() -> String {
    let out = Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]).output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).unwrap_or_default()
}

/// Measures how much CPU other processes took while a measurement ran:
/// busy CPU time of the whole machine (/proc/stat) minus the CPU time of this
/// process and its waited-for children (getrusage). Linux only.
pub struct CpuMeter {
    start: Option<(f64, f64, std::time::Instant)>,
}

impl CpuMeter {
    pub fn start() -> CpuMeter {
        CpuMeter { start: machine_busy_s().map(|b| (b, own_cpu_s(), std::time::Instant::now())) }
    }

    /// Share of the machine's CPU capacity (all cores) that other processes
    /// used since `start`, in percent.
    pub fn others_percent(&self) -> Option<f64> {
        let (busy0, own0, t0) = self.start?;
        let wall = t0.elapsed().as_secs_f64();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let others = (machine_busy_s()? - busy0) - (own_cpu_s() - own0);
        (wall > 0.0).then(|| (100.0 * others / (wall * cores)).max(0.0))
    }
}

/// Busy (not idle, not iowait) CPU seconds of all cores since boot.
fn machine_busy_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<f64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    if v.len() < 5 {
        return None;
    }
    // user nice system idle iowait irq softirq steal [guest guest_nice, already in user/nice]
    let busy: f64 = v.iter().take(8).sum::<f64>() - v[3] - v[4];
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(busy / hz)
}

/// User + system CPU seconds of this process and of its children that were waited for.
fn own_cpu_s() -> f64 {
    let secs = |who| {
        // SAFETY: getrusage fills the struct it is given.
        let mut r: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(who, &mut r) } != 0 {
            return 0.0;
        }
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        tv(r.ru_utime) + tv(r.ru_stime)
    };
    secs(libc::RUSAGE_SELF) + secs(libc::RUSAGE_CHILDREN)
}

/// The read-bandwidth measurement, shared with the default-model choice (revis-models), which
/// runs it on a smaller buffer at first use.
pub use revis_models::machine::{bandwidth_buffer, read_bandwidth};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidth_is_measured() {
        let bw = read_bandwidth(&bandwidth_buffer(1 << 20), 2, 1);
        assert!(bw > 0.0);
    }
}
