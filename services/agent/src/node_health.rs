//! The node agent's health and metrics over HTTP, when asked for with
//! `gpusched-agent node --health-listen`.
//!
//! Owns: `GET /healthz` (alive: the agent's loop went round within
//! [`STUCK_AFTER`]), `GET /readyz` (ready: alive, connected to NATS, and
//! its status reached NATS within three heartbeats, which is what keeps
//! the node registered; the body says which of these fails), and
//! `GET /metrics` (the node's GPUs, its workers by state, the age of its
//! last status sent, and what it could not send or read).
//!
//! Must never: answer from anything but what the loop itself recorded in
//! [`NodeHealth`], or take a lock the loop takes: a probe only loads
//! relaxed atomics.

use std::borrow::Cow;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use gpusched_runtime::{
    counter, family, gauge, histogram_seconds, metrics_route, wall_clock, Values::Gauges,
    STUCK_AFTER,
};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::{Registry, Unit};
use tokio_util::sync::CancellationToken;

use crate::protocol::{NodeStatus, WorkerState};

/// What the node agent's loop records for its probes and metrics.
#[derive(Debug, Default)]
pub struct NodeHealth {
    /// When the loop last went round, Unix milliseconds.
    pub loop_unix_ms: AtomicU64,
    /// When a status was last handed to NATS, Unix milliseconds (0: never).
    pub status_sent_unix_ms: AtomicU64,
    /// Statuses NATS refused.
    pub status_failures: AtomicU64,
    /// Orders received that were not valid JSON of the protocol.
    pub orders_malformed: AtomicU64,
    /// Orders received for this registration.
    pub orders: AtomicU64,
    /// Whether the NATS connection is up, as of the last loop round.
    pub connected: AtomicBool,
    /// This registration's boot counter.
    pub boot: AtomicU64,
    /// GPUs the agent hands out.
    pub gpus: AtomicU64,
    /// GPUs held by running workers.
    pub gpus_busy: AtomicU64,
    /// Workers running, that could not start, and that exited (still in
    /// the status until the relay drops them).
    pub workers: [AtomicU64; 3],
    /// The heartbeat, milliseconds: readiness allows three without a send.
    pub heartbeat_ms: AtomicU64,
    /// Checkpoints the agent asked for (to stop a run) and saw complete:
    /// per bucket of [`CHECKPOINT_BUCKETS_S`] (the last: longer), and the
    /// sum of their durations in milliseconds.
    pub checkpoints: [AtomicU64; CHECKPOINT_BUCKETS_S.len() + 1],
    /// Sum of those checkpoints' durations, ms.
    pub checkpoint_ms: AtomicU64,
}

/// Upper bounds of the checkpoint duration buckets, seconds.
pub const CHECKPOINT_BUCKETS_S: [f64; 12] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// Heartbeats without a status sent after which the agent is not ready
/// (the relay's node timeout is far longer: 30 s against a 2 s heartbeat
/// by default).
pub const READY_HEARTBEATS: u32 = 3;

/// The worker states `NodeHealth::workers` counts, in its order.
const WORKER_STATES: [&str; 3] = ["running", "start_failed", "exited"];

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

impl NodeHealth {
    /// Marks the loop as alive now, with the connection's state.
    pub fn beat(&self, connected: bool) {
        self.loop_unix_ms.store(wall_clock().0, Ordering::Relaxed);
        self.connected.store(connected, Ordering::Relaxed);
    }

    /// Records the status the agent just sent (or failed to send).
    pub fn sent(&self, status: &NodeStatus, busy_gpus: usize, ok: bool) {
        if ok {
            self.status_sent_unix_ms
                .store(wall_clock().0, Ordering::Relaxed);
        } else {
            self.status_failures.fetch_add(1, Ordering::Relaxed);
        }
        self.boot.store(status.boot, Ordering::Relaxed);
        self.gpus_busy.store(busy_gpus as u64, Ordering::Relaxed);
        let mut counts = [0u64; 3];
        for w in &status.workers {
            counts[match w.state {
                WorkerState::Running { .. } => 0,
                WorkerState::StartFailed { .. } => 1,
                WorkerState::Exited { .. } => 2,
            }] += 1;
        }
        for (a, n) in self.workers.iter().zip(counts) {
            a.store(n, Ordering::Relaxed);
        }
    }

    /// Records a checkpoint the agent asked for, complete `took` later.
    pub fn checkpoint_done(&self, took: std::time::Duration) {
        let s = took.as_secs_f64();
        let i = CHECKPOINT_BUCKETS_S
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(CHECKPOINT_BUCKETS_S.len());
        self.checkpoints[i].fetch_add(1, Ordering::Relaxed);
        self.checkpoint_ms
            .fetch_add(took.as_millis() as u64, Ordering::Relaxed);
    }

    /// Checkpoints recorded by [`NodeHealth::checkpoint_done`].
    pub fn checkpoints_done(&self) -> u64 {
        self.checkpoints.iter().map(load).sum()
    }

    /// The reasons the agent is not ready; empty when it is.
    pub fn not_ready(&self) -> Vec<&'static str> {
        let now = wall_clock().0;
        let mut out = Vec::new();
        if !self.alive() {
            out.push("the agent's loop is stuck");
        }
        if !self.connected.load(Ordering::Relaxed) {
            out.push("NATS is unreachable");
        }
        let sent = load(&self.status_sent_unix_ms);
        let allowed = u64::from(READY_HEARTBEATS) * load(&self.heartbeat_ms).max(1);
        if sent == 0 {
            out.push("no status sent yet: not registered");
        } else if now.saturating_sub(sent) > allowed {
            out.push("no status sent for three heartbeats: the relay may think the node lost");
        }
        out
    }

    fn alive(&self) -> bool {
        let beat = load(&self.loop_unix_ms);
        beat > 0 && wall_clock().0.saturating_sub(beat) <= STUCK_AFTER.as_millis() as u64
    }

    fn status_age_s(&self) -> f64 {
        match load(&self.status_sent_unix_ms) {
            0 => 0.0,
            at => wall_clock().0.saturating_sub(at) as f64 / 1e3,
        }
    }
}

