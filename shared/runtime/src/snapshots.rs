//! Snapshots for the services: the newest good one loaded at a start, new
//! ones written by the processes that fold the log without deciding (the
//! gateway's view, hot standbys), so no deciding loop ever waits for one.
//!
//! Owns: when to write (every N events, or every T seconds when anything
//! was folded since, and never more than a tenth of the time: see
//! [`DUTY_SPACING`]), encoding the state between two folds, and saving
//! and pruning off the follower's loop (in a task). Encoding holds the
//! follower for about 1.5× what a copy of the state would (150 ms against
//! 100 ms at 114k jobs, `cargo bench -p gpusched-core --bench snapshot`),
//! but holds in memory only the snapshot's bytes (8.5 MiB there), where a
//! copy doubled the state for as long as encoding took. Before encoding,
//! it asks the log for the newest snapshot: when another process wrote one
//! recently, it adopts that one instead of writing its own, so one
//! deployment mostly shares one snapshot per interval.
//!
//! Must never: run in a leading service's loop, snapshot a state that is
//! not exactly the log up to its sequence, let a failed snapshot stop
//! anything, or use a snapshot that failed a check (it is skipped with a
//! warning, and the start folds from an older one or from the log's first
//! event).

use std::time::{Duration, Instant};

use gpusched_core::snapshot::{self, Snapshot};
use gpusched_core::State;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::log::Log;

/// A snapshot is not due again before this many times the last one's cost
/// (encode and save) has passed since it started, so writing
/// snapshots takes at most about a tenth of one core however fast the log
/// grows. Under a burst of 50k events/s every 100,000 events would mean a
/// snapshot every 2 s, each costing over a second of CPU on a state of
/// 100k jobs: a tenth of the machine's two cores went to snapshots.
pub const DUTY_SPACING: u32 = 10;

/// When a service writes and reads snapshots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotPolicy {
    /// Write one after this many events since the last (0: never write).
    pub every_events: u64,
    /// Write one after this long since the last, when events were folded
    /// since.
    pub every: Duration,
    /// Snapshots kept; older ones are pruned (the log never is).
    pub keep: usize,
    /// Load the newest good snapshot at a start (else fold the whole log).
    pub load: bool,
}

impl Default for SnapshotPolicy {
    fn default() -> Self {
        SnapshotPolicy {
            every_events: 100_000,
            every: Duration::from_secs(300),
            keep: 3,
            load: true,
        }
    }
}

/// What a start loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loaded {
    /// The snapshot's sequence.
    pub seq: u64,
    /// How old it was, milliseconds.
    pub age_ms: u64,
    /// Its size.
    pub bytes: u64,
    /// How long reading and checking it took, milliseconds.
    pub load_ms: u64,
    /// Newer snapshots skipped because they failed a check.
    pub skipped: usize,
}

/// The newest snapshot that passes every check, or `None` (no snapshot, or
/// the log unreadable: the start then folds from the first event). Each
/// one skipped is logged with its reason.
pub async fn load_newest(log: &Log, service: &str) -> Option<(Snapshot, Loaded)> {
    let started = Instant::now();
    let found = match log.max_seq().await {
        Ok(end) => log.newest_snapshot(end).await,
        Err(e) => Err(e),
    };
    let found = match found {
        Ok(f) => f,
        Err(e) => {
            warn!(service, error = %e, "cannot read snapshots; folding the whole log");
            return None;
        }
    };
    for s in &found.skipped {
        warn!(service, seq = s.seq, why = %s.why, "snapshot skipped");
    }
    let (snap, row) = found.snapshot?;
    let age = chrono::Utc::now() - row.taken_at;
    let loaded = Loaded {
        seq: snap.seq,
        // A snapshot stamped ahead of this host's clock (skew) is new.
        age_ms: age.num_milliseconds().max(0).unsigned_abs(),
        bytes: row.bytes,
        load_ms: started.elapsed().as_millis() as u64,
        skipped: found.skipped.len(),
    };
    info!(
        service,
        seq = loaded.seq,
        age_ms = loaded.age_ms,
        bytes = loaded.bytes,
        ms = loaded.load_ms,
        "snapshot loaded"
    );
    Some((snap, loaded))
}

/// A snapshot the writer saved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    /// Its sequence.
    pub seq: u64,
    /// Its size.
    pub bytes: u64,
    /// How long the follower's loop was held to encode the state, microseconds.
    pub hold_us: u64,
    /// How long encoding and saving took, milliseconds.
    pub write_ms: u64,
}

enum Step {
    Idle,
    /// Asking the log for the newest snapshot (`None`: it did not answer).
    Checking(JoinHandle<Option<u64>>),
    /// Saving a snapshot encoded at this sequence.
    Writing(JoinHandle<Option<Written>>, u64),
}

