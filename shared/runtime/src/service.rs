//! The decide loop every deciding service runs: consume → fold → decide →
//! append (fenced) → publish.
//!
//! Reading the log: a gap in the bus is filled by reading just the missing
//! range; the tail is read (a page a poll) only when the bus failed or has
//! been quiet for a tick (a lost last batch), never while batches keep
//! coming (under load the log grows about as fast as a follower reads it
//! back, and a read to the end would keep the service from deciding for
//! seconds).
//!
//! Owns: lease handling (standby until the lease is free, renew, step down
//! when fenced off), the rebuild of the projection on start, the outbox
//! relay (republishing this producer's committed batches the bus never
//! got), gap filling from the log, and the shape of a cycle: every event
//! waiting on the feed is folded, then the decider runs once and its
//! decisions go to the log as one batch and to the bus as one message.
//!
//! Must never: publish before the append committed, decide while a known
//! gap is open, append events of another producer, or keep deciding after
//! the lease is lost.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpusched_bus::BatchV1;
use gpusched_core::State;
use gpusched_events::{Event, Producer};
use gpusched_model::Timestamp;
use gpusched_store::{producer_name, Lease, NewEvent, StoreError};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, info_span, warn, Instrument};

use crate::bus::{Bus, Incoming};
use crate::log::{Log, LoggedEvent};
use crate::projection::Projection;

/// A pure decision function with the little memory a service keeps
/// between cycles (scan memos, an agent's timers). Implementations call
/// the core; they never do I/O.
pub trait Decider: Send {
    /// The producer whose event kinds this decider emits.
    fn producer(&self) -> Producer;

    /// Sees every event folded into the projection (the rebuild included),
    /// with whether `apply` took it.
    fn observe(&mut self, _state: &State, _seq: u64, _event: &Event, _applied: bool) {}

    /// Decides at `now` over `state`. Every event returned must be of
    /// `producer()`'s kinds.
    fn decide(&mut self, state: &State, now: Timestamp) -> Vec<Event>;

    /// The next time something falls due with no new event (timers).
    fn next_due(&self) -> Option<Timestamp> {
        None
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
        }
    }
}

/// A read from the bus or log that takes this much longer than asked is
/// logged as slow.
const SLOW: Duration = Duration::from_millis(1000);

/// Most events one poll of the log's tail folds (a gap is read whole).
const POLL_PAGE: u64 = 10_000;

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
    pub cycle_hist: crate::stats::CycleHistogram,
    /// When this instance last became ready to decide (lease, rebuild and
    /// relay done), Unix milliseconds.
    pub ready_unix_ms: AtomicU64,
    /// How long the last rebuild took, milliseconds.
    pub rebuild_ms: AtomicU64,
}

/// Now as gpusched timestamps count it: milliseconds since the Unix epoch.
pub fn wall_clock() -> Timestamp {
    let ms = chrono::Utc::now().timestamp_millis();
    Timestamp(u64::try_from(ms).unwrap_or(0))
}

