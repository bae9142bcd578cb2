//! Service statistics: the counters a service keeps ([`ServiceStats`]), a
//! cycle-time histogram, and a snapshot of them written as JSON to the file named by
//! `GPUSCHED_STATS_FILE`, for load tests and operators.
//!
//! Owns: the histogram's bucket layout, the snapshot's JSON shape and the
//! writer task (replace-by-rename, so a reader never sees half a file).
//!
//! Must never: block or slow the decide loop (counters are relaxed
//! atomics; the writer runs on its own timer), or decide anything.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::clock::wall_clock;

/// What one decision cycle looked at: the quantities its limits bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// Queue heads examined (quota and placement).
    pub heads: u64,
    /// Topology domains probed for room (placement).
    pub domains_probed: u64,
    /// Victim sets costed (preemption).
    pub victim_sets: u64,
    /// Victim candidates looked at (preemption).
    pub victim_candidates: u64,
}

/// Environment variable naming the file a service writes its stats to.
pub const STATS_FILE_ENV: &str = "GPUSCHED_STATS_FILE";

/// Buckets of [`CycleHistogram`]: four per power of two of microseconds,
/// from 1 µs to about 14 s (the last bucket takes everything longer).
pub const CYCLE_BUCKETS: usize = 96;

/// Cycle durations in log-spaced buckets (four per doubling, so a
/// quantile read from it is within 19% of the true value).
#[derive(Debug)]
pub struct CycleHistogram {
    counts: [AtomicU64; CYCLE_BUCKETS],
}

impl Default for CycleHistogram {
    fn default() -> Self {
        CycleHistogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// The bucket a duration of `us` microseconds falls in.
pub fn cycle_bucket(us: u64) -> usize {
    let us = us.max(1) as f64;
    ((us.log2() * 4.0).floor() as usize).min(CYCLE_BUCKETS - 1)
}

/// The upper bound of bucket `i`, microseconds.
pub fn cycle_bucket_upper_us(i: usize) -> f64 {
    2f64.powf((i as f64 + 1.0) / 4.0)
}

impl CycleHistogram {
    /// Counts one cycle of `us` microseconds.
    pub fn record(&self, us: u64) {
        self.counts[cycle_bucket(us)].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts per bucket now.
    pub fn counts(&self) -> Vec<u64> {
        self.counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }
}

/// The `q` quantile (0..=1) of a histogram given as bucket counts, as the
/// upper bound of its bucket in microseconds; `None` when empty.
pub fn histogram_quantile_us(counts: &[u64], q: f64) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
    let mut seen = 0u64;
    for (i, c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return Some(cycle_bucket_upper_us(i));
        }
    }
    Some(cycle_bucket_upper_us(counts.len().saturating_sub(1)))
}

/// Counters a service keeps, readable while it runs.
#[derive(Debug, Default)]
pub struct ServiceStats {
    /// Times the decider ran.
    pub cycles: AtomicU64,
    /// Events this service appended.
    pub appended: AtomicU64,
    /// Appends (batches) this service made.
    pub batches: AtomicU64,
    /// Events folded into the projection.
    pub folded: AtomicU64,
    /// Sequence of the projection.
    pub seq: AtomicU64,
    /// Events `apply` refused (superseded).
    pub superseded: AtomicU64,
    /// Malformed messages seen on the bus.
    pub malformed: AtomicU64,
    /// Times the log was read to close a gap or catch a tail.
    pub gap_reads: AtomicU64,
    /// Batches republished by the outbox relay.
    pub relayed: AtomicU64,
    /// Times this instance took the lease.
    pub takeovers: AtomicU64,
    /// Cycle durations (decide + append), microseconds, summed.
    pub cycle_us: AtomicU64,
    /// Cycle durations (decide + append + fold) of cycles that appended.
    pub cycle_hist: CycleHistogram,
    /// Time spent deciding, microseconds, summed.
    pub decide_us: AtomicU64,
    /// Time spent in appends to the log, microseconds, summed.
    pub append_us: AtomicU64,
    /// Time spent folding what the bus delivered, microseconds, summed.
    pub fold_us: AtomicU64,
    /// Time spent waiting on the bus, microseconds, summed.
    pub receive_us: AtomicU64,
    /// When this instance last became ready to decide (lease, rebuild and
    /// relay done), Unix milliseconds.
    pub ready_unix_ms: AtomicU64,
    /// How long the last rebuild took, milliseconds.
    pub rebuild_ms: AtomicU64,
    /// Events folded after the last takeover before deciding: the whole
    /// log after a cold start, only what a hot standby had not folded yet
    /// after a warm one.
    pub takeover_folded: AtomicU64,
    /// When the service's loop last went round (leading or standing by),
    /// Unix milliseconds: a loop stuck anywhere stops moving it.
    pub loop_unix_ms: AtomicU64,
    /// The lease epoch this instance leads at; 0 while standing by.
    pub leading_epoch: AtomicU64,
    /// Reads from the bus that failed (the log was read instead).
    pub bus_errors: AtomicU64,
    /// 1 while the bus is failing and the service decides from the log.
    pub bus_down: AtomicU64,
    /// Messages waiting for this service's consumer after its last receive.
    pub bus_backlog: AtomicU64,
    /// What decide looked at, summed over cycles, and the most in one
    /// cycle: heads, domains probed, victim sets, victim candidates.
    pub work: [AtomicU64; 4],
    /// The most of each of `work` in one cycle.
    pub work_max: [AtomicU64; 4],
    /// 1 while the event log is unreachable: the last call to it failed
    /// (a lead that ended on a log error, a standby that could not read
    /// it), until a call succeeds again.
    pub log_down: AtomicU64,
    /// When this instance last took the lease, Unix milliseconds.
    pub lease_unix_ms: AtomicU64,
    /// The snapshot the last start loaded: its sequence (0: none, the whole log was folded).
    pub snapshot_seq: AtomicU64,
    /// How old that snapshot was when loaded, milliseconds.
    pub snapshot_age_ms: AtomicU64,
    /// How long reading and checking it took, milliseconds.
    pub snapshot_load_ms: AtomicU64,
    /// How long the last start folded the log after the snapshot (or from the first event), milliseconds.
    pub fold_ms: AtomicU64,
    /// When the current lead first appended, Unix milliseconds (0: not yet).
    pub first_append_unix_ms: AtomicU64,
    /// Snapshots this instance wrote.
    pub snapshots_written: AtomicU64,
    /// The sequence of the last snapshot this instance wrote.
    pub snapshot_written_seq: AtomicU64,
    /// The size of the last snapshot this instance wrote.
    pub snapshot_bytes: AtomicU64,
    /// The longest the loop was held to encode a snapshot, microseconds.
    pub snapshot_hold_us_max: AtomicU64,
    /// When this instance's fold first reached the log's end (standing by or starting to lead), Unix milliseconds.
    pub caught_up_unix_ms: AtomicU64,
}

impl ServiceStats {
    /// Adds one cycle's work (`Decider::work`).
    pub fn record_work(&self, w: Work) {
        let values = [
            w.heads,
            w.domains_probed,
            w.victim_sets,
            w.victim_candidates,
        ];
        for ((sum, max), v) in self.work.iter().zip(&self.work_max).zip(values) {
            sum.fetch_add(v, Ordering::Relaxed);
            max.fetch_max(v, Ordering::Relaxed);
        }
    }

