//! Which daemon a task goes to: the routing rule as pure functions over
//! what the dispatcher knows (the nodes as last seen, this machine's load,
//! the tier's offload, the node its last pre-prefill went to). No I/O and
//! no lock here, so the rule is tested on views built by hand.
//!
//! The rule, for a task of a tier:
//! - offload off: this machine;
//! - a user task follows the node its pre-prefill went to (its prompt is
//!   warm there) while that node still serves the tier; a background task
//!   does not;
//! - otherwise the node with the least work ahead ([`cost`]) among the
//!   healthy ones that serve the tier, are not excluded (already failed this
//!   task), and are the node the offload names, if it names one;
//! - a background task of a tier that keeps its model here (`keep_local`)
//!   stays here when here costs no more than that node;
//! - no such node: this machine (the tier has [`Placement::FallenBack`]).

use revis_trust::DeviceId;

use super::types::{NodeView, Offload, Placement, Route};
use crate::api::Tier;

/// The decode speed assumed for a daemon not yet measured.
pub(super) const UNMEASURED_TOKENS_PER_S: f64 = 50.0;

/// This machine's load, as the rule weighs it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct LocalLoad {
    /// Calls this dispatcher has running here.
    pub in_flight: usize,
    /// Measured decode speed (moving average), 0 until measured.
    pub tokens_per_s: f64,
}

/// A task to route.
#[derive(Clone, Copy, Debug)]
pub(super) struct Task<'a> {
    pub tier: Tier,
    pub background: bool,
    /// Targets this task already failed on.
    pub exclude: &'a [Route],
}

/// Seconds of work ahead on a daemon, roughly: what it holds and what we
/// sent it, plus this task, over its measured speed (a guess of
/// [`UNMEASURED_TOKENS_PER_S`] until measured).
pub(super) fn cost(in_flight: usize, queue_depth: u32, tokens_per_s: f64) -> f64 {
    let speed = if tokens_per_s > 0.0 { tokens_per_s } else { UNMEASURED_TOKENS_PER_S };
    (in_flight as f64 + f64::from(queue_depth) + 1.0) / speed
}

fn node_cost(node: &NodeView) -> f64 {
    cost(node.in_flight, node.queue_depth, node.tokens_per_s)
}

/// `node` may take a task of `tier`: healthy (breaker closed), serving the
/// tier, and the node the offload names (by name or device ID), if any.
pub(super) fn serves(node: &NodeView, tier: Tier, offload: &Offload) -> bool {
    node.healthy
        && node.tiers.contains(&tier)
        && offload.node.as_deref().is_none_or(|want| node.name == want || node.device_id.to_string() == want)
}

/// The node that serves `tier` with the least work ahead, never one of
/// `excluded` (the first of equals).
pub(super) fn best_node<'a>(nodes: &'a [NodeView], tier: Tier, offload: &Offload, excluded: &[DeviceId]) -> Option<&'a NodeView> {
    nodes
        .iter()
        .filter(|n| serves(n, tier, offload) && !excluded.contains(&n.device_id))
        .min_by(|a, b| node_cost(a).total_cmp(&node_cost(b)))
}

/// Where `task` runs (see the module's rule). `sticky`: where the tier's
/// last user pre-prefill went.
pub(super) fn choose(nodes: &[NodeView], here: LocalLoad, offload: &Offload, sticky: Option<&Route>, task: Task<'_>) -> Route {
    if !offload.enabled {
        return Route::Local;
    }
    let excluded: Vec<DeviceId> = task.exclude.iter().filter_map(|t| if let Route::Node(d) = t { Some(*d) } else { None }).collect();
    if !task.background
        && let Some(Route::Node(id)) = sticky
        && !excluded.contains(id)
        && nodes.iter().any(|n| n.device_id == *id && serves(n, task.tier, offload))
    {
        return Route::Node(*id);
    }
    match best_node(nodes, task.tier, offload, &excluded) {
        None => Route::Local,
        Some(node) => {
            if task.background
                && offload.keep_local
                && !task.exclude.contains(&Route::Local)
                && cost(here.in_flight, 0, here.tokens_per_s) <= node_cost(node)
            {
                return Route::Local;
            }
            Route::Node(node.device_id)
        }
    }
}

