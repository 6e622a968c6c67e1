//! This machine as the choice of a model sees it: its memory, its memory read
//! bandwidth, the arithmetic its cores do, and whether other programs were
//! using them while it was measured.
//!
//! - **Bandwidth**: threads summing disjoint parts of a buffer larger than
//!   the caches ([`read_bandwidth`], [`bandwidth_buffer`]; revis-bench
//!   reports the same loop on a 1 GiB buffer).
//! - **Arithmetic**: threads, one per core, each multiplying and adding two
//!   small integer vectors that stay in its core's cache ([`dot_ops`]): the
//!   kind of work a quantized matrix-vector product is. On two or four cores a
//!   small model decodes at the speed of this arithmetic, not of memory.
//! - **Others' use**: the share of the cores other programs kept busy while
//!   it measured ([`Load`], from /proc/stat on Linux; unknown elsewhere).
//!
//! [`Machine::measure`] repeats each probe [`PASSES`] times after one
//! warm-up pass and keeps the median with the range ([`Probe`]): a single
//! best pass of a 64 MiB buffer read 21 GB/s in one run and 56 GB/s in
//! another on the same machine (part of the buffer sat in a large
//! last-level cache). It takes about a quarter of a second.

use std::time::Instant;

/// The buffer [`Machine::measure`] reads: 128 MiB, larger than the
/// last-level cache of laptops, desktops and most servers.
pub const QUICK_BUFFER_BYTES: usize = 128 << 20;
/// Timed passes of each probe in [`Machine::measure`], after one warm-up.
pub const PASSES: usize = 7;
/// Multiply-adds each thread does in one pass of the arithmetic probe.
const DOT_LEN: usize = 4096;
const DOT_REPEATS: usize = 8000;

/// A repeated measurement: its median and range.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Probe {
    pub median: f64,
    pub low: f64,
    pub high: f64,
}

impl Probe {
    /// The median and range of `samples` (all zero when there are none).
    pub fn of(samples: &[f64]) -> Probe {
        let mut s: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        if s.is_empty() {
            return Probe::exactly(0.0);
        }
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 };
        Probe { median, low: s[0], high: s[n - 1] }
    }

    /// One figure, no spread (a machine described rather than measured).
    pub fn exactly(x: f64) -> Probe {
        Probe { median: x, low: x, high: x }
    }

    /// Half the range as a share of the median: "±4%".
    pub fn spread(&self) -> f64 {
        if self.median > 0.0 { (self.high - self.low) / 2.0 / self.median } else { 0.0 }
    }
}

/// What the default-model choice needs to know about a machine.
#[derive(Clone, Debug, PartialEq)]
pub struct Machine {
    /// Physical memory, or the cgroup's limit when lower (a container).
    pub memory_bytes: u64,
    /// Memory read bandwidth with every core reading, in bytes per second.
    pub bandwidth: Probe,
    /// 16-bit integer multiply-adds per second, every core computing ([`dot_ops`]).
    pub arithmetic: Probe,
    /// Cores this process may use.
    pub cores: u32,
    /// Others' use of the cores while it measured; None where it cannot be read.
    pub load: Option<Load>,
    /// A real decode of a downloaded model on this machine, when one was run
    /// ([`Machine::with_decode`]): the speed estimates follow it.
    pub decode: Option<Decode>,
}

/// A real decode of a model on this machine (`revisd measure-speed`).
#[derive(Clone, Debug, PartialEq)]
pub struct Decode {
    /// Its catalog name.
    pub model: String,
    /// Its parameters ([`crate::CatalogEntry::parameters`]).
    pub parameters: f64,
    /// Its file size in bytes.
    pub size: u64,
    /// Tokens per second it decoded greedily.
    pub tokens_per_s: f64,
}

/// Other programs' use of the cores while this process measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Load {
    /// Cores' worth of time others took (1.0 = one core kept busy).
    pub others_cores: f64,
}

/// Others keeping at least this many cores' worth busy make the machine "busy".
pub const BUSY_CORES: f64 = 0.3;

impl Load {
    /// Whether others used at least [`BUSY_CORES`] while it measured.
    pub fn busy(&self) -> bool {
        self.others_cores >= BUSY_CORES
    }
}

impl Machine {
    /// Measures this machine: its memory at once, its bandwidth and
    /// arithmetic in about a quarter of a second, and others' use meanwhile.
    pub fn measure() -> Machine {
        let cores = cores();
        let watch = LoadWatch::start();
        let buffer = bandwidth_buffer(QUICK_BUFFER_BYTES);
        let threads = cores as usize;
        read_bandwidth(&buffer, threads, 1);
        let bw: Vec<f64> = (0..PASSES).map(|_| read_bandwidth(&buffer, threads, 1)).collect();
        drop(buffer);
        dot_ops(threads);
        let ops: Vec<f64> = (0..PASSES).map(|_| dot_ops(threads)).collect();
        Machine {
            memory_bytes: memory_bytes(),
            bandwidth: Probe::of(&bw),
            arithmetic: Probe::of(&ops),
            cores,
            load: watch.and_then(LoadWatch::finish),
            decode: None,
        }
    }

