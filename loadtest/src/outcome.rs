//! What a run planned and what it measured: the data `scenario` fills
//! and `report` reads.
//!
//! Owns: [`Plan`], [`Outcome`] and the outcomes of a reclaim and of each
//! restart. Must never: run, measure or format a report (each of those
//! has its module), or hold a figure not measured in the run.

use crate::drive::{Samples, Status, SubmitOutcome};
use crate::workload::{ClusterShape, Planned};
use crate::Scenario;

/// What the run will do.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Scenario.
    pub scenario: Scenario,
    /// Cluster.
    pub shape: ClusterShape,
    /// Jobs in submission order.
    pub jobs: Vec<Planned>,
    /// Submitted on their schedule (open loop) or as fast as taken.
    pub open_loop: bool,
    /// Agents' time scale.
    pub time_scale: f64,
    /// How the workload was made.
    pub description: String,
}

/// A service restart as measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RestartOutcome {
    /// Service.
    pub service: String,
    /// Jobs waiting when it was killed.
    pub pending: u64,
    /// Events in the log when it was killed.
    pub log_events: u64,
    /// SIGKILL → the new instance holds the lease, has rebuilt and is ready to decide, ms.
    pub kill_to_ready_ms: Option<f64>,
    /// Of which the fold after the takeover and the relay, ms (a hot
    /// standby folded most of the log while it waited for the lease).
    pub rebuild_ms: Option<u64>,
    /// Events folded after the takeover (the rest was folded standing by).
    pub folded_at_takeover: Option<u64>,
    /// SIGKILL → the new instance's first append, ms (none when it had nothing to decide).
    pub kill_to_first_append_ms: Option<f64>,
    /// Peak memory of the killed instance, MiB.
    pub killed_peak_rss_mib: Option<f64>,
    /// The snapshot the new instance started from: its sequence (0: none).
    pub snapshot_seq: Option<u64>,
    /// How old it was when loaded, ms.
    pub snapshot_age_ms: Option<u64>,
    /// Reading and checking it, ms.
    pub snapshot_load_ms: Option<u64>,
    /// Events folded after it until ready.
    pub folded_after_snapshot: Option<u64>,
    /// SIGKILL → the new instance's fold reached the log's end, ms.
    pub kill_to_caught_up_ms: Option<f64>,
    /// SIGKILL → the new instance took the lease, ms.
    pub kill_to_lease_ms: Option<f64>,
    /// Snapshots the killed instance had written, the size of its last,
    /// and the longest it held its loop to copy the state (µs).
    pub killed_snapshots: Option<(u64, u64, u64)>,
}

impl RestartOutcome {
    /// One line: the snapshot loaded and the time of each step.
    pub fn steps(&self) -> String {
        let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0} ms"));
        let n = |v: Option<u64>| v.map_or("-".into(), |v| v.to_string());
        let snapshot = match self.snapshot_seq {
            Some(seq) if seq > 0 => format!(
                "snapshot at {seq} ({} s old, loaded in {} ms), {} events folded after it",
                self.snapshot_age_ms.map_or(0, |a| a / 1000),
                n(self.snapshot_load_ms),
                n(self.folded_after_snapshot)
            ),
            _ => format!(
                "no snapshot, {} events folded",
                n(self.folded_after_snapshot)
            ),
        };
        format!(
            "{}: {snapshot}; after the kill: caught up {}, lease {}, ready {} (catch-up at takeover {} ms, {} events), first append {}",
            self.service,
            ms(self.kill_to_caught_up_ms),
            ms(self.kill_to_lease_ms),
            ms(self.kill_to_ready_ms),
            n(self.rebuild_ms),
            n(self.folded_at_takeover),
            ms(self.kill_to_first_append_ms)
        )
    }
}

/// The reclaim as measured.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ReclaimOutcome {
    /// When the owner began submitting, seconds since the origin.
    pub back_at_s: f64,
    /// Owner jobs.
    pub owner_jobs: usize,
}

/// Everything measured while the deployment ran.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The run's database and NATS namespace (both removed at the end).
    pub database: String,
    /// NATS root.
    pub namespace: String,
    /// Wall clock of the origin, Unix ms.
    pub origin_unix_ms: u64,
    /// Raw append ceiling, events/s: the median of `ceiling_probes`.
    pub ceiling: Option<f64>,
    /// Each probe's rate, events/s, in the order taken.
    pub ceiling_probes: Vec<f64>,
    /// Submissions.
    pub submit: SubmitOutcome,
    /// When submissions started and the run's end, seconds since the origin.
    pub submit_started_s: f64,
    /// End of the measured part, seconds since the origin.
    pub end_s: f64,
    /// Reclaim.
    pub reclaim: Option<ReclaimOutcome>,
    /// Restarts.
    pub restarts: Vec<RestartOutcome>,
    /// The snapshots stored at the end: (sequence, bytes, writer).
    pub snapshots: Vec<(u64, u64, String)>,
    /// The gateway's last status.
    pub status: Status,
    /// Samples.
    pub samples: Samples,
}