    /// Notes that the fold reached the log's end, the first time only.
    pub fn caught_up(&self) {
        let _ = self.caught_up_unix_ms.compare_exchange(
            0,
            wall_clock().0,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Marks the loop as alive now.
    pub fn beat(&self) {
        self.loop_unix_ms.store(wall_clock().0, Ordering::Relaxed);
    }
}

/// What a service writes to its stats file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsSnapshot {
    /// Service name.
    pub service: String,
    /// Process id.
    pub pid: u32,
    /// When written, Unix milliseconds.
    pub written_unix_ms: u64,
    /// See [`ServiceStats`].
    pub cycles: u64,
    /// Events appended.
    pub appended: u64,
    /// Appends made.
    pub batches: u64,
    /// Events folded.
    pub folded: u64,
    /// Projection sequence.
    pub seq: u64,
    /// Events refused by `apply`.
    pub superseded: u64,
    /// Log reads for gaps and tails.
    pub gap_reads: u64,
    /// Batches republished by the relay.
    pub relayed: u64,
    /// Lease takeovers.
    pub takeovers: u64,
    /// When this instance last became ready to decide (lease taken,
    /// projection rebuilt, relay done), Unix milliseconds; 0 before.
    pub ready_unix_ms: u64,
    /// How long the last rebuild took, milliseconds.
    pub rebuild_ms: u64,
    /// Durations of cycles that appended (decide + append + fold), as
    /// counts per [`CYCLE_BUCKETS`] bucket.
    pub cycle_hist: Vec<u64>,
    /// When the loop last went round, Unix milliseconds.
    #[serde(default)]
    pub loop_unix_ms: u64,
    /// Epoch led at; 0 while standing by.
    #[serde(default)]
    pub leading_epoch: u64,
    /// Failed reads from the bus.
    #[serde(default)]
    pub bus_errors: u64,
    /// Whether the bus is failing (deciding from the log).
    #[serde(default)]
    pub bus_down: bool,
    /// Events folded after the last takeover (see [`ServiceStats`]).
    #[serde(default)]
    pub takeover_folded: u64,
    /// Whether the event log is unreachable (see [`ServiceStats`]).
    #[serde(default)]
    pub log_down: bool,
    /// When this instance last took the lease, Unix milliseconds.
    #[serde(default)]
    pub lease_unix_ms: u64,
    /// The snapshot the last start loaded: its sequence (0: none, the whole log was folded).
    #[serde(default)]
    pub snapshot_seq: u64,
    /// How old that snapshot was when loaded, milliseconds.
    #[serde(default)]
    pub snapshot_age_ms: u64,
    /// How long reading and checking it took, milliseconds.
    #[serde(default)]
    pub snapshot_load_ms: u64,
    /// How long the last start folded the log after the snapshot (or from the first event), milliseconds.
    #[serde(default)]
    pub fold_ms: u64,
    /// When the current lead first appended, Unix milliseconds (0: not yet).
    #[serde(default)]
    pub first_append_unix_ms: u64,
    /// Snapshots this instance wrote.
    #[serde(default)]
    pub snapshots_written: u64,
    /// The sequence of the last snapshot this instance wrote.
    #[serde(default)]
    pub snapshot_written_seq: u64,
    /// The size of the last snapshot this instance wrote.
    #[serde(default)]
    pub snapshot_bytes: u64,
    /// The longest the loop was held to encode a snapshot, microseconds.
    #[serde(default)]
    pub snapshot_hold_us_max: u64,
    /// When this instance's fold first reached the log's end (standing by or starting to lead), Unix milliseconds.
    #[serde(default)]
    pub caught_up_unix_ms: u64,
    /// Time spent deciding, microseconds, summed.
    #[serde(default)]
    pub decide_us: u64,
    /// Time spent in appends to the log, microseconds, summed.
    #[serde(default)]
    pub append_us: u64,
    /// Time spent folding what the bus delivered, microseconds, summed.
    #[serde(default)]
    pub fold_us: u64,
    /// Time spent waiting on the bus, microseconds, summed.
    #[serde(default)]
    pub receive_us: u64,
}

impl StatsSnapshot {
    /// A snapshot of `stats` now.
    pub fn of(service: &str, stats: &ServiceStats) -> Self {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            service: service.to_string(),
            pid: std::process::id(),
            written_unix_ms: wall_clock().0,
            cycles: l(&stats.cycles),
            appended: l(&stats.appended),
            batches: l(&stats.batches),
            folded: l(&stats.folded),
            seq: l(&stats.seq),
            superseded: l(&stats.superseded),
            gap_reads: l(&stats.gap_reads),
            relayed: l(&stats.relayed),
            takeovers: l(&stats.takeovers),
            ready_unix_ms: l(&stats.ready_unix_ms),
            rebuild_ms: l(&stats.rebuild_ms),
            cycle_hist: stats.cycle_hist.counts(),
            loop_unix_ms: l(&stats.loop_unix_ms),
            leading_epoch: l(&stats.leading_epoch),
            bus_errors: l(&stats.bus_errors),
            bus_down: l(&stats.bus_down) == 1,
            takeover_folded: l(&stats.takeover_folded),
            log_down: l(&stats.log_down) == 1,
            lease_unix_ms: l(&stats.lease_unix_ms),
            snapshot_seq: l(&stats.snapshot_seq),
            snapshot_age_ms: l(&stats.snapshot_age_ms),
            snapshot_load_ms: l(&stats.snapshot_load_ms),
            fold_ms: l(&stats.fold_ms),
            first_append_unix_ms: l(&stats.first_append_unix_ms),
            snapshots_written: l(&stats.snapshots_written),
            snapshot_written_seq: l(&stats.snapshot_written_seq),
            snapshot_bytes: l(&stats.snapshot_bytes),
            snapshot_hold_us_max: l(&stats.snapshot_hold_us_max),
            caught_up_unix_ms: l(&stats.caught_up_unix_ms),
            decide_us: l(&stats.decide_us),
            append_us: l(&stats.append_us),
            fold_us: l(&stats.fold_us),
            receive_us: l(&stats.receive_us),
        }
    }
}

fn write_snapshot(path: &Path, snap: &StatsSnapshot) -> std::io::Result<()> {
    let json = serde_json::to_vec(snap).map_err(std::io::Error::other)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, json)?;
    std::fs::rename(&tmp, path)
}