    /// The same machine, its speed estimates following `decode`.
    pub fn with_decode(self, decode: Decode) -> Machine {
        Machine { decode: Some(decode), ..self }
    }

    /// Whether others kept the cores busy while it measured.
    pub fn busy(&self) -> bool {
        self.load.is_some_and(|l| l.busy())
    }
}

/// Cores this process may use (at least 1).
pub fn cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as u32
}

/// Physical memory in bytes (sysconf), or the cgroup v2 limit of this process when lower.
pub fn memory_bytes() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    let physical = if pages > 0 && page > 0 { pages as u64 * page as u64 } else { 0 };
    match cgroup_limit() {
        Some(limit) if physical == 0 || limit < physical => limit,
        _ => physical,
    }
}

/// `memory.max` of this process's cgroup (v2), when it is a number.
fn cgroup_limit() -> Option<u64> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let max = std::fs::read_to_string(format!("/sys/fs/cgroup{}/memory.max", path.trim_end_matches('/'))).ok()?;
    max.trim().parse().ok()
}

/// Best-of-`passes` read bandwidth in bytes per second with `threads`
/// threads, each summing its own slice of `buffer`.
pub fn read_bandwidth(buffer: &[u64], threads: usize, passes: usize) -> f64 {
    let threads = threads.max(1);
    let chunk = buffer.len().div_ceil(threads).max(1);
    let mut best = 0f64;
    for _ in 0..passes.max(1) {
        let started = Instant::now();
        let sum: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = buffer.chunks(chunk).map(|part| s.spawn(move || sum_slice(part))).collect();
            handles.into_iter().map(|h| h.join().expect("bandwidth thread")).fold(0, u64::wrapping_add)
        });
        let secs = started.elapsed().as_secs_f64();
        std::hint::black_box(sum);
        best = best.max(std::mem::size_of_val(buffer) as f64 / secs);
    }
    best
}

/// A buffer of `bytes` bytes with every page written (so none is the shared
/// zero page), for [`read_bandwidth`]; filled by one thread per core, which
/// share the page faults.
pub fn bandwidth_buffer(bytes: usize) -> Vec<u64> {
    let n = bytes / 8;
    let mut v = vec![0u64; n];
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let chunk = n.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (i, part) in v.chunks_mut(chunk).enumerate() {
            s.spawn(move || {
                for (j, x) in part.iter_mut().enumerate() {
                    *x = ((i * chunk + j) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                }
            });
        }
    });
    v
}

/// Sums with eight independent accumulators, so the loop is bound by loads, not by one add chain.
fn sum_slice(v: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut it = v.chunks_exact(8);
    for c in &mut it {
        for i in 0..8 {
            acc[i] = acc[i].wrapping_add(c[i]);
        }
    }
    let tail: u64 = it.remainder().iter().fold(0, |a, &b| a.wrapping_add(b));
    acc.iter().fold(tail, |a, &b| a.wrapping_add(b))
}

/// Multiply-adds per second, `threads` threads each taking the dot product
/// of two vectors of 16-bit integers ([`DOT_LEN`] each, 16 KiB together, so
/// they stay in the core's first-level cache) [`DOT_REPEATS`] times: what the
/// cores compute when memory is not what waits. The compiler vectorizes the
/// loop for the target's baseline instruction set (SSE2 on x86-64, NEON on
/// arm64), not the best one of this CPU as llama.cpp's kernels do: the
/// estimate takes a measured share of it (`choose::ARITHMETIC_SHARE`).
pub fn dot_ops(threads: usize) -> f64 {
    let threads = threads.max(1);
    let a: Vec<i16> = (0..DOT_LEN).map(|i| (i % 251) as i16 - 125).collect();
    let b: Vec<i16> = (0..DOT_LEN).map(|i| (i % 241) as i16 - 120).collect();
    let started = Instant::now();
    let sum = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (a, b) = (&a, &b);
                s.spawn(move || {
                    let mut acc = 0i32;
                    for _ in 0..DOT_REPEATS {
                        acc = acc.wrapping_add(dot(std::hint::black_box(a), std::hint::black_box(b)));
                    }
                    acc
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("arithmetic thread")).fold(0i32, i32::wrapping_add)
    });
    std::hint::black_box(sum);
    (threads * DOT_LEN * DOT_REPEATS) as f64 / started.elapsed().as_secs_f64()
}

fn dot(a: &[i16], b: &[i16]) -> i32 {
    a.iter().zip(b).fold(0i32, |s, (x, y)| s.wrapping_add(i32::from(*x) * i32::from(*y)))
}

