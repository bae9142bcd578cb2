//! The deciding services' shape: a pure [`Decider`] run by
//! [`run_service`], which stands by until this instance holds the stage's
//! lease, leads (see the `stage` module) until the lease is lost or
//! shutdown, and goes back to standby.
//!
//! A standby is hot: while it waits for the lease it keeps folding the log
//! (a fresh decider observing every event, exactly as a rebuild would), so
//! a takeover folds only the last few events instead of the whole log.
//!
//! Owns: the `Decider` contract, a service's configuration, the
//! standby → lead → standby cycle (a fresh decider and fold per standby;
//! the lease kept across an error so a brief outage of the log costs no
//! takeover), and the cluster bootstrap under the `admin` lease.
//!
//! Must never: lead without the lease, keep a lease it was fenced off
//! from, or leave a lease held on its way out (shutdown, error, panic).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use gpusched_bus::BatchV1;
use gpusched_core::State;
use gpusched_events::{Event, Producer};
use gpusched_model::Timestamp;
use gpusched_store::{producer_name, NewEvent, SEQ_MAX};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::bus::Bus;
use crate::leader::{Candidate, Leader, LeaseSpec};
use crate::log::{Log, LoggedEvent};
use crate::snapshots::{Writer, Written};
use crate::stage::{lead, Start, Step, Warm};
use crate::stats::{ServiceStats, Work};

/// A pure decision function with the little memory a service keeps
/// between cycles (scan memos, an agent's timers). Implementations call
/// the core; they never do I/O.
pub trait Decider: Send {
    /// The producer whose event kinds this decider emits.
    fn producer(&self) -> Producer;

    /// Sees each event `apply` took as it is folded into the projection
    /// (the rebuild included), with the state after it. An event `apply`
    /// refused changed nothing and is not shown.
    fn observe(&mut self, _state: &State, _event: &Event) {}

    /// Called once, before any `observe`, when the fold starts from a
    /// snapshot instead of the log's first event: rebuild from `state`
    /// whatever `observe` would have learned from the events before it.
    /// A decider that keeps nothing from `observe` needs nothing here.
    fn resume(&mut self, _state: &State) {}

    /// Decides at `now` over `state`. Every event returned must be of
    /// `producer()`'s kinds.
    fn decide(&mut self, state: &State, now: Timestamp) -> Vec<Event>;

    /// The next time something falls due with no new event (timers).
    fn next_due(&self) -> Option<Timestamp> {
        None
    }

    /// What the last `decide` looked at (its bounded work); none by default.
    fn work(&self) -> Work {
        Work::default()
    }
}

/// How a service runs.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// Lease name and durable consumer name, e.g. `quota`.
    pub service: String,
    /// Lease partition (one active instance per service and partition).
    pub partition: String,
    /// This instance's name, recorded in the lease.
    pub holder: String,
    /// Lease time to live; a standby takes over this long after the
    /// holder stops renewing.
    pub lease_ttl: Duration,
    /// The decider runs at least this often (deadlines, starvation windows).
    pub tick: Duration,
    /// How long a gap in the bus may wait before it is read from the log.
    pub gap_wait: Duration,
    /// Messages taken from the feed at once.
    pub feed_batch: usize,
    /// When snapshots are written and read.
    pub snapshots: crate::snapshots::SnapshotPolicy,
}

impl ServiceConfig {
    /// Defaults for a service named `service`.
    pub fn new(service: &str, holder: &str) -> Self {
        ServiceConfig {
            service: service.to_string(),
            partition: "default".to_string(),
            holder: holder.to_string(),
            lease_ttl: Duration::from_secs(5),
            tick: Duration::from_millis(500),
            gap_wait: Duration::from_millis(20),
            feed_batch: 512,
            snapshots: Default::default(),
        }
    }

    /// The lease this service's instance holds while it leads.
    pub fn lease_spec(&self) -> LeaseSpec {
        LeaseSpec {
            service: self.service.clone(),
            partition: self.partition.clone(),
            holder: self.holder.clone(),
            ttl: self.lease_ttl,
        }
    }

    /// How often a standby asks for the lease: a twentieth of its time to
    /// live (at least 50 ms, at most 250 ms), so a takeover follows the
    /// expiry closely.
    pub fn standby_poll(&self) -> Duration {
        (self.lease_ttl / 20).clamp(Duration::from_millis(50), Duration::from_millis(250))
    }
}