/// Writes snapshots for one lead (module docs).
pub struct Writer {
    policy: SnapshotPolicy,
    holder: String,
    service: String,
    last_seq: u64,
    last_at: Instant,
    /// What the last snapshot this writer wrote cost (zero before one).
    last_cost: Duration,
    step: Step,
}

impl Writer {
    /// A writer whose last snapshot is at `from_seq` (0: none).
    pub fn new(policy: SnapshotPolicy, service: &str, holder: &str, from_seq: u64) -> Self {
        Writer {
            policy,
            holder: holder.to_string(),
            service: service.to_string(),
            last_seq: from_seq,
            last_at: Instant::now(),
            last_cost: Duration::ZERO,
            step: Step::Idle,
        }
    }

    fn due(&self, seq: u64) -> bool {
        self.policy.every_events > 0
            && self.last_at.elapsed() >= self.last_cost * DUTY_SPACING
            && (seq >= self.last_seq.saturating_add(self.policy.every_events)
                || (seq > self.last_seq && self.last_at.elapsed() >= self.policy.every))
    }

    /// Moves the writer on between two folds, with the state folded up to
    /// `seq`; returns a snapshot saved since the last call.
    pub fn tick(&mut self, log: &Log, state: &State, seq: u64) -> Option<Written> {
        match std::mem::replace(&mut self.step, Step::Idle) {
            Step::Idle if self.due(seq) => {
                let log = log.clone();
                self.step =
                    Step::Checking(tokio::spawn(
                        async move { log.newest_snapshot_seq().await.ok() },
                    ));
                None
            }
            Step::Idle => None,
            Step::Checking(h) if !h.is_finished() => {
                self.step = Step::Checking(h);
                None
            }
            Step::Checking(h) => {
                // Another instance's newer snapshot moves the next one on;
                // without an answer, this writer goes by its own.
                let newest = futures::FutureExt::now_or_never(h)
                    .and_then(Result::ok)
                    .flatten();
                if let Some(newest) = newest.filter(|&n| n > self.last_seq) {
                    self.last_seq = newest;
                    self.last_at = Instant::now();
                }
                if self.due(seq) {
                    self.write(log, state, seq);
                }
                None
            }
            Step::Writing(h, at) if !h.is_finished() => {
                self.step = Step::Writing(h, at);
                None
            }
            Step::Writing(h, _) => {
                self.last_cost = self.last_at.elapsed();
                futures::FutureExt::now_or_never(h)
                    .and_then(Result::ok)
                    .flatten()
            }
        }
    }

    /// Encodes the state (the only part on the caller's loop) and saves it
    /// in the background.
    fn write(&mut self, log: &Log, state: &State, seq: u64) {
        // The cost that spaces the next snapshot runs from here: encoding
        // is most of it.
        let started = Instant::now();
        let body = snapshot::encode(state, seq);
        let hold_us = started.elapsed().as_micros() as u64;
        self.last_seq = seq;
        self.last_at = started;
        let (log, holder, service, keep) = (
            log.clone(),
            self.holder.clone(),
            self.service.clone(),
            self.policy.keep,
        );
        let task = tokio::spawn(async move {
            match log.save_snapshot(&body, &holder, keep).await {
                Ok(_) => {
                    let w = Written {
                        seq,
                        bytes: body.len() as u64,
                        hold_us,
                        write_ms: started.elapsed().as_millis() as u64,
                    };
                    info!(
                        service,
                        seq,
                        bytes = w.bytes,
                        hold_us,
                        ms = w.write_ms,
                        "snapshot written"
                    );
                    Some(w)
                }
                Err(e) => {
                    warn!(service, seq, error = %e, "snapshot not written");
                    None
                }
            }
        });
        self.step = Step::Writing(task, seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer() -> Writer {
        let policy = SnapshotPolicy {
            every_events: 10,
            ..SnapshotPolicy::default()
        };
        Writer::new(policy, "test", "test-1", 0)
    }

    #[test]
    fn a_snapshot_is_due_after_enough_events() {
        let w = writer();
        assert!(!w.due(9));
        assert!(w.due(10));
    }

    #[test]
    fn a_costly_snapshot_spaces_out_the_next_one() {
        let mut w = writer();
        w.last_cost = Duration::from_secs(2);
        // 20 s must pass since the last one started (ten times its cost),
        // however many events came since.
        assert!(!w.due(1_000_000));
        w.last_at = Instant::now()
            .checked_sub(Duration::from_secs(21))
            .expect("the monotonic clock has run for over 21 s");
        assert!(w.due(1_000_000));
        assert!(!w.due(0), "nothing new to snapshot");
    }
}
