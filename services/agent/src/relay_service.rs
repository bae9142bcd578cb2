//! The node relay as a service: the leased writer between node agents and
//! the log. It folds the log like every service, takes agents' statuses
//! from NATS, appends what they prove (judged by [`Relay`]), and sends each
//! node its orders, re-derived from the folded log.
//!
//! Owns: the status inbox (the latest status per node; a heartbeat is never
//! logged), the orders outbox, and which nodes' orders changed.
//!
//! Must never: append while it does not hold the lease (the runtime's
//! fenced loop guarantees it), or send orders derived from an event that is
//! not committed (orders come from the folded log only).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use gpusched_core::State;
use gpusched_events::{Event, Producer};
use gpusched_model::{JobId, NodeId, Timestamp};
use gpusched_runtime::Decider;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::net::NodeNet;
use crate::protocol::{orders_subject, status_subject, NodeOrders, NodeStatus};
use crate::relay::{Relay, RelayConfig};

/// Lease and consumer name of the relay.
pub const RELAY_SERVICE: &str = "nodes";

/// The latest status of each node, waiting for the next cycle.
pub type Inbox = Arc<Mutex<BTreeMap<String, NodeStatus>>>;

/// Counters the relay keeps.
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Statuses received.
    pub statuses: AtomicU64,
    /// Statuses that were not valid JSON of the protocol.
    pub malformed: AtomicU64,
    /// Reports refused (stale registration, job not bound there, earlier run).
    pub refused: AtomicU64,
    /// Orders sent.
    pub orders: AtomicU64,
    /// The relay's decide loop, as every service's (health, metrics).
    pub service: Arc<gpusched_runtime::ServiceStats>,
}

/// Subscribes to every agent's status; fills `inbox` until `shutdown`.
pub async fn take_statuses(
    net: NodeNet,
    root: String,
    inbox: Inbox,
    stats: Arc<RelayStats>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut sub = net.subscribe(status_subject(&root)).await?;
    loop {
        let msg = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            m = sub.next() => match m { Some(m) => m, None => return Ok(()) },
        };
        stats.statuses.fetch_add(1, Ordering::Relaxed);
        match serde_json::from_slice::<NodeStatus>(&msg.payload) {
            Ok(s) => {
                if let Ok(mut q) = inbox.lock() {
                    q.insert(s.spec.name.clone(), s);
                }
            }
            Err(e) => {
                stats.malformed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "malformed node status ignored");
            }
        }
    }
}

