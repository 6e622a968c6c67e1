//! How many threads each `llama_decode` gets: chosen by measurement while
//! the engine runs, for the load of the moment (ARCHITECTURE.md, "Threads").
//!
//! llama.cpp's CPU kernels split a step's work between their threads and
//! wait for all of them at every barrier, spinning. When another process
//! wants a core, the OS takes it from one of them and the others spin until
//! it is back: on 2 cores with one other busy process, 2 threads decode at
//! under half the speed of 1 (0.45-0.6, docs/BENCHMARKS.md). No fixed count is right for a machine a
//! person uses, so the [`Tuner`] times each call and moves between counts:
//!
//! - Counts come from a ladder: every count up to 4, then steps of about a
//!   quarter (16 cores: 16, 12, 9, 6, 4, 3, 2, 1).
//! - Calls are grouped by their number of tokens ([`bucket`]: one token,
//!   a few, a batch, a long batch), since a prompt's batch and a single
//!   token are limited by different things (compute, memory); each group has
//!   its own count. Costs are compared per token within a group.
//! - A group probes: it runs its next calls on its count and the rungs next
//!   to it, in turn, and keeps the one whose median cost is lowest. A rung
//!   whose first call costs [`ABANDON`] times the best seen is dropped at
//!   once, so a probe of a bad count costs one call.
//! - Probes come again after [`MIN_INTERVAL`], doubling while they confirm
//!   the count, up to [`MAX_INTERVAL`], and sooner (half the interval after
//!   the last) when the median of the last calls moves [`JUMP`] times away
//!   from what the probe measured (another program started or stopped).
//! - A group seen for the first time starts from the count last chosen by
//!   any group of any model in this process (the load is the machine's).
//! - Background work (nobody waits for it) runs on half the count, rounded
//!   up, and is not measured: it leaves cores to the person and to others.
//!
//! None of this changes a result: see ARCHITECTURE.md for why a token's
//! logits do not depend on the thread count with revis's context settings,
//! and the engine test that switches counts mid-answer.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How many threads a model's calls get (`daemon.threads`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Threads {
    /// Chosen by measurement, at most `most` (the machine's cores by default).
    Auto { most: u32 },
    /// Always this many.
    Fixed(u32),
    /// Every call moves to the next count of the ladder up to `most`: a
    /// check that answers do not depend on the count (the tests run it;
    /// `threads = "cycle"`). Slow on a busy machine.
    Cycle { most: u32 },
}

impl Threads {
    /// The most threads a call may get.
    pub fn most(self) -> u32 {
        match self {
            Threads::Auto { most } | Threads::Fixed(most) | Threads::Cycle { most } => most.max(1),
        }
    }
}

/// "auto" or the count, as `daemon.threads` and `revisd split-engine --threads` take it.
impl std::fmt::Display for Threads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Threads::Auto { .. } => f.write_str("auto"),
            Threads::Cycle { .. } => f.write_str("cycle"),
            Threads::Fixed(n) => write!(f, "{n}"),
        }
    }
}

impl std::str::FromStr for Threads {
    type Err = String;

    /// "auto" (at most this machine's cores) or a count from 1 up.
    fn from_str(s: &str) -> Result<Threads, String> {
        let most = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        match s {
            "auto" => return Ok(Threads::Auto { most }),
            "cycle" => return Ok(Threads::Cycle { most }),
            _ => {}
        }
        match s.parse::<u32>() {
            Ok(n) if n >= 1 => Ok(Threads::Fixed(n)),
            _ => Err(format!("{s:?} is not \"auto\" or a number of threads from 1 up")),
        }
    }
}

/// The first probe after a change of count comes this soon.
pub const MIN_INTERVAL: Duration = Duration::from_millis(500);
/// Probes that keep confirming the count come at most this far apart.
pub const MAX_INTERVAL: Duration = Duration::from_secs(8);
/// A rung whose first call costs this much more than the best seen in the
/// probe is dropped from it.
pub const ABANDON: f64 = 1.5;
/// A median of recent costs this far from the probe's (either way) probes again.
pub const JUMP: f64 = 1.4;
/// Recent costs kept for the median.
const RECENT: usize = 8;
/// At least this many recent costs before a jump is judged.
const RECENT_MIN: usize = 4;