/// Counts others' use of the cores between [`LoadWatch::start`] and
/// [`LoadWatch::finish`]: the machine's busy time (/proc/stat) less this
/// process's (/proc/self/stat), over the time that passed.
struct LoadWatch {
    started: Instant,
    machine_busy: u64,
    own: u64,
}

impl LoadWatch {
    fn start() -> Option<LoadWatch> {
        Some(LoadWatch { started: Instant::now(), machine_busy: machine_busy_ticks()?, own: own_ticks()? })
    }

    fn finish(self) -> Option<Load> {
        let secs = self.started.elapsed().as_secs_f64();
        let machine = machine_busy_ticks()?.saturating_sub(self.machine_busy);
        let own = own_ticks()?.saturating_sub(self.own);
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        if hz <= 0 || secs <= 0.0 {
            return None;
        }
        Some(Load { others_cores: machine.saturating_sub(own) as f64 / hz as f64 / secs })
    }
}

/// Ticks every core spent on anything but idling and waiting for I/O (the `cpu` line of /proc/stat).
fn machine_busy_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_busy(stat.lines().next()?)
}

/// The busy ticks of a /proc/stat `cpu` line: user, nice, system, irq, softirq, steal.
fn parse_busy(line: &str) -> Option<u64> {
    let fields: Vec<u64> = line.strip_prefix("cpu ")?.split_whitespace().map(|f| f.parse().ok()).collect::<Option<_>>()?;
    let f = |i: usize| fields.get(i).copied().unwrap_or(0);
    (fields.len() >= 4).then(|| f(0) + f(1) + f(2) + f(5) + f(6) + f(7))
}

/// This process's user and system ticks, all its threads together (/proc/self/stat).
fn own_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_own(&stat)
}

/// utime + stime of a /proc/PID/stat line (fields 14 and 15; the name in
/// parentheses may hold spaces, so counting starts after its last ')').
fn parse_own(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the name: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn sums_every_element() {
        let v: Vec<u64> = (1..=21).collect();
        assert_eq!(sum_slice(&v), 231);
        let buffer = bandwidth_buffer(1 << 20);
        assert_eq!(buffer.len(), 1 << 17);
        assert!(buffer.iter().enumerate().all(|(i, x)| *x == (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)), "every word written");
        let bw = read_bandwidth(&bandwidth_buffer(1 << 20), 2, 1);
        assert!(bw > 0.0);
    }

    #[test]
    fn a_probe_is_its_median_and_range() {
        let p = Probe::of(&[3.0, 1.0, 2.0, f64::NAN, 10.0]);
        assert_eq!(p, Probe { median: 2.5, low: 1.0, high: 10.0 });
        assert_eq!(Probe::of(&[4.0, 1.0, 2.0]).median, 2.0);
        assert!((Probe::of(&[9.0, 10.0, 11.0]).spread() - 0.1).abs() < 1e-12);
        assert_eq!(Probe::of(&[]), Probe::exactly(0.0));
    }

    #[test]
    fn others_use_is_read_from_the_kernels_counters() {
        assert_eq!(parse_busy("cpu  100 5 50 9000 40 3 2 7 0 0"), Some(100 + 5 + 50 + 3 + 2 + 7));
        assert_eq!(parse_busy("cpu0 1 2 3 4"), None, "the machine's line, not a core's");
        let own = "1234 (a name) with) R 1 2 3 4 5 6 7 8 9 10 77 23 0 0 20 0 3";
        assert_eq!(parse_own(own), Some(100));
        assert_eq!(parse_own("garbage"), None);
    }

    #[test]
    fn the_arithmetic_probe_counts_what_it_does() {
        assert_eq!(dot(&[1, -2, 3], &[4, 5, -6]), 4 - 10 - 18);
        let one = dot_ops(1);
        assert!((1e6..1e13).contains(&one), "{one}");
    }

    #[test]
    fn measuring_this_machine_is_quick_and_plausible() {
        let started = Instant::now();
        let m = Machine::measure();
        let took = started.elapsed();
        // A quarter of a second on a quiet machine; a busy one may take several times that.
        assert!(took < Duration::from_secs(10), "took {took:?}");
        assert!(m.memory_bytes >= 256 << 20, "{m:?}");
        // Anything that runs revis reads memory faster than 100 MB/s and slower than 10 TB/s.
        assert!((1e8..1e13).contains(&m.bandwidth.median), "{m:?}");
        assert!(m.bandwidth.low <= m.bandwidth.median && m.bandwidth.median <= m.bandwidth.high, "{m:?}");
        assert!(m.arithmetic.median > 1e6, "{m:?}");
        assert!(m.cores >= 1 && m.decode.is_none());
        if cfg!(target_os = "linux") {
            let load = m.load.expect("Linux has /proc/stat");
            assert!(load.others_cores >= 0.0, "{load:?}");
        }
    }
}