/// Publishes the orders the decider hands over, until the channel closes.
pub async fn send_orders(
    net: NodeNet,
    root: String,
    mut rx: mpsc::UnboundedReceiver<(String, NodeOrders)>,
    stats: Arc<RelayStats>,
) {
    while let Some((node, orders)) = rx.recv().await {
        let Ok(body) = serde_json::to_vec(&orders) else {
            continue;
        };
        if let Err(e) = net.publish(orders_subject(&root, &node), body).await {
            tracing::warn!(node, error = %e, "orders not sent; the next status retries");
        } else {
            stats.orders.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The relay as the runtime's [`Decider`].
pub struct RelayDecider {
    relay: Relay,
    inbox: Inbox,
    orders: mpsc::UnboundedSender<(String, NodeOrders)>,
    stats: Arc<RelayStats>,
    dirty: BTreeSet<NodeId>,
    job_nodes: HashMap<JobId, Vec<NodeId>>,
}

impl RelayDecider {
    /// A relay leading from `now`.
    pub fn new(
        cfg: RelayConfig,
        now: Timestamp,
        inbox: Inbox,
        orders: mpsc::UnboundedSender<(String, NodeOrders)>,
        stats: Arc<RelayStats>,
    ) -> Self {
        RelayDecider {
            relay: Relay::new(cfg, now),
            inbox,
            orders,
            stats,
            dirty: BTreeSet::new(),
            job_nodes: HashMap::new(),
        }
    }

    fn job_moved(&mut self, state: &State, job: JobId) {
        let now: Vec<NodeId> = state
            .job(job)
            .map(|j| j.assignments.iter().map(|a| a.node).collect())
            .unwrap_or_default();
        let before = self.job_nodes.remove(&job).unwrap_or_default();
        self.dirty.extend(before.iter().chain(now.iter()).copied());
        if !now.is_empty() {
            self.job_nodes.insert(job, now);
        }
    }
}

impl Decider for RelayDecider {
    fn producer(&self) -> Producer {
        Producer::Agent
    }

    fn observe(&mut self, state: &State, event: &Event) {
        match event {
            Event::PreemptionPlanned { victims, .. } => {
                for v in victims {
                    self.job_moved(state, v.job);
                }
            }
            Event::NodeAdded { node, .. }
            | Event::NodeRejoined { node, .. }
            | Event::NodeLost { node, .. } => {
                self.dirty.insert(*node);
            }
            e => {
                if let Some(job) = e.job() {
                    if self.job_nodes.contains_key(&job)
                        || state.job(job).is_some_and(|j| !j.assignments.is_empty())
                    {
                        self.job_moved(state, job);
                    }
                }
            }
        }
    }

    /// Where every placed job runs, and every node's orders to send again.
    fn resume(&mut self, state: &State) {
        for j in state.jobs() {
            if !j.assignments.is_empty() {
                self.job_nodes
                    .insert(j.id, j.assignments.iter().map(|a| a.node).collect());
            }
        }
        self.dirty
            .extend((0..state.nodes().len()).map(|i| NodeId(i as u32)));
    }

    fn decide(&mut self, state: &State, now: Timestamp) -> Vec<Event> {
        let statuses: Vec<NodeStatus> = match self.inbox.lock() {
            Ok(mut q) => std::mem::take(&mut *q).into_values().collect(),
            Err(_) => Vec::new(),
        };
        let mut out = Vec::new();
        self.relay.begin_cycle();
        for s in &statuses {
            let (events, refusals) = self.relay.on_status(state, s, now);
            for r in &refusals {
                tracing::warn!(node = %s.spec.name, refusal = ?r, "node report refused");
            }
            self.stats
                .refused
                .fetch_add(refusals.len() as u64, Ordering::Relaxed);
            out.extend(events);
            if let Some(id) = state.node_id(&s.spec.name) {
                // Every status gets the node's orders back: a lost message
                // is repaired by the next heartbeat.
                self.dirty.insert(id);
            }
        }
        if out.is_empty() {
            out.extend(self.relay.job_facts(state, now));
        }
        out.extend(self.relay.timeouts(state, now));
        for node in std::mem::take(&mut self.dirty) {
            if let Some(orders) = self.relay.orders_for(state, node) {
                let name = state.nodes()[node.index()].spec.name.clone();
                let _ = self.orders.send((name, orders));
            }
        }
        out
    }

    fn next_due(&self) -> Option<Timestamp> {
        let waiting = self.inbox.lock().map(|q| !q.is_empty()).unwrap_or(false);
        waiting.then_some(Timestamp(0))
    }
}

/// How often the relay looks at its inbox when the log is quiet.
pub const RELAY_TICK: Duration = Duration::from_millis(50);

/// Runs the relay until `shutdown`: statuses in from `net`, orders out to
/// it, events through the fenced decide loop on `log` and `bus`.
#[allow(clippy::too_many_arguments)]
pub async fn serve_relay(
    log: gpusched_runtime::Log,
    bus: gpusched_runtime::Bus,
    net: NodeNet,
    root: String,
    cfg: RelayConfig,
    mut service: gpusched_runtime::ServiceConfig,
    shutdown: CancellationToken,
    stats: Arc<RelayStats>,
) -> anyhow::Result<()> {
    let inbox = Inbox::default();
    let (tx, rx) = mpsc::unbounded_channel();
    let statuses = tokio::spawn(take_statuses(
        net.clone(),
        root.clone(),
        inbox.clone(),
        stats.clone(),
        shutdown.clone(),
    ));
    let outbox = tokio::spawn(send_orders(net, root, rx, stats.clone()));
    service.tick = RELAY_TICK;
    let make = || {
        RelayDecider::new(
            cfg.clone(),
            gpusched_runtime::wall_clock(),
            inbox.clone(),
            tx.clone(),
            stats.clone(),
        )
    };
    let out = gpusched_runtime::run_service(
        log,
        bus,
        service,
        make,
        shutdown.clone(),
        stats.service.clone(),
    )
    .await;
    shutdown.cancel();
    drop(tx);
    let _ = statuses.await;
    let _ = outbox.await;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulated::tests::bound_and_running;

    fn relay() -> (RelayDecider, mpsc::UnboundedReceiver<(String, NodeOrders)>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let d = RelayDecider::new(
            RelayConfig::default(),
            Timestamp(0),
            Inbox::default(),
            tx,
            Arc::default(),
        );
        (d, rx)
    }

    #[test]
    fn resuming_from_a_state_knows_what_observing_its_log_would() {
        let (events, state, _) = bound_and_running();
        let (mut observed, _rx) = relay();
        let mut replay = State::new();
        for e in &events {
            if replay.apply(e).is_ok() {
                observed.observe(&replay, e);
            }
        }
        let (mut resumed, _rx) = relay();
        resumed.resume(&state);
        // The nodes whose orders go out next, and where each job runs.
        assert_eq!(observed.dirty.len(), 2);
        assert_eq!(observed.dirty, resumed.dirty);
        assert_eq!(observed.job_nodes.len(), 2, "both jobs placed");
        assert_eq!(observed.job_nodes, resumed.job_nodes);
    }
}
