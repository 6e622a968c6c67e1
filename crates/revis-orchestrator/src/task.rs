//! Task types, their tiers and priorities (configurable per task), and the
//! background runner: most urgent first, started only when the gates allow.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use revis_client::Tier;

use crate::gates::Gates;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TaskKind {
    /// The first answer to the user.
    ChatAnswer,
    /// tier3's deeper follow-up, when tier1, the checklist or the user asks for it.
    DeepAnswer,
    /// tier1's quick check of the user's message (typos, kind, escalation).
    Classify,
    /// Summarise history that outgrew its budget.
    Summarise,
    /// Extract facts about the user for the profile.
    ExtractFacts,
    /// Check an answer after it was given.
    Audit,
    /// Merge the profile's facts once they outgrow their budget.
    Consolidate,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Urgency {
    Background,
    User,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskPolicy {
    pub tier: Tier,
    pub urgency: Urgency,
    /// Among background tasks, higher runs first.
    pub rank: u8,
}

impl TaskKind {
    pub const ALL: [TaskKind; 7] = [
        TaskKind::ChatAnswer,
        TaskKind::DeepAnswer,
        TaskKind::Classify,
        TaskKind::Summarise,
        TaskKind::ExtractFacts,
        TaskKind::Audit,
        TaskKind::Consolidate,
    ];

    pub fn default_policy(self) -> TaskPolicy {
        let (tier, urgency, rank) = match self {
            TaskKind::ChatAnswer => (Tier::Tier2, Urgency::User, 0),
            // tier3's follow-up waits for the gates like any background work,
            // but the user is waiting for it: first among them, after the check
            // that may ask for it.
            TaskKind::DeepAnswer => (Tier::Tier3, Urgency::Background, 4),
            // Before the answer when it is ready in time (while the user
            // types); else right after it, first of the background work.
            TaskKind::Classify => (Tier::Tier1, Urgency::User, 5),
            // A summary keeps the next prompt inside its budget: first.
            TaskKind::Summarise => (Tier::Tier3, Urgency::Background, 3),
            TaskKind::ExtractFacts => (Tier::Tier3, Urgency::Background, 2),
            TaskKind::Audit => (Tier::Tier3, Urgency::Background, 1),
            TaskKind::Consolidate => (Tier::Tier3, Urgency::Background, 0),
        };
        TaskPolicy { tier, urgency, rank }
    }
}

/// Per-task policies: the defaults, overridable one by one.
#[derive(Clone, Debug)]
pub struct Policies(HashMap<TaskKind, TaskPolicy>);

impl Default for Policies {
    fn default() -> Self {
        Policies(TaskKind::ALL.into_iter().map(|k| (k, k.default_policy())).collect())
    }
}

impl Policies {
    pub fn get(&self, kind: TaskKind) -> &TaskPolicy {
        &self.0[&kind]
    }

    pub fn set(&mut self, kind: TaskKind, policy: TaskPolicy) {
        self.0.insert(kind, policy);
    }
}

type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The waiting jobs, and the sequence number of the last one submitted.
type Queued = (BinaryHeap<Item>, u64);

struct Item {
    rank: u8,
    seq: u64,
    job: Job,
}

impl PartialEq for Item {
    fn eq(&self, o: &Self) -> bool {
        (self.rank, self.seq) == (o.rank, o.seq)
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Item {
    fn cmp(&self, o: &Self) -> Ordering {
        self.rank.cmp(&o.rank).then_with(|| o.seq.cmp(&self.seq))
    }
}

/// Runs background jobs, highest rank first (first come first served within
/// a rank), each only once every gate is open; one at a time, or as many at
/// once as a parallelism the dispatcher sets (one per daemon that can take
/// them).
#[derive(Clone)]
pub struct Background {
    inner: Arc<(Mutex<Queued>, Notify)>,
    /// Jobs submitted and not yet finished.
    outstanding: tokio::sync::watch::Sender<usize>,
}

impl Background {
    /// Starts the runner on the current tokio runtime: one job at a time.
    pub fn start(gates: Gates) -> Background {
        Self::start_with(gates, None)
    }

    /// Starts the runner; up to `parallel` jobs run at once (None = one).
    pub fn start_with(gates: Gates, parallel: Option<tokio::sync::watch::Receiver<usize>>) -> Background {
        let bg = Background {
            inner: Arc::new((Mutex::new((BinaryHeap::new(), 0)), Notify::new())),
            outstanding: tokio::sync::watch::Sender::new(0),
        };
        let runner = bg.clone();
        tokio::spawn(async move {
            let mut parallel = parallel;
            let mut running = tokio::task::JoinSet::new();
            loop {
                let limit = parallel.as_ref().map_or(1, |p| (*p.borrow()).max(1));
                if running.len() >= limit {
                    tokio::select! {
                        Some(_) = running.join_next() => runner.outstanding.send_modify(|n| *n -= 1),
                        Ok(()) = changed(&mut parallel) => {}
                    }
                    continue;
                }
                // `next` takes a job off the queue only at its end, after its
                // last await: losing this race never loses a job.
                tokio::select! {
                    job = runner.next(&gates) => {
                        running.spawn(job);
                    }
                    Some(_) = running.join_next(), if !running.is_empty() => {
                        runner.outstanding.send_modify(|n| *n -= 1);
                    }
                }
            }
        });
        bg
    }

    /// Queues a job; the returned receiver gets its result.
    pub fn submit<T: Send + 'static>(&self, rank: u8, job: impl Future<Output = T> + Send + 'static) -> tokio::sync::oneshot::Receiver<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::pin(async move {
            let _ = tx.send(job.await);
        });
        self.outstanding.send_modify(|n| *n += 1);
        let mut q = self.inner.0.lock().unwrap_or_else(|p| p.into_inner());
        q.1 += 1;
        let seq = q.1;
        q.0.push(Item { rank, seq, job });
        drop(q);
        self.inner.1.notify_one();
        rx
    }

    /// Waits until every submitted job has finished.
    pub async fn idle(&self) {
        let _ = self.outstanding.subscribe().wait_for(|n| *n == 0).await;
    }

    /// Jobs submitted and not finished (waiting or running).
    pub fn outstanding(&self) -> usize {
        *self.outstanding.borrow()
    }

    pub fn pending(&self) -> usize {
        self.inner.0.lock().unwrap_or_else(|p| p.into_inner()).0.len()
    }

    async fn next(&self, gates: &Gates) -> Job {
        loop {
            let notified = self.inner.1.notified();
            let has_work = !self.inner.0.lock().unwrap_or_else(|p| p.into_inner()).0.is_empty();
            if has_work {
                gates.background_open().await;
                if let Some(item) = self.inner.0.lock().unwrap_or_else(|p| p.into_inner()).0.pop() {
                    return item.job;
                }
                continue;
            }
            notified.await;
        }
    }
}

/// Resolves when the parallelism changes; never when there is none.
async fn changed(p: &mut Option<tokio::sync::watch::Receiver<usize>>) -> Result<(), tokio::sync::watch::error::RecvError> {
    match p {
        Some(rx) => rx.changed().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn background_jobs_wait_for_the_gates_and_run_by_rank() {
        let gates = Gates::new();
        let bg = Background::start(gates.clone());
        let order = Arc::new(Mutex::new(Vec::new()));
        gates.set_typing(true);
        let mut done = Vec::new();
        for (rank, name) in [(0, "consolidate"), (3, "summarise"), (1, "audit"), (3, "summarise-2")] {
            let order = order.clone();
            done.push(bg.submit(rank, async move { order.lock().unwrap().push(name) }));
        }
        tokio::time::sleep(Duration::from_secs(600)).await; // paused time: ten "minutes" pass at once
        assert!(order.lock().unwrap().is_empty(), "nothing runs while the user types");
        gates.set_typing(false);
        bg.idle().await;
        assert_eq!(bg.outstanding(), 0);
        for d in done {
            d.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["summarise", "summarise-2", "audit", "consolidate"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_streaming_answer_holds_background_work_and_user_work_is_not_queued_here() {
        let gates = Gates::new();
        let bg = Background::start(gates.clone());
        let answer = gates.streaming();
        let job = bg.submit(2, async { "facts" });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(bg.pending(), 1);
        drop(answer);
        assert_eq!(job.await.unwrap(), "facts");
    }

    #[test]
    fn policies_default_and_override() {
        let mut p = Policies::default();
        assert_eq!(p.get(TaskKind::ChatAnswer).tier, Tier::Tier2);
        assert_eq!(p.get(TaskKind::Summarise).urgency, Urgency::Background);
        p.set(TaskKind::Summarise, TaskPolicy { tier: Tier::Tier2, urgency: Urgency::Background, rank: 9 });
        assert_eq!(p.get(TaskKind::Summarise).rank, 9);
    }
}