/// Groups of calls by their number of tokens.
const BUCKETS: usize = 4;

/// The group of a call of `tokens` tokens: 1; 2 to 15 (several answers'
/// steps, drafts); 16 to 127; 128 and more (prompt batches).
pub fn bucket(tokens: usize) -> usize {
    match tokens {
        0 | 1 => 0,
        2..=15 => 1,
        16..=127 => 2,
        _ => 3,
    }
}

/// Samples of each rung in a probe: prompt batches are long and their cost
/// varies little, single tokens are short and noisy.
fn samples(bucket: usize) -> usize {
    if bucket >= 2 { 1 } else { 3 }
}

/// The counts a tuner moves between, ascending.
pub fn ladder(most: u32) -> Vec<u32> {
    let mut rungs = Vec::new();
    let mut n = most.max(1);
    while n > 1 {
        rungs.push(n);
        n = if n <= 4 { n - 1 } else { (n * 3 / 4).min(n - 1) };
    }
    rungs.push(1);
    rungs.reverse();
    rungs
}

/// The count last chosen in this process (0: none yet): a group seen for the
/// first time starts there.
static LAST_CHOSEN: AtomicU32 = AtomicU32::new(0);

/// What one call runs with, from [`Tuner::plan`]; given back to
/// [`Tuner::record`] with what the call took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub threads: u32,
    bucket: usize,
    /// A rung's index when the call is timed: a probe's sample, or the
    /// count's own.
    timed: Option<Timed>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timed {
    Probe(usize),
    Current,
}

/// Counts for one model's calls (see the module doc).
#[derive(Debug)]
pub struct Tuner {
    fixed: bool,
    /// [`Threads::Cycle`]: the rung of the last call.
    cycle: Option<usize>,
    ladder: Vec<u32>,
    groups: [Group; BUCKETS],
}

#[derive(Debug, Default)]
struct Group {
    /// The rung in use; None until the group's first call.
    at: Option<usize>,
    recent: VecDeque<f64>,
    /// The median cost the last probe measured for `at`.
    baseline: f64,
    next_probe: Option<Instant>,
    /// When the last probe ended.
    probed: Option<Instant>,
    interval: Duration,
    probe: Option<Probe>,
}

#[derive(Debug)]
struct Probe {
    rungs: Vec<usize>,
    costs: Vec<Vec<f64>>,
    dropped: Vec<bool>,
    /// Which of `rungs` runs next.
    turn: usize,
}

impl Tuner {
    pub fn new(threads: Threads) -> Tuner {
        let (fixed, ladder) = match threads {
            Threads::Fixed(n) => (true, vec![n.max(1)]),
            Threads::Auto { most } | Threads::Cycle { most } => (false, ladder(most)),
        };
        let cycle = matches!(threads, Threads::Cycle { .. }).then_some(0);
        Tuner { fixed, cycle, ladder, groups: Default::default() }
    }

    /// The count the group of single-token calls uses now (the most, before any call).
    pub fn current(&self) -> u32 {
        self.groups[0].at.map_or(*self.ladder.last().expect("a ladder has a rung"), |at| self.ladder[at])
    }

    /// The count for a call of `tokens` tokens; `background`: nobody waits for it.
    pub fn plan(&mut self, tokens: usize, background: bool, now: Instant) -> Plan {
        let top = self.ladder.len() - 1;
        let b = bucket(tokens);
        if self.fixed {
            return Plan { threads: self.ladder[0], bucket: b, timed: None };
        }
        if let Some(rung) = self.cycle.as_mut() {
            *rung = (*rung + 1) % self.ladder.len();
            return Plan { threads: self.ladder[*rung], bucket: b, timed: None };
        }
        let g = &mut self.groups[b];
        let at = *g.at.get_or_insert_with(|| {
            let hint = LAST_CHOSEN.load(Ordering::Relaxed);
            g.next_probe = Some(now);
            g.interval = MIN_INTERVAL;
            self.ladder.iter().rposition(|&n| hint != 0 && n <= hint).unwrap_or(top)
        });
        if background {
            return Plan { threads: self.ladder[at].div_ceil(2), bucket: b, timed: None };
        }
        if g.probe.is_none() && top > 0 && g.next_probe.is_some_and(|t| t <= now) {
            let rungs: Vec<usize> = [Some(at), at.checked_sub(1), (at < top).then_some(at + 1)].into_iter().flatten().collect();
            let n = rungs.len();
            g.probe = Some(Probe { rungs, costs: vec![Vec::new(); n], dropped: vec![false; n], turn: 0 });
        }
        match &g.probe {
            Some(p) => Plan { threads: self.ladder[p.rungs[p.turn]], bucket: b, timed: Some(Timed::Probe(p.turn)) },
            None => Plan { threads: self.ladder[at], bucket: b, timed: Some(Timed::Current) },
        }
    }