/// Pause after leading failed on an error (the log unreachable) before the
/// instance tries again with the lease it still holds.
const RETRY_AFTER_ERROR: Duration = Duration::from_millis(500);

/// Runs a deciding service until `shutdown`: waits as a hot standby
/// (folding the log) until it holds the lease, then leads (catch up,
/// relay, decide loop). `make` builds a fresh decider for every standby
/// and every retry after an error (the log, not a decider's memory, says
/// what was committed). The lease is given back on every way
/// out; after an error it is kept (and renewed) while the instance tries
/// again, so a brief outage of the log costs no takeover.
pub async fn run_service<D: Decider, F: Fn() -> D>(
    log: Log,
    bus: Bus,
    cfg: ServiceConfig,
    make: F,
    shutdown: CancellationToken,
    stats: Arc<ServiceStats>,
) -> anyhow::Result<()> {
    let mut held: Option<Leader> = None;
    loop {
        stats.beat();
        let (mut leader, start) = match held.take() {
            Some(l) => (l, Start::Cold(make())),
            None => match standby(&log, &cfg, make(), &shutdown, &stats).await {
                Some((l, Some(warm))) => (l, Start::Warm(Box::new(warm))),
                Some((l, None)) => (l, Start::Cold(make())),
                None => return Ok(()),
            },
        };
        let epoch = leader.epoch();
        stats.leading_epoch.store(epoch, Ordering::Relaxed);
        match lead(&log, &bus, &cfg, start, &mut leader, &shutdown, &stats).await {
            Ok(Step::Shutdown) => {
                leader.release().await;
                return Ok(());
            }
            Ok(Step::StepDown) => {
                warn!(service = %cfg.service, epoch, "fenced off; back to standby");
                leader.abandon();
            }
            Err(e) => {
                stats.log_down.store(1, Ordering::Relaxed);
                error!(service = %cfg.service, error = %e, "leading failed; trying again");
                held = retry_with(leader, &cfg, &shutdown).await;
                if shutdown.is_cancelled() {
                    return Ok(());
                }
            }
        }
    }
}