/// The answer of both probes.
#[derive(serde::Serialize)]
struct Probe {
    ready: bool,
    not_ready: Vec<&'static str>,
    node: String,
    boot: u64,
    connected: bool,
    status_age_s: f64,
    status_failures: u64,
    orders: u64,
    workers_running: u64,
}

#[derive(Clone)]
struct Probes {
    node: String,
    health: Arc<NodeHealth>,
}

impl Probes {
    fn probe(&self) -> Probe {
        let h = &self.health;
        let not_ready = h.not_ready();
        Probe {
            ready: not_ready.is_empty(),
            not_ready,
            node: self.node.clone(),
            boot: load(&h.boot),
            connected: h.connected.load(Ordering::Relaxed),
            status_age_s: h.status_age_s(),
            status_failures: load(&h.status_failures),
            orders: load(&h.orders),
            workers_running: load(&h.workers[0]),
        }
    }
}

fn code(ok: bool) -> StatusCode {
    if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn healthz(State(p): State<Probes>) -> (StatusCode, Json<Probe>) {
    (code(p.health.alive()), Json(p.probe()))
}

async fn readyz(State(p): State<Probes>) -> (StatusCode, Json<Probe>) {
    let probe = p.probe();
    (code(probe.ready), Json(probe))
}

#[derive(Debug)]
struct NodeCollector {
    health: Arc<NodeHealth>,
}

impl Collector for NodeCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let h = &self.health;
        let e = &mut enc;
        gauge(
            e,
            "node_gpus",
            "GPUs this agent hands out.",
            None,
            load(&h.gpus) as i64,
        )?;
        gauge(
            e,
            "node_gpus_busy",
            "GPUs held by running workers.",
            None,
            load(&h.gpus_busy) as i64,
        )?;
        family(
            e,
            Gauges,
            "node_workers",
            "Workers in the agent's status, by state.",
            None,
            WORKER_STATES
                .iter()
                .zip(&h.workers)
                .map(|(s, n)| (vec![("state", s.to_string())], load(n))),
        )?;
        gauge(
            e,
            "node_status_age",
            "Since the agent last sent its status (its heartbeat).",
            Some(&Unit::Seconds),
            h.status_age_s(),
        )?;
        gauge(
            e,
            "node_nats_connected",
            "1 while the NATS connection is up.",
            None,
            i64::from(h.connected.load(Ordering::Relaxed)),
        )?;
        gauge(
            e,
            "node_boot",
            "This registration's boot counter.",
            None,
            load(&h.boot) as i64,
        )?;
        counter(
            e,
            "node_status_failures",
            "Statuses NATS refused.",
            load(&h.status_failures),
        )?;
        counter(
            e,
            "node_orders",
            "Orders received for this registration.",
            load(&h.orders),
        )?;
        counter(
            e,
            "node_orders_malformed",
            "Orders that were not valid JSON of the protocol, ignored.",
            load(&h.orders_malformed),
        )?;
        let buckets: Vec<(f64, u64)> = CHECKPOINT_BUCKETS_S
            .iter()
            .zip(&h.checkpoints)
            .map(|(b, n)| (*b, load(n)))
            .collect();
        histogram_seconds(
            e,
            "node_checkpoint_duration",
            "From the checkpoint signal the agent sent to stop a run to the first of its workers' checkpoints complete.",
            load(&h.checkpoint_ms) as f64 / 1e3,
            h.checkpoints_done(),
            &buckets,
        )
    }
}

/// The routes, over `health`; every metric is labelled `node`.
pub fn node_router(node: &str, health: Arc<NodeHealth>) -> Router {
    let mut registry = Registry::with_prefix_and_labels(
        "gpusched",
        [(Cow::Borrowed("node"), Cow::Owned(node.to_string()))].into_iter(),
    );
    registry.register_collector(Box::new(NodeCollector {
        health: health.clone(),
    }));
    let registry = Arc::new(registry);
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(Probes {
            node: node.to_string(),
            health,
        })
        .route("/metrics", metrics_route(registry))
}

/// Serves [`node_router`] on `addr` until `shutdown`.
pub async fn serve_node_health(
    addr: SocketAddr,
    node: String,
    health: Arc<NodeHealth>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "health endpoint listening");
    axum::serve(listener, node_router(&node, health))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn health(heartbeat: Duration) -> Arc<NodeHealth> {
        let h = Arc::new(NodeHealth::default());
        h.heartbeat_ms
            .store(heartbeat.as_millis() as u64, Ordering::Relaxed);
        h
    }

    #[test]
    fn ready_only_when_registered_connected_and_sending() {
        let h = health(Duration::from_secs(2));
        assert!(!h.alive());
        assert!(h.not_ready().contains(&"the agent's loop is stuck"));
        h.beat(true);
        assert_eq!(h.not_ready(), vec!["no status sent yet: not registered"]);
        h.status_sent_unix_ms
            .store(wall_clock().0, Ordering::Relaxed);
        assert!(h.not_ready().is_empty());
        h.beat(false);
        assert_eq!(h.not_ready(), vec!["NATS is unreachable"]);
        h.beat(true);
        h.status_sent_unix_ms
            .store(wall_clock().0 - 6_001, Ordering::Relaxed);
        assert_eq!(
            h.not_ready(),
            vec!["no status sent for three heartbeats: the relay may think the node lost"]
        );
    }
}