/// Runs a deciding service until `shutdown`: waits as standby until it
/// holds the lease, rebuilds its projection from the log, relays what it
/// committed but never published, then loops. `make` builds a fresh
/// decider for every takeover.
pub async fn run_service<D: Decider, F: Fn() -> D>(
    log: Log,
    bus: Bus,
    cfg: ServiceConfig,
    make: F,
    shutdown: CancellationToken,
    stats: Arc<ServiceStats>,
) -> anyhow::Result<()> {
    loop {
        let Some(lease) = standby(&log, &cfg, &shutdown).await else {
            return Ok(());
        };
        stats.takeovers.fetch_add(1, Ordering::Relaxed);
        info!(service = %cfg.service, epoch = lease.epoch, holder = %cfg.holder, "lease taken; rebuilding");
        match lead(&log, &bus, &cfg, make(), lease, &shutdown, &stats).await {
            Ok(Step::Shutdown) => return Ok(()),
            Ok(Step::StepDown) => {
                warn!(service = %cfg.service, "stepped down; back to standby");
            }
            Err(e) => {
                error!(service = %cfg.service, error = %e, "leading failed; back to standby");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        }
    }
}

async fn standby(log: &Log, cfg: &ServiceConfig, shutdown: &CancellationToken) -> Option<Lease> {
    let mut announced = false;
    loop {
        if shutdown.is_cancelled() {
            return None;
        }
        match log
            .acquire_lease(&cfg.service, &cfg.partition, &cfg.holder, cfg.lease_ttl)
            .await
        {
            Ok(Some(lease)) => return Some(lease),
            Ok(None) => {
                if !announced {
                    info!(service = %cfg.service, "lease held elsewhere; standing by");
                    announced = true;
                }
            }
            Err(e) => {
                warn!(service = %cfg.service, error = %e, "cannot reach the log for the lease")
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(cfg.lease_ttl / 5) => {}
        }
    }
}

enum Step {
    Shutdown,
    StepDown,
}

fn is_fenced(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::StaleEpoch { .. } | StoreError::NoLease { .. } | StoreError::LeaseLost { .. }
    )
}

/// Groups events into runs of consecutive sequence numbers.
fn runs(events: Vec<LoggedEvent>) -> Vec<(u64, Vec<Event>)> {
    let mut out: Vec<(u64, Vec<Event>)> = Vec::new();
    for le in events {
        match out.last_mut() {
            Some((first, evs)) if *first + evs.len() as u64 == le.seq => evs.push(le.event),
            _ => out.push((le.seq, vec![le.event])),
        }
    }
    out
}

/// Publishes in a task of its own, inside the current span (so the batch
/// carries the current trace context).
fn publish_in_background(bus: &Bus, batch: Arc<BatchV1>) {
    let bus = bus.clone();
    tokio::spawn(
        async move {
            if let Err(e) = bus.publish(batch).await {
                // The log has the batch; followers read it from there.
                warn!(error = %e, "publish failed; followers will read the log");
            }
        }
        .in_current_span(),
    );
}

async fn lead<D: Decider>(
    log: &Log,
    bus: &Bus,
    cfg: &ServiceConfig,
    mut decider: D,
    mut lease: Lease,
    shutdown: &CancellationToken,
    stats: &ServiceStats,
) -> anyhow::Result<Step> {
    let producer = decider.producer();
    let pname = producer_name(producer);
    // Subscribe before rebuilding so nothing committed meanwhile is missed.
    let mut feed = bus.feed(&cfg.service).await?;
    let published = bus.last_published(pname).await.unwrap_or(0);
    let mut unpublished: Vec<LoggedEvent> = Vec::new();
    let started = Instant::now();
    let mut proj = {
        let mut obs = |s: &State, seq: u64, e: &Event, ok: bool| {
            if seq > published && e.producer() == producer {
                unpublished.push(LoggedEvent {
                    seq,
                    event: e.clone(),
                });
            }
            decider.observe(s, seq, e, ok);
        };
        Projection::rebuild(log, &mut obs).await?
    };
    info!(
        service = %cfg.service,
        seq = proj.seq(),
        jobs = proj.state().job_count(),
        ms = started.elapsed().as_millis() as u64,
        "projection rebuilt"
    );
    // Outbox relay: what this producer committed that the bus never got.
    for (first, events) in runs(unpublished) {
        let last = first + events.len() as u64 - 1;
        let batch = Arc::new(BatchV1 {
            producer: pname.to_string(),
            epoch: u64::try_from(lease.epoch).unwrap_or(0),
            first_seq: first,
            last_seq: last,
            correlation_id: None,
            events,
        });
        bus.publish(batch).await?;
        stats.relayed.fetch_add(1, Ordering::Relaxed);
    }
    stats.seq.store(proj.seq(), Ordering::Relaxed);
    stats
        .rebuild_ms
        .store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
    stats.ready_unix_ms.store(wall_clock().0, Ordering::Relaxed);

    let mut last_renew = Instant::now();
    let mut last_poll = Instant::now();
    // When the feed last delivered anything: the log is polled for a lost
    // tail only once the feed has been quiet for a tick (while batches
    // keep coming, a lost one shows up as a gap).
    let mut last_heard = Instant::now();
    let mut last_decide = Instant::now() - cfg.tick;
    let mut dirty = true;
    // The trace context of the latest batch received: the next cycle's
    // span continues that trace.
    let mut remote_parent: Option<String> = None;
    loop {
        if shutdown.is_cancelled() {
            if let Err(e) = log.release_lease(&lease).await {
                warn!(service = %cfg.service, error = %e, "releasing the lease");
            }
            info!(service = %cfg.service, seq = proj.seq(), "shut down");
            return Ok(Step::Shutdown);
        }
        if last_renew.elapsed() >= cfg.lease_ttl / 3 {
            match log.renew_lease(&lease, cfg.lease_ttl).await {
                Ok(l) => {
                    lease = l;
                    last_renew = Instant::now();
                }
                Err(e) if is_fenced(&e) => return Ok(Step::StepDown),
                Err(e) => warn!(service = %cfg.service, error = %e, "renewing the lease"),
            }
        }

        // Wait for input unless there is work now.
        let now_ms = wall_clock();
        let mut wait = if dirty {
            Duration::ZERO
        } else {
            cfg.tick.saturating_sub(last_decide.elapsed())
        };
        if let Some(due) = decider.next_due() {
            wait = wait.min(Duration::from_millis(due.0.saturating_sub(now_ms.0)));
        }
        if let Some(t) = proj.gap_since() {
            wait = wait.min(cfg.gap_wait.saturating_sub(t.elapsed()));
        }
        let asked = Instant::now();
        let incoming = tokio::select! {
            _ = shutdown.cancelled() => continue,
            r = feed.next(cfg.feed_batch, wait.max(Duration::from_millis(1))) => r,
        };
        if asked.elapsed() > wait + SLOW {
            warn!(
                service = %cfg.service,
                ms = asked.elapsed().as_millis() as u64,
                wait_ms = wait.as_millis() as u64,
                items = incoming.as_ref().map_or(0, Vec::len),
                "slow read from the bus"
            );
        }
        let mut folded = 0usize;
        let mut need_read = false;
        {
            let mut obs = |s: &State, seq: u64, e: &Event, ok: bool| decider.observe(s, seq, e, ok);
            match incoming {
                Ok(items) => {
                    if !items.is_empty() {
                        last_heard = Instant::now();
                    }
                    for item in items {
                        match item {
                            Incoming::Batch(b, tp) => {
                                if tp.is_some() {
                                    remote_parent = tp;
                                }
                                folded += proj.offer(b, &mut obs);
                            }
                            Incoming::Malformed(why) => {
                                stats.malformed.fetch_add(1, Ordering::Relaxed);
                                warn!(service = %cfg.service, %why, "malformed message skipped");
                            }
                            Incoming::Lagged => need_read = true,
                        }
                    }
                }
                Err(e) => {
                    warn!(service = %cfg.service, error = %e, "bus read failed; reading the log");
                    need_read = true;
                }
            }
            let gap_due = proj
                .gap_since()
                .is_some_and(|t| t.elapsed() >= cfg.gap_wait);
            let quiet = last_heard.elapsed() >= cfg.tick && last_poll.elapsed() >= cfg.tick;
            if need_read || quiet {
                last_poll = Instant::now();
                stats.gap_reads.fetch_add(1, Ordering::Relaxed);
                // At most a page a poll: the bus, once it speaks again,
                // delivers the rest faster than the log reads back.
                let upto = proj.seq().saturating_add(POLL_PAGE);
                folded += proj.catch_up(log, upto, &mut obs).await?;
            } else if gap_due {
                // Read only what is missing: reading to the end of a log
                // that grows as fast as it is read would starve deciding.
                stats.gap_reads.fetch_add(1, Ordering::Relaxed);
                let upto = proj.gap_end().unwrap_or(u64::MAX);
                folded += proj.catch_up(log, upto, &mut obs).await?;
            }
            if asked.elapsed() > wait + SLOW {
                warn!(service = %cfg.service, ms = asked.elapsed().as_millis() as u64, folded, "slow fold");
            }
        }
        if folded > 0 {
            dirty = true;
            stats.folded.fetch_add(folded as u64, Ordering::Relaxed);
            stats.seq.store(proj.seq(), Ordering::Relaxed);
            stats.superseded.store(proj.superseded(), Ordering::Relaxed);
        }

        let now = wall_clock();
        let due = decider.next_due().is_some_and(|d| d <= now);
        if proj.gap_since().is_some() || !(dirty || due || last_decide.elapsed() >= cfg.tick) {
            continue;
        }
        dirty = false;
        last_decide = Instant::now();
        stats.cycles.fetch_add(1, Ordering::Relaxed);
        let cycle = info_span!("cycle", service = %cfg.service);
        crate::telemetry::set_remote_parent(&cycle, remote_parent.take().as_deref());
        let decided = cycle.in_scope(|| decider.decide(proj.state(), now));
        if decided.is_empty() {
            continue;
        }
        let (events, foreign): (Vec<Event>, Vec<Event>) =
            decided.into_iter().partition(|e| e.producer() == producer);
        for e in &foreign {
            error!(service = %cfg.service, kind = e.kind(), "decider emitted another producer's event; dropped");
        }
        if events.is_empty() {
            continue;
        }
        let batch: Vec<NewEvent> = events.iter().cloned().map(NewEvent::new).collect();
        match log
            .append(&batch, &lease.fence())
            .instrument(cycle.clone())
            .await
        {
            Ok(out) => {
                let (Some(first), Some(last)) = (out.first_seq, out.last_seq) else {
                    continue;
                };
                let batch = Arc::new(BatchV1 {
                    producer: pname.to_string(),
                    epoch: u64::try_from(lease.epoch).unwrap_or(0),
                    first_seq: u64::try_from(first).unwrap_or(0),
                    last_seq: u64::try_from(last).unwrap_or(0),
                    correlation_id: None,
                    events,
                });
                stats.appended.fetch_add(out.appended, Ordering::Relaxed);
                stats.batches.fetch_add(1, Ordering::Relaxed);
                debug!(service = %cfg.service, first, last, "appended");
                cycle.in_scope(|| publish_in_background(bus, batch.clone()));
                let mut obs =
                    |s: &State, seq: u64, e: &Event, ok: bool| decider.observe(s, seq, e, ok);
                let n = proj.offer(batch, &mut obs);
                stats.folded.fetch_add(n as u64, Ordering::Relaxed);
                stats.seq.store(proj.seq(), Ordering::Relaxed);
                stats.superseded.store(proj.superseded(), Ordering::Relaxed);
                dirty = true;
                let us = last_decide.elapsed().as_micros() as u64;
                stats.cycle_us.fetch_add(us, Ordering::Relaxed);
                stats.cycle_hist.record(us);
            }
            Err(e) if is_fenced(&e) => {
                warn!(service = %cfg.service, error = %e, "append fenced off");
                return Ok(Step::StepDown);
            }
            Err(e) => {
                // The decisions were not written; a fresh decider rebuilt
                // from the log decides them again.
                let _ = log.release_lease(&lease).await;
                return Err(e.into());
            }
        }
    }
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
    let ttl = Duration::from_secs(10);
    let lease = loop {
        if let Some(l) = log.acquire_lease("admin", "default", holder, ttl).await? {
            break l;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let out = log.append(&admin, &lease.fence()).await;
    let _ = log.release_lease(&lease).await;
    let out = out?;
    let written: Vec<LoggedEvent> = out
        .seqs
        .iter()
        .zip(&admin)
        .filter_map(|(s, ne)| {
            s.map(|s| LoggedEvent {
                seq: u64::try_from(s).unwrap_or(0),
                event: ne.event.clone(),
            })
        })
        .collect();
    for (first, events) in runs(written) {
        let batch = Arc::new(BatchV1 {
            producer: producer_name(Producer::Admin).to_string(),
            epoch: u64::try_from(lease.epoch).unwrap_or(0),
            first_seq: first,
            last_seq: first + events.len() as u64 - 1,
            correlation_id: None,
            events,
        });
        bus.publish(batch).await?;
    }
    Ok(out.appended)
}