/// Writes `stats` to `path` every `every` until `shutdown`, and once more
/// at the end. Write errors are logged once and otherwise ignored.
pub fn spawn_stats_writer(
    path: PathBuf,
    service: String,
    stats: Arc<ServiceStats>,
    every: Duration,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut warned = false;
        loop {
            let stop = tokio::select! {
                _ = shutdown.cancelled() => true,
                _ = tokio::time::sleep(every) => false,
            };
            if let Err(e) = write_snapshot(&path, &StatsSnapshot::of(&service, &stats)) {
                if !warned {
                    tracing::warn!(path = %path.display(), error = %e, "cannot write stats");
                    warned = true;
                }
            }
            if stop {
                return;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_come_from_bucket_bounds() {
        let h = CycleHistogram::default();
        for us in [10u64, 10, 10, 10, 10, 10, 10, 10, 10, 5_000] {
            h.record(us);
        }
        let counts = h.counts();
        let p50 = histogram_quantile_us(&counts, 0.5).unwrap_or(0.0);
        assert!((10.0..=12.0).contains(&p50), "p50 {p50}");
        let p99 = histogram_quantile_us(&counts, 0.99).unwrap_or(0.0);
        assert!((5_000.0..=6_000.0).contains(&p99), "p99 {p99}");
        assert_eq!(histogram_quantile_us(&[0; 4], 0.5), None);
    }

    #[test]
    fn huge_durations_land_in_the_last_bucket() {
        assert_eq!(cycle_bucket(u64::MAX), CYCLE_BUCKETS - 1);
        assert_eq!(cycle_bucket(0), 0);
    }
}