    /// Records what a call planned with `plan` took for its `tokens` tokens.
    pub fn record(&mut self, plan: Plan, tokens: usize, took: Duration, now: Instant) {
        let cost = took.as_secs_f64() * 1e6 / tokens.max(1) as f64;
        let g = &mut self.groups[plan.bucket];
        match plan.timed {
            None => {}
            Some(Timed::Current) => {
                g.recent.push_back(cost);
                if g.recent.len() > RECENT {
                    g.recent.pop_front();
                }
                if g.recent.len() >= RECENT_MIN {
                    let m = median(g.recent.iter().copied());
                    if m > g.baseline * JUMP || m * JUMP < g.baseline {
                        // Not sooner than half the interval after the last
                        // probe: on a noisy machine (every core taken)
                        // medians jump without a change of load, and each
                        // probe of a bad count costs.
                        let soonest = g.probed.map_or(now, |t| t + (g.interval / 2).max(MIN_INTERVAL)).max(now);
                        g.next_probe = Some(g.next_probe.map_or(soonest, |t| t.min(soonest)));
                        g.recent.clear();
                    }
                }
            }
            Some(Timed::Probe(i)) => {
                let Some(p) = g.probe.as_mut() else { return };
                if i >= p.rungs.len() {
                    return;
                }
                let best = p.costs.iter().flatten().copied().fold(f64::INFINITY, f64::min);
                if p.costs[i].is_empty() && cost > best * ABANDON {
                    p.dropped[i] = true;
                }
                p.costs[i].push(cost);
                let wanted = samples(plan.bucket);
                let open = |p: &Probe, j: usize| !p.dropped[j] && p.costs[j].len() < wanted;
                let n = p.rungs.len();
                match (1..=n).map(|k| (p.turn + k) % n).find(|&j| open(p, j)) {
                    Some(next) => p.turn = next,
                    None => {
                        let p = g.probe.take().expect("a probe");
                        let (best, cost) = (0..n)
                            .filter(|&j| !p.costs[j].is_empty())
                            .map(|j| (p.rungs[j], median(p.costs[j].iter().copied())))
                            .min_by(|a, b| a.1.total_cmp(&b.1))
                            .expect("the probe timed a rung");
                        let was = g.at;
                        g.at = Some(best);
                        g.baseline = cost;
                        g.recent.clear();
                        g.interval = if was == Some(best) { (g.interval * 2).clamp(MIN_INTERVAL, MAX_INTERVAL) } else { MIN_INTERVAL };
                        g.next_probe = Some(now + g.interval);
                        g.probed = Some(now);
                        LAST_CHOSEN.store(self.ladder[best], Ordering::Relaxed);
                    }
                }
            }
        }
    }
}