/// Where a tier runs now: here with offload off, else on the node a task
/// would go to, else here for now ([`Placement::FallenBack`]).
pub(super) fn placement(nodes: &[NodeView], tier: Tier, offload: &Offload) -> Placement {
    if !offload.enabled {
        return Placement::Local;
    }
    match best_node(nodes, tier, offload, &[]) {
        Some(node) => Placement::Node(node.name.clone()),
        None => Placement::FallenBack,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A healthy, idle node serving every tier, not yet measured.
    pub(in crate::dispatch) fn node(name: &str, id: u8) -> NodeView {
        NodeView {
            name: name.into(),
            device_id: DeviceId::from_bytes([id; 32]),
            addr: None,
            healthy: true,
            last_error: None,
            queue_depth: 0,
            in_flight: 0,
            tokens_per_s: 0.0,
            latency_ms: 0.0,
            tiers: Tier::ALL.to_vec(),
            completed: 0,
        }
    }

    fn on() -> Offload {
        Offload { enabled: true, node: None, keep_local: false }
    }

    fn user() -> Task<'static> {
        Task { tier: Tier::Tier2, background: false, exclude: &[] }
    }

    fn background() -> Task<'static> {
        Task { background: true, ..user() }
    }

    fn to(node: &NodeView) -> Route {
        Route::Node(node.device_id)
    }

    /// Where a user task of tier2 goes, nothing sticky, this machine idle.
    fn pick(nodes: &[NodeView], offload: &Offload) -> Route {
        choose(nodes, LocalLoad::default(), offload, None, user())
    }

    #[test]
    fn a_tier_with_offload_off_runs_here_whatever_the_nodes() {
        let desk = node("desk", 1);
        let off = Offload { enabled: false, node: Some("desk".into()), keep_local: false };
        assert_eq!(pick(std::slice::from_ref(&desk), &off), Route::Local);
        let sticky = to(&desk);
        assert_eq!(choose(std::slice::from_ref(&desk), LocalLoad::default(), &off, Some(&sticky), user()), Route::Local);
        assert_eq!(placement(&[desk], Tier::Tier2, &off), Placement::Local);
    }

    #[test]
    fn the_node_with_the_least_work_ahead_wins() {
        // The winner is always listed last, so a tie (a rule left out) picks the other.
        let queued = NodeView { queue_depth: 3, ..node("queued", 1) };
        let idle = node("idle", 2);
        assert_eq!(pick(&[queued, idle.clone()], &on()), to(&idle), "queue depth");

        let busy = NodeView { in_flight: 2, ..node("busy", 1) };
        assert_eq!(pick(&[busy, idle.clone()], &on()), to(&idle), "calls in flight");

        let slow = NodeView { tokens_per_s: 20.0, ..node("slow", 1) };
        let fast = NodeView { tokens_per_s: 100.0, ..node("fast", 2) };
        assert_eq!(pick(&[slow.clone(), fast.clone()], &on()), to(&fast), "measured speed");

        // Unmeasured: guessed at UNMEASURED_TOKENS_PER_S, faster than 20, slower than 100.
        let new = node("new", 3);
        assert_eq!(pick(&[slow.clone(), new.clone()], &on()), to(&new), "an unmeasured node beats a slow one");
        assert_eq!(pick(&[new.clone(), fast.clone()], &on()), to(&fast), "and loses to a fast one");

        // Work and speed weigh together: two queued on a fast node beat one on a slow one.
        let fast_queued = NodeView { queue_depth: 2, ..fast.clone() };
        let slow_queued = NodeView { queue_depth: 1, ..slow };
        assert_eq!(pick(&[slow_queued, fast_queued.clone()], &on()), to(&fast_queued));
        assert_eq!(placement(&[new, fast], Tier::Tier2, &on()), Placement::Node("fast".into()));
    }

    #[test]
    fn unhealthy_nodes_nodes_without_the_tier_and_excluded_nodes_are_never_chosen() {
        // Each bad node is the cheapest; the good one is loaded, and listed last.
        let good = NodeView { queue_depth: 5, ..node("good", 9) };
        let fast = |name: &str, id: u8| NodeView { tokens_per_s: 1000.0, ..node(name, id) };
        let unhealthy = NodeView { healthy: false, ..fast("unhealthy", 1) };
        let other_tiers = NodeView { tiers: vec![Tier::Tier1, Tier::Tier3], ..fast("other-tiers", 2) };
        let failed = fast("failed", 3);
        let exclude = [to(&failed)];
        let task = Task { exclude: &exclude, ..user() };

        for bad in [&unhealthy, &other_tiers] {
            assert_eq!(pick(&[bad.clone(), good.clone()], &on()), to(&good), "{}", bad.name);
            assert_eq!(pick(std::slice::from_ref(bad), &on()), Route::Local, "{}", bad.name);
        }
        assert_eq!(choose(&[failed.clone(), good.clone()], LocalLoad::default(), &on(), None, task), to(&good));
        assert_eq!(choose(std::slice::from_ref(&failed), LocalLoad::default(), &on(), None, task), Route::Local);
        // Excluded for this task only: the next task may go there.
        assert_eq!(pick(&[failed.clone(), good], &on()), to(&failed));
    }

    #[test]
    fn an_offload_that_names_a_node_goes_only_to_it_by_name_or_device_id() {
        let desk = NodeView { queue_depth: 4, ..node("desk", 1) };
        let attic = node("attic", 2);
        let nodes = [desk.clone(), attic];
        let named = |what: String| Offload { node: Some(what), ..on() };
        assert_eq!(pick(&nodes, &named("desk".into())), to(&desk), "by name, though it has more work");
        assert_eq!(pick(&nodes, &named(desk.device_id.to_string())), to(&desk), "by device ID");
        assert_eq!(pick(&nodes, &named("cellar".into())), Route::Local, "a node not paired: here");
        assert_eq!(placement(&nodes, Tier::Tier2, &named("cellar".into())), Placement::FallenBack);
        let unhealthy = [NodeView { healthy: false, ..desk }, nodes[1].clone()];
        assert_eq!(pick(&unhealthy, &named("desk".into())), Route::Local, "the named node down: here, not another");
    }

    #[test]
    fn a_user_task_follows_its_pre_prefill_while_that_node_serves_the_tier_and_background_tasks_do_not() {
        let warm = NodeView { queue_depth: 4, ..node("warm", 1) };
        let idle = node("idle", 2);
        let sticky = to(&warm);
        let here = LocalLoad::default();
        let nodes = [warm.clone(), idle.clone()];
        assert_eq!(choose(&nodes, here, &on(), Some(&sticky), user()), to(&warm), "follows its pre-prefill");
        assert_eq!(choose(&nodes, here, &on(), Some(&sticky), background()), to(&idle), "background: least work");
        assert_eq!(choose(&nodes, here, &on(), Some(&Route::Local), user()), to(&idle), "a pre-prefill here binds nothing");

        let exclude = [sticky.clone()];
        let retry = Task { exclude: &exclude, ..user() };
        assert_eq!(choose(&nodes, here, &on(), Some(&sticky), retry), to(&idle), "failed there: elsewhere");
        let down = [NodeView { healthy: false, ..warm.clone() }, idle.clone()];
        assert_eq!(choose(&down, here, &on(), Some(&sticky), user()), to(&idle), "unhealthy");
        let moved = [NodeView { tiers: vec![Tier::Tier1], ..warm.clone() }, idle.clone()];
        assert_eq!(choose(&moved, here, &on(), Some(&sticky), user()), to(&idle), "no longer serves the tier");
        let other = Offload { node: Some("idle".into()), ..on() };
        assert_eq!(choose(&nodes, here, &other, Some(&sticky), user()), to(&idle), "offload now names another node");
    }

    #[test]
    fn keep_local_background_work_stays_here_when_here_costs_no_more() {
        let keep = Offload { keep_local: true, ..on() };
        let desk = NodeView { tokens_per_s: UNMEASURED_TOKENS_PER_S, ..node("desk", 1) };
        let nodes = std::slice::from_ref(&desk);
        let idle = LocalLoad::default();
        assert_eq!(choose(nodes, idle, &keep, None, background()), Route::Local, "equal cost: here");
        let faster_here = LocalLoad { in_flight: 1, tokens_per_s: 200.0 };
        assert_eq!(choose(nodes, faster_here, &keep, None, background()), Route::Local, "cheaper here: here");
        let busy = LocalLoad { in_flight: 1, tokens_per_s: 0.0 };
        assert_eq!(choose(nodes, busy, &keep, None, background()), to(&desk), "dearer here: the node");

        assert_eq!(choose(nodes, idle, &on(), None, background()), to(&desk), "without keep_local: the node");
        assert_eq!(choose(nodes, idle, &keep, None, user()), to(&desk), "a user task: the node");
        let exclude = [Route::Local];
        let failed_here = Task { exclude: &exclude, ..background() };
        assert_eq!(choose(nodes, idle, &keep, None, failed_here), to(&desk), "failed here: the node");
    }

    #[test]
    fn with_no_healthy_node_a_task_runs_here_and_the_tier_has_fallen_back() {
        let down = [NodeView { healthy: false, ..node("desk", 1) }, NodeView { healthy: false, ..node("attic", 2) }];
        assert_eq!(pick(&down, &on()), Route::Local);
        assert_eq!(choose(&down, LocalLoad::default(), &on(), None, background()), Route::Local);
        assert_eq!(placement(&down, Tier::Tier2, &on()), Placement::FallenBack);
        assert_eq!(placement(&[], Tier::Tier2, &on()), Placement::FallenBack, "no node paired");
        let up = [down[0].clone(), NodeView { healthy: true, ..down[1].clone() }];
        assert_eq!(placement(&up, Tier::Tier2, &on()), Placement::Node("attic".into()));
    }
}
