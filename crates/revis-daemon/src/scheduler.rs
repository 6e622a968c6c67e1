//! Admission and order: a bounded priority queue in front of the engine.
//! The worker hands the engine as many jobs as a model decodes together
//! (`daemon.streams`), the most urgent first: user jobs before background
//! ones, first come first served within a priority.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};

use revis_engine::{Class, Job};
use tokio::sync::Notify;

use crate::registry::{Lease, Registry};

pub use revis_proto::Priority;

/// The queue was full.
#[derive(Debug, PartialEq, Eq)]
pub struct QueueFull {
    pub capacity: usize,
}

struct Entry<T> {
    priority: Priority,
    seq: u64,
    item: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, o: &Self) -> bool {
        self.priority == o.priority && self.seq == o.seq
    }
}
impl<T> Eq for Entry<T> {}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<T> Ord for Entry<T> {
    fn cmp(&self, o: &Self) -> Ordering {
        // Higher priority first, then the older entry (smaller seq).
        self.priority.cmp(&o.priority).then_with(|| o.seq.cmp(&self.seq))
    }
}

/// A bounded priority queue with an async `pop`.
pub struct Queue<T> {
    heap: Mutex<(BinaryHeap<Entry<T>>, u64)>,
    notify: Notify,
    capacity: usize,
    /// Jobs the engine has now.
    running: AtomicUsize,
    /// Items nobody waits for any more; they give up their place when the queue is full.
    abandoned: fn(&T) -> bool,
}

impl<T> Queue<T> {
    pub fn new(capacity: usize, abandoned: fn(&T) -> bool) -> Self {
        Queue { heap: Mutex::new((BinaryHeap::new(), 0)), notify: Notify::new(), capacity, running: AtomicUsize::new(0), abandoned }
    }

    /// Adds an item, or says the queue is full.
    pub fn push(&self, priority: Priority, item: T) -> Result<(), QueueFull> {
        let mut g = self.heap.lock().unwrap_or_else(|p| p.into_inner());
        if g.0.len() >= self.capacity {
            let abandoned = self.abandoned;
            g.0.retain(|e| !abandoned(&e.item));
        }
        if g.0.len() >= self.capacity {
            return Err(QueueFull { capacity: self.capacity });
        }
        g.1 += 1;
        let seq = g.1;
        g.0.push(Entry { priority, seq, item });
        drop(g);
        self.notify.notify_one();
        Ok(())
    }

    /// Waits for the most urgent item.
    pub async fn pop(&self) -> (Priority, T) {
        loop {
            let notified = self.notify.notified();
            if let Some(e) = self.heap.lock().unwrap_or_else(|p| p.into_inner()).0.pop() {
                return (e.priority, e.item);
            }
            notified.await;
        }
    }

    /// Items waiting whose callers still wait.
    pub fn len(&self) -> usize {
        let abandoned = self.abandoned;
        self.heap.lock().unwrap_or_else(|p| p.into_inner()).0.iter().filter(|e| !abandoned(&e.item)).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The worker handed a job to the engine.
    pub fn started(&self) {
        self.running.fetch_add(1, AtomicOrdering::SeqCst);
    }

    /// The engine is done with a job.
    pub fn ended(&self) {
        self.running.fetch_sub(1, AtomicOrdering::SeqCst);
    }

    /// Whether the engine has a job now.
    pub fn busy(&self) -> bool {
        self.running.load(AtomicOrdering::SeqCst) > 0
    }
}

/// A job waiting for the engine, with the lease that keeps its model loaded.
pub struct Task {
    pub key: String,
    pub job: Job,
    pub cancel: Arc<AtomicBool>,
    pub lease: Lease,
}

/// Hands queued jobs to the engine, most urgent first, at most `streams`
/// at a time: the engine decodes that many generations of a model together
/// and runs other jobs between their steps. The rest wait in the queue, in
/// order, so a user job that comes later still goes first.
pub async fn run_queue(queue: Arc<Queue<Task>>, registry: Arc<Registry>, streams: usize) {
    let places = Arc::new(tokio::sync::Semaphore::new(streams.max(1)));
    loop {
        let Ok(place) = places.clone().acquire_owned().await else { return };
        let (priority, task) = queue.pop().await;
        if task.job.abandoned() {
            continue;
        }
        let class = match priority {
            Priority::User => Class::User,
            Priority::Background => Class::Background,
        };
        queue.started();
        // The lease goes with the job and is dropped on the engine thread as
        // soon as the job ends, so an unload right after frees the weights.
        let finished = registry.engine().run(&task.key, task.job, class, task.cancel, Box::new(task.lease));
        let queue = queue.clone();
        tokio::spawn(async move {
            let _ = finished.await;
            queue.ended();
            drop(place);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn user_jobs_jump_ahead_of_background_ones() {
        let q = Queue::new(8, |_: &&str| false);
        q.push(Priority::Background, "b1").unwrap();
        q.push(Priority::Background, "b2").unwrap();
        q.push(Priority::User, "u1").unwrap();
        q.push(Priority::User, "u2").unwrap();
        let mut order = Vec::new();
        for _ in 0..4 {
            order.push(q.pop().await.1);
        }
        assert_eq!(order, ["u1", "u2", "b1", "b2"]);
    }

    #[tokio::test]
    async fn full_queue_refuses() {
        // Odd numbers stand for requests whose caller went away.
        let q = Queue::new(2, |n: &i32| n % 2 == 1);
        q.push(Priority::User, 2).unwrap();
        q.push(Priority::User, 4).unwrap();
        assert_eq!(q.push(Priority::User, 6), Err(QueueFull { capacity: 2 }));
        q.pop().await;
        q.push(Priority::User, 1).unwrap();
        assert_eq!(q.len(), 1, "an abandoned item is not counted as waiting");
        q.push(Priority::User, 8).unwrap(); // the abandoned 1 gives up its place
        assert_eq!(q.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn pop_waits_for_a_push() {
        let q = std::sync::Arc::new(Queue::new(2, |_: &i32| false));
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.pop().await.1 }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        q.push(Priority::Background, 7).unwrap();
        assert_eq!(waiter.await.unwrap(), 7);
    }
}
