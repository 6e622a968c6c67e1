//! This machine as the choice of a model sees it: its memory, and its memory read
//! bandwidth (threads summing disjoint parts of a buffer far larger than the caches).
//!
//! [`read_bandwidth`] and [`bandwidth_buffer`] are the measurement revis-bench
//! reports too (it uses a 1 GiB buffer and best of 5); [`Machine::measure`]
//! runs the same loop on [`QUICK_BUFFER_BYTES`] for at most [`QUICK_PASSES`]
//! passes or about 60 ms, so a first `revis chat` or `revis models` waits
//! 50–150 ms for it (most of it the page faults of filling the buffer). A
//! machine whose last-level cache holds the buffer reads it faster than its
//! memory, and a machine busy with other work slower: the figure is a first
//! estimate, not revis-bench's.

use std::time::{Duration, Instant};

/// The buffer [`Machine::measure`] reads: 64 MiB, larger than the last-level
/// cache of laptops and desktops (server parts with more cache read higher).
pub const QUICK_BUFFER_BYTES: usize = 64 << 20;
/// Passes of [`Machine::measure`] at most, the best kept.
pub const QUICK_PASSES: usize = 8;
/// [`Machine::measure`] stops passing once this much time went on reading.
const QUICK_BUDGET: Duration = Duration::from_millis(60);

/// What the default-model choice needs to know about a machine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Machine {
    /// Physical memory, or the cgroup's limit when lower (a container).
    pub memory_bytes: u64,
    /// Memory read bandwidth with every core reading, in bytes per second.
    pub bandwidth_bytes_per_s: f64,
}

impl Machine {
    /// Measures this machine: its memory at once, its bandwidth in about 100 ms.
    pub fn measure() -> Machine {
        Machine { memory_bytes: memory_bytes(), bandwidth_bytes_per_s: quick_bandwidth() }
    }
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

fn quick_bandwidth() -> f64 {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let buffer = bandwidth_buffer(QUICK_BUFFER_BYTES);
    let started = Instant::now();
    let mut best = 0f64;
    for _ in 0..QUICK_PASSES {
        best = best.max(read_bandwidth(&buffer, threads, 1));
        if started.elapsed() > QUICK_BUDGET {
            break;
        }
    }
    best
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn measuring_this_machine_is_quick_and_plausible() {
        let started = Instant::now();
        let m = Machine::measure();
        let took = started.elapsed();
        assert!(took < Duration::from_millis(1000), "took {took:?}");
        assert!(m.memory_bytes >= 256 << 20, "{m:?}");
        // Anything that runs revis reads memory faster than 100 MB/s and slower than 10 TB/s.
        assert!((1e8..1e13).contains(&m.bandwidth_bytes_per_s), "{m:?}");
    }
}