fn median(costs: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = costs.collect();
    if v.is_empty() {
        return f64::INFINITY;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine: what a token costs (µs) with `n` threads while `busy`
    /// other processes spin on its `cores` cores (the shape measured in
    /// engine-notes.md: spinning barriers make every extra thread that
    /// shares a core with another process cost dearly).
    fn cost(cores: u32, busy: u32, n: u32) -> f64 {
        let free = cores.saturating_sub(busy).max(1);
        let work = 10_000.0 / f64::from(n).powf(0.8);
        if n <= free { work } else { work * 3.0 * f64::from(n - free + 1) }
    }

    /// Runs single-token calls on a tuner of `cores` for `secs` seconds of
    /// the machine's time, the load given by `busy(second)`; returns each
    /// call's second and threads.
    fn drive(tuner: &mut Tuner, cores: u32, secs: f64, busy: impl Fn(f64) -> u32) -> Vec<(f64, u32)> {
        let start = Instant::now();
        let mut now = start;
        let mut used = Vec::new();
        while (now - start).as_secs_f64() < secs {
            let at = (now - start).as_secs_f64();
            let plan = tuner.plan(1, false, now);
            let took = Duration::from_secs_f64(cost(cores, busy(at), plan.threads) / 1e6);
            now += took;
            tuner.record(plan, 1, took, now);
            used.push((at, plan.threads));
        }
        used
    }

    /// The share of calls between `from` and `to` seconds that ran on `want`.
    fn share_on(used: &[(f64, u32)], from: f64, to: f64, want: u32) -> f64 {
        let window: Vec<u32> = used.iter().filter(|(t, _)| (from..to).contains(t)).map(|&(_, n)| n).collect();
        window.iter().filter(|&&n| n == want).count() as f64 / window.len().max(1) as f64
    }

    fn best(cores: u32, busy: u32) -> u32 {
        ladder(cores).into_iter().min_by(|&a, &b| cost(cores, busy, a).total_cmp(&cost(cores, busy, b))).unwrap()
    }

    #[test]
    fn the_ladder_covers_one_to_the_most() {
        assert_eq!(ladder(1), vec![1]);
        assert_eq!(ladder(2), vec![1, 2]);
        assert_eq!(ladder(4), vec![1, 2, 3, 4]);
        assert_eq!(ladder(16), vec![1, 2, 3, 4, 6, 9, 12, 16]);
    }

    #[test]
    fn a_fixed_count_is_kept_whatever_the_load() {
        let mut t = Tuner::new(Threads::Fixed(2));
        assert!(drive(&mut t, 2, 10.0, |_| 3).iter().all(|&(_, n)| n == 2));
        assert_eq!(t.plan(512, true, Instant::now()).threads, 2);
    }

    #[test]
    fn on_a_quiet_machine_almost_every_call_runs_on_every_core() {
        for cores in [2, 4, 8] {
            let mut t = Tuner::new(Threads::Auto { most: cores });
            let used = drive(&mut t, cores, 60.0, |_| 0);
            let share = share_on(&used, 0.0, 60.0, cores);
            assert!(share >= 0.99, "{cores} cores: {:.3} of the calls on every core", share);
        }
    }

    #[test]
    fn it_follows_the_load_as_it_comes_and_goes() {
        for (cores, busy) in [(2, 1), (2, 3), (4, 1), (4, 3), (8, 3)] {
            let mut t = Tuner::new(Threads::Auto { most: cores });
            // Quiet, busy, quiet again: 30 s each. Each phase is judged
            // from MAX_INTERVAL and a few probes after its start.
            let phase = |s: f64| if (30.0..60.0).contains(&s) { busy } else { 0 };
            let used = drive(&mut t, cores, 90.0, phase);
            let settle = MAX_INTERVAL.as_secs_f64() + 4.0;
            for (start, want) in [(0.0, cores), (30.0, best(cores, busy)), (60.0, cores)] {
                let share = share_on(&used, start + settle, start + 30.0, want);
                assert!(share >= 0.95, "{cores} cores, {busy} busy, from {start} s: {share:.3} of the calls on {want}");
            }
        }
    }

    #[test]
    fn background_work_takes_half_and_is_not_timed() {
        let mut t = Tuner::new(Threads::Auto { most: 4 });
        let now = Instant::now();
        let plan = t.plan(1, true, now);
        assert_eq!(plan.threads, 2);
        assert_eq!(plan.timed, None);
        assert_eq!(Tuner::new(Threads::Auto { most: 1 }).plan(1, true, now).threads, 1);
    }

    #[test]
    fn cycling_moves_every_call() {
        let mut t = Tuner::new(Threads::Cycle { most: 2 });
        let now = Instant::now();
        let used: Vec<u32> = (0..4).map(|_| t.plan(1, false, now).threads).collect();
        assert_eq!(used, [2, 1, 2, 1]);
    }

    #[test]
    fn calls_are_grouped_by_their_size() {
        assert_eq!([1, 2, 15, 16, 127, 128, 512].map(bucket), [0, 1, 1, 2, 2, 3, 3]);
    }
}