/// Waits as standby (the loop heartbeat kept moving) until the lease is
/// taken, folding the log between attempts; `None` on shutdown. The fold
/// is `None` when the lease was taken at the first attempt.
async fn standby<D: Decider>(
    log: &Log,
    cfg: &ServiceConfig,
    fresh: D,
    shutdown: &CancellationToken,
    stats: &Arc<ServiceStats>,
) -> Option<(Leader, Option<Warm<D>>)> {
    stats.leading_epoch.store(0, Ordering::Relaxed);
    let beat = keep_beating(stats, shutdown);
    let mut candidate = Candidate::new(log, &cfg.lease_spec());
    let mut warm = Warm::new(fresh);
    let mut folded = false;
    let mut loaded = false;
    let mut writer = Writer::new(cfg.snapshots, &cfg.service, &cfg.holder, 0);
    let taken = loop {
        if let Some(leader) = candidate.try_take().await {
            break Some(leader);
        }
        if !loaded {
            // Only a standby that failed its first attempt folds: one that
            // takes the lease at once starts its lead from a snapshot itself.
            loaded = true;
            tokio::select! {
                _ = shutdown.cancelled() => break None,
                _ = warm.load_snapshot(log, cfg, stats) => {}
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => break None,
            _ = keep_warm(log, &mut warm, stats) => folded = true,
        }
        // A standby decides nothing: encoding its state for a snapshot
        // stalls no one.
        if let Some(w) = writer.tick(log, warm.proj.state(), warm.proj.seq()) {
            record_snapshot(stats, &w);
        }
        tokio::select! {
            _ = shutdown.cancelled() => break None,
            _ = tokio::time::sleep(cfg.standby_poll()) => {}
        }
    };
    beat.cancel();
    candidate.close().await;
    let leader = taken?;
    stats.takeovers.fetch_add(1, Ordering::Relaxed);
    stats
        .lease_unix_ms
        .store(crate::clock::wall_clock().0, Ordering::Relaxed);
    info!(service = %cfg.service, epoch = leader.epoch(), holder = %cfg.holder, warm_seq = warm.proj.seq(), "lease taken");
    Some((leader, folded.then_some(warm)))
}

/// Counts a snapshot a standby wrote.
fn record_snapshot(stats: &ServiceStats, w: &Written) {
    stats.snapshots_written.fetch_add(1, Ordering::Relaxed);
    stats.snapshot_written_seq.store(w.seq, Ordering::Relaxed);
    stats.snapshot_bytes.store(w.bytes, Ordering::Relaxed);
    stats
        .snapshot_hold_us_max
        .fetch_max(w.hold_us, Ordering::Relaxed);
}

/// Folds what the log holds beyond a standby's fold (the whole log the
/// first time). A log that cannot be read leaves the fold where it was.
async fn keep_warm<D: Decider>(log: &Log, w: &mut Warm<D>, stats: &ServiceStats) {
    match w.catch_up(log, SEQ_MAX).await {
        Ok(_) => {
            stats.log_down.store(0, Ordering::Relaxed);
            stats.caught_up();
        }
        Err(e) => {
            stats.log_down.store(1, Ordering::Relaxed);
            warn!(error = %e, "standby cannot read the log; trying again");
        }
    }
    stats.seq.store(w.proj.seq(), Ordering::Relaxed);
}

/// After a failed lead: pauses, then keeps the lease if it is still this
/// instance's (`None`: lost, or shutdown, with the lease given back).
async fn retry_with(
    mut leader: Leader,
    cfg: &ServiceConfig,
    shutdown: &CancellationToken,
) -> Option<Leader> {
    tokio::select! {
        _ = shutdown.cancelled() => {
            leader.release().await;
            return None;
        }
        _ = tokio::time::sleep(RETRY_AFTER_ERROR) => {}
    }
    match leader.renew().await {
        Ok(()) => Some(leader),
        Err(lost) => {
            warn!(service = %cfg.service, error = %lost, "back to standby");
            leader.abandon();
            None
        }
    }
}

/// Moves the loop heartbeat while the instance stands by (a standby is
/// alive, not stuck); stops when the returned token is cancelled.
fn keep_beating(stats: &Arc<ServiceStats>, shutdown: &CancellationToken) -> CancellationToken {
    let stop = shutdown.child_token();
    let (s, t) = (stats.clone(), stop.clone());
    tokio::spawn(async move {
        loop {
            s.beat();
            tokio::select! {
                _ = t.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
        }
    });
    stop
}

/// Groups events into runs of consecutive sequence numbers.
pub(crate) fn runs(events: Vec<LoggedEvent>) -> Vec<(u64, Vec<Event>)> {
    let mut out: Vec<(u64, Vec<Event>)> = Vec::new();
    for le in events {
        match out.last_mut() {
            Some((first, evs)) if *first + evs.len() as u64 == le.seq => evs.push(le.event),
            _ => out.push((le.seq, vec![le.event])),
        }
    }
    out
}

/// Appends the administrative part of a cluster description (topology,
/// tenants, cordons) that the log does not hold yet, under the `admin`
/// lease. Each event carries a key derived from its content, so applying
/// the same description twice appends nothing and a changed tenant appends
/// its new configuration. Returns the events appended.
pub async fn bootstrap_cluster(
    log: &Log,
    bus: &Bus,
    events: &[Event],
    holder: &str,
) -> anyhow::Result<u64> {
    let admin: Vec<NewEvent> = events
        .iter()
        .filter(|e| e.producer() == Producer::Admin)
        .map(|e| {
            let json = serde_json::to_vec(e).unwrap_or_default();
            let key = format!(
                "admin:{}:{:016x}",
                e.kind(),
                gpusched_model::fnv1a_64(&json)
            );
            NewEvent::new(e.clone()).idempotency_key(key)
        })
        .collect();
    let spec = LeaseSpec {
        service: "admin".into(),
        partition: "default".into(),
        holder: holder.to_string(),
        ttl: Duration::from_secs(10),
    };
    let never = CancellationToken::new();
    let leader = Leader::wait_take(log, &spec, Duration::from_millis(200), &never)
        .await
        .ok_or_else(|| anyhow::anyhow!("the admin lease could not be taken"))?;
    let epoch = leader.epoch();
    let out = log.append(&admin, &leader.fence()).await;
    leader.release().await;
    let out = out?;
    let written: Vec<LoggedEvent> = out
        .seqs
        .iter()
        .zip(&admin)
        .filter_map(|(s, ne)| {
            s.map(|seq| LoggedEvent {
                seq,
                event: ne.event.clone(),
            })
        })
        .collect();
    for (first, events) in runs(written) {
        let batch = Arc::new(BatchV1::new(
            producer_name(Producer::Admin),
            epoch,
            first,
            events,
        ));
        bus.publish(batch).await?;
    }
    Ok(out.appended)
}
