//! One lead of a deciding service: rebuild (or catch up what a hot
//! standby folded while it waited) → relay → loop of receive → fold →
//! decide → append (fenced) → publish, for as long as the lease holds.
//!
//! Reading the log: a gap in the bus is filled by reading just the missing
//! range; the tail is read (a page a poll) only when the bus failed or has
//! been quiet for a tick (a lost last batch), never while batches keep
//! coming (under load the log grows about as fast as a follower reads it
//! back, and a read to the end would keep the service from deciding for
//! seconds).
//!
//! The bus is the fast path only. While it fails (NATS down, restarted,
//! not answering) the stage decides from the log alone, reading its tail
//! every [`DEGRADED_POLL`], and goes back to the bus when it answers
//! again; a failed publish is logged, never the end of leading (followers
//! read the batch from the log).
//!
//! Tracing: each cycle is a `cycle` span continuing the trace of the last
//! message delivered; and each job the decider moves whose trace context
//! a message carried gets a span of its own in that job's trace (see the
//! `job_trace` module), whose context the published batch carries on.
//!
//! Owns: the shape of a cycle (every event waiting on the feed is folded,
//! then the decider runs once and its decisions go to the log as one batch
//! and to the bus as one message), gap filling, the outbox relay
//! (republishing this producer's committed batches the bus never got), and
//! the lead's memory of its jobs' trace contexts.
//!
//! Must never: publish before the append committed, decide while a known
//! gap is open, append events of another producer, keep deciding after
//! the lease is lost, or let a trace context reach the decider.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpusched_bus::{BatchV1, BusError, JobTraces};
use gpusched_core::State;
use gpusched_events::{Event, Producer};
use gpusched_store::{producer_name, NewEvent, SEQ_MAX};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, info_span, warn, Instrument, Span};

use crate::bus::{Bus, Feed, Incoming};
use crate::clock::wall_clock;
use crate::job_trace::{JobContexts, MAX_JOB_CONTEXTS};
use crate::leader::{is_fenced, Leader};
use crate::log::{Log, LoggedEvent};
use crate::projection::Projection;
use crate::service::{runs, Decider, ServiceConfig};
use crate::snapshots::load_newest;
use crate::stats::ServiceStats;

/// A read from the bus or log that takes this much longer than asked is
/// logged as slow.
const SLOW: Duration = Duration::from_millis(1000);

/// Most events one poll of the log's tail folds (a gap is read whole).
const POLL_PAGE: u64 = 10_000;

/// How often the log's tail is read while the bus fails: the added
/// latency of each stage in the degraded mode.
pub const DEGRADED_POLL: Duration = Duration::from_millis(100);

/// What a standby folded while it waited for the lease: its lead starts
/// from here and folds only what was committed since.
pub(crate) struct Warm<D> {
    /// The state folded so far.
    pub(crate) proj: Projection,
    /// The decider that observed every event of `proj`.
    pub(crate) decider: D,
    /// The sequence of the last event of the decider's producer folded
    /// (0: none): the relay reads the log back only when the bus has
    /// less than this.
    pub(crate) last_own: u64,
}

impl<D: Decider> Warm<D> {
    /// A fold from nothing.
    pub(crate) fn new(decider: D) -> Self {
        Warm {
            proj: Projection::new(),
            decider,
            last_own: 0,
        }
    }

    /// Starts a fold from nothing at the newest good snapshot instead, when
    /// the policy allows and one exists; records what was loaded.
    pub(crate) async fn load_snapshot(
        &mut self,
        log: &Log,
        cfg: &ServiceConfig,
        stats: &ServiceStats,
    ) {
        stats.snapshot_seq.store(0, Ordering::Relaxed);
        if !cfg.snapshots.load || self.proj.seq() > 0 {
            return;
        }
        let Some((snap, loaded)) = load_newest(log, &cfg.service).await else {
            return;
        };
        // This producer's last event up to the snapshot: the relay reads
        // the log back only when the bus lacks it (unknown: assume the
        // snapshot's last event, which makes the relay read back).
        let producer = self.decider.producer();
        self.last_own = log
            .last_seq_of(producer, snap.seq)
            .await
            .unwrap_or(snap.seq);
        self.decider.resume(&snap.state);
        self.proj = Projection::at(snap.state, snap.seq);
        stats.snapshot_seq.store(loaded.seq, Ordering::Relaxed);
        stats
            .snapshot_age_ms
            .store(loaded.age_ms, Ordering::Relaxed);
        stats
            .snapshot_load_ms
            .store(loaded.load_ms, Ordering::Relaxed);
    }

    /// Folds the log from the fold's position up to `upto` (`SEQ_MAX`:
    /// its end), noting this producer's last event; returns the events
    /// folded.
    pub(crate) async fn catch_up(&mut self, log: &Log, upto: u64) -> gpusched_store::Result<usize> {
        let producer = self.decider.producer();
        let (decider, last_own) = (&mut self.decider, &mut self.last_own);
        let mut obs = |s: &State, seq: u64, e: &Event, ok: bool| {
            if e.producer() == producer {
                *last_own = seq;
            }
            if ok {
                decider.observe(s, e);
            }
        };
        self.proj.catch_up(log, upto, &mut obs).await
    }
}

/// How a lead starts.
pub(crate) enum Start<D> {
    /// From nothing: fold the whole log.
    Cold(D),
    /// From a hot standby's fold.
    Warm(Box<Warm<D>>),
}

impl<D: Decider> Start<D> {
    fn producer(&self) -> Producer {
        match self {
            Start::Cold(d) => d.producer(),
            Start::Warm(w) => w.decider.producer(),
        }
    }
}

/// How a lead ended.
pub(crate) enum Step {
    /// Shutdown was asked for.
    Shutdown,
    /// The lease moved to another epoch.
    StepDown,
}

/// Leads until shutdown or until the lease is lost; an error (the log
/// unreachable) ends the lead with the lease still held.
pub(crate) async fn lead<D: Decider>(
    log: &Log,
    bus: &Bus,
    cfg: &ServiceConfig,
    start: Start<D>,
    leader: &mut Leader,
    shutdown: &CancellationToken,
    stats: &ServiceStats,
) -> anyhow::Result<Step> {
    let mut stage = Stage::start(log, bus, cfg, start, leader.epoch(), stats).await?;
    loop {
        stats.beat();
        if shutdown.is_cancelled() {
            info!(service = %cfg.service, seq = stage.proj.seq(), "shut down");
            return Ok(Step::Shutdown);
        }
        if leader.keep().await.is_err() {
            return Ok(Step::StepDown);
        }
        let wait = stage.wait();
        let asked = Instant::now();
        let received = tokio::select! {
            _ = shutdown.cancelled() => continue,
            r = stage.receive(wait) => r,
        };
        add_us(&stats.receive_us, asked);
        if asked.elapsed() > wait + SLOW {
            warn!(service = %cfg.service, ms = asked.elapsed().as_millis() as u64, wait_ms = wait.as_millis() as u64, "slow read from the bus");
        }
        let folding = Instant::now();
        let need_read = stage.fold(received);
        add_us(&stats.fold_us, folding);
        stage.read_log(need_read).await?;
        if stage.should_decide() && stage.cycle(leader).await? == Cycle::Fenced {
            return Ok(Step::StepDown);
        }
    }
}

/// What one read from the bus gave.
enum Received {
    /// Items from the feed (possibly none: it was quiet).
    Items(Vec<Incoming>),
    /// The bus failed; the log must be read.
    BusDown,
}

#[derive(Debug, PartialEq, Eq)]
enum Cycle {
    /// Decided (and appended what it decided, if anything).
    Done,
    /// The append was refused: the lease moved on.
    Fenced,
}

/// The state of one lead.
struct Stage<'a, D> {
    log: &'a Log,
    bus: &'a Bus,
    cfg: &'a ServiceConfig,
    stats: &'a ServiceStats,
    decider: D,
    producer: Producer,
    epoch: u64,
    proj: Projection,
    feed: Option<Feed>,
    bus_down: bool,
    /// Whether the bus has answered once in this lead.
    bus_answered: bool,
    /// When the feed last delivered anything: the log is polled for a
    /// lost tail only once the feed has been quiet for a tick.
    last_heard: Instant,
    last_poll: Instant,
    last_decide: Instant,
    dirty: bool,
    /// The trace context of the latest batch received: the next cycle's
    /// span continues that trace.
    remote_parent: Option<String>,
    /// Each job's newest trace context, learned from the bus (bounded).
    job_traces: JobContexts,
}

impl<'a, D: Decider> Stage<'a, D> {
    /// Subscribes, rebuilds the projection from the log (or catches up a
    /// warm one), and relays what this producer committed that the bus
    /// never got.
    async fn start(
        log: &'a Log,
        bus: &'a Bus,
        cfg: &'a ServiceConfig,
        start: Start<D>,
        epoch: u64,
        stats: &'a ServiceStats,
    ) -> anyhow::Result<Self> {
        let producer = start.producer();
        // Subscribe before folding so nothing committed meanwhile is
        // missed (if the bus is down, the tail poll finds it).
        let feed = subscribe(bus, &cfg.service).await;
        let published = last_published(bus, producer, &cfg.service).await;
        let started = Instant::now();
        let (proj, decider, unpublished, folded) = match start {
            Start::Cold(decider) => {
                let mut warm = Warm::new(decider);
                warm.load_snapshot(log, cfg, stats).await;
                rebuild(log, warm, producer, published, stats).await?
            }
            Start::Warm(warm) => catch_up(log, *warm, producer, published, stats).await?,
        };
        stats.first_append_unix_ms.store(0, Ordering::Relaxed);
        stats.caught_up();
        stats
            .takeover_folded
            .store(folded as u64, Ordering::Relaxed);
        stats.log_down.store(0, Ordering::Relaxed);
        info!(service = %cfg.service, seq = proj.seq(), folded, jobs = proj.state().job_count(), ms = started.elapsed().as_millis() as u64, "projection ready");
        relay(bus, producer, epoch, unpublished, stats).await;
        stats.seq.store(proj.seq(), Ordering::Relaxed);
        let rebuild_ms = started.elapsed().as_millis() as u64;
        stats.rebuild_ms.store(rebuild_ms, Ordering::Relaxed);
        stats.ready_unix_ms.store(wall_clock().0, Ordering::Relaxed);
        Ok(Stage {
            log,
            bus,
            cfg,
            stats,
            decider,
            producer,
            epoch,
            proj,
            bus_down: feed.is_none(),
            bus_answered: false,
            feed,
            last_heard: Instant::now(),
            last_poll: Instant::now(),
            last_decide: Instant::now() - cfg.tick,
            dirty: true,
            remote_parent: None,
            job_traces: JobContexts::new(MAX_JOB_CONTEXTS),
        })
    }

    /// How long to wait for input: not at all with work waiting, else
    /// until the next tick, timer or gap deadline.
    fn wait(&self) -> Duration {
        let now = wall_clock();
        let mut wait = if self.dirty {
            Duration::ZERO
        } else {
            self.cfg.tick.saturating_sub(self.last_decide.elapsed())
        };
        if let Some(due) = self.decider.next_due() {
            wait = wait.min(Duration::from_millis(due.0.saturating_sub(now.0)));
        }
        if let Some(t) = self.proj.gap_since() {
            wait = wait.min(self.cfg.gap_wait.saturating_sub(t.elapsed()));
        }
        wait
    }

    /// Takes what the bus has, waiting up to `wait`; on a failing bus,
    /// waits out [`DEGRADED_POLL`] (at most `wait`) and says so.
    async fn receive(&mut self, wait: Duration) -> Received {
        let asked = Instant::now();
        if self.feed.is_none() {
            self.feed = subscribe(self.bus, &self.cfg.service).await;
        }
        let got = match self.feed.as_mut() {
            Some(feed) => feed
                .next_counted(self.cfg.feed_batch, wait.max(Duration::from_millis(1)))
                .await
                .map_err(Some),
            None => Err(None),
        };
        match got {
            Ok((items, backlog)) => {
                self.stats.bus_backlog.store(backlog, Ordering::Relaxed);
                self.set_bus_down(false, None);
                Received::Items(items)
            }
            Err(e) => {
                self.set_bus_down(true, e.as_ref());
                let pause = wait.min(DEGRADED_POLL).saturating_sub(asked.elapsed());
                tokio::time::sleep(pause).await;
                Received::BusDown
            }
        }
    }

    /// Records a change between deciding with the bus and from the log.
    fn set_bus_down(&mut self, down: bool, error: Option<&BusError>) {
        if down {
            self.stats.bus_errors.fetch_add(1, Ordering::Relaxed);
        }
        let first_answer = !down && !self.bus_answered;
        self.bus_answered |= !down;
        if down == self.bus_down && !first_answer {
            return;
        }
        self.bus_down = down;
        self.stats
            .bus_down
            .store(u64::from(down), Ordering::Relaxed);
        match error {
            // A feed binds in the background after a start: not a fault.
            Some(e @ BusError::Unbound { .. }) if down && !self.bus_answered => {
                info!(service = %self.cfg.service, error = %e, "bus not bound yet; deciding from the log")
            }
            Some(e) if down => {
                warn!(service = %self.cfg.service, error = %e, "bus failing; deciding from the log")
            }
            _ if down => {
                warn!(service = %self.cfg.service, "bus unreachable; deciding from the log")
            }
            _ => info!(service = %self.cfg.service, "bus answering"),
        }
    }

    /// Folds what the bus delivered; answers whether the log must be read
    /// (the bus failed or dropped messages).
    fn fold(&mut self, received: Received) -> bool {
        let items = match received {
            Received::Items(items) => items,
            Received::BusDown => return true,
        };
        if !items.is_empty() {
            self.last_heard = Instant::now();
        }
        let mut need_read = false;
        let mut folded = 0;
        let Stage {
            proj,
            decider,
            remote_parent,
            job_traces,
            stats,
            cfg,
            ..
        } = self;
        for item in items {
            match item {
                Incoming::Batch(b, trace) => {
                    if trace.traceparent.is_some() {
                        *remote_parent = trace.traceparent;
                    }
                    job_traces.learn(&b, &trace.jobs);
                    folded += proj.offer(b, &mut observer(job_traces, decider));
                }
                Incoming::Malformed(why) => {
                    // What it held may be missing: the log has it.
                    stats.malformed.fetch_add(1, Ordering::Relaxed);
                    warn!(service = %cfg.service, %why, "malformed message skipped");
                    need_read = true;
                }
                Incoming::Lagged => need_read = true,
            }
        }
        self.folded(folded);
        need_read
    }

    /// Reads the log: a page of its tail when asked or when the bus has
    /// been quiet for a tick, or just the missing range of a gap that
    /// waited long enough.
    async fn read_log(&mut self, need_read: bool) -> anyhow::Result<()> {
        let tick = self.cfg.tick;
        let quiet = self.last_heard.elapsed() >= tick && self.last_poll.elapsed() >= tick;
        let gap_due = self
            .proj
            .gap_since()
            .is_some_and(|t| t.elapsed() >= self.cfg.gap_wait);
        let upto = if need_read || quiet {
            // At most a page a poll: the bus, once it speaks again,
            // delivers the rest faster than the log reads back.
            self.last_poll = Instant::now();
            self.proj.seq().saturating_add(POLL_PAGE)
        } else if gap_due {
            // Only what is missing: reading to the end of a log that grows
            // as fast as it is read would starve deciding.
            self.proj.gap_end().unwrap_or(SEQ_MAX)
        } else {
            return Ok(());
        };
        self.stats.gap_reads.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let log = self.log;
        let Stage {
            proj,
            decider,
            job_traces,
            ..
        } = self;
        let folded = proj
            .catch_up(log, upto, &mut observer(job_traces, decider))
            .await?;
        self.stats.log_down.store(0, Ordering::Relaxed);
        if started.elapsed() > SLOW {
            warn!(service = %self.cfg.service, ms = started.elapsed().as_millis() as u64, folded, "slow read from the log");
        }
        self.folded(folded);
        Ok(())
    }

    fn folded(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        self.dirty = true;
        self.stats.folded.fetch_add(n as u64, Ordering::Relaxed);
        self.stats.seq.store(self.proj.seq(), Ordering::Relaxed);
        self.stats
            .superseded
            .store(self.proj.superseded(), Ordering::Relaxed);
    }

    /// Whether to decide now: never behind a known gap; otherwise on new
    /// input, a due timer, or a tick.
    fn should_decide(&self) -> bool {
        let due = self.decider.next_due().is_some_and(|d| d <= wall_clock());
        self.proj.gap_since().is_none()
            && (self.dirty || due || self.last_decide.elapsed() >= self.cfg.tick)
    }

    /// Decides once; appends the decisions under the lease's fence, then
    /// publishes them and folds them.
    async fn cycle(&mut self, leader: &Leader) -> anyhow::Result<Cycle> {
        self.dirty = false;
        self.last_decide = Instant::now();
        self.stats.cycles.fetch_add(1, Ordering::Relaxed);
        let span = info_span!("cycle", service = %self.cfg.service);
        crate::telemetry::set_remote_parent(&span, self.remote_parent.take().as_deref());
        let events = span.in_scope(|| self.decide());
        add_us(&self.stats.decide_us, self.last_decide);
        if events.is_empty() {
            return Ok(Cycle::Done);
        }
        // One span per job with a known trace, covering the append.
        let job_spans = self.job_traces.open_spans(&self.cfg.service, &events);
        let batch: Vec<NewEvent> = events.iter().cloned().map(NewEvent::new).collect();
        let appending = Instant::now();
        let appended = self
            .log
            .append(&batch, &leader.fence())
            .instrument(span.clone())
            .await;
        add_us(&self.stats.append_us, appending);
        let out = match appended {
            Ok(out) => out,
            Err(e) if is_fenced(&e) => {
                warn!(service = %self.cfg.service, error = %e, "append fenced off");
                return Ok(Cycle::Fenced);
            }
            // The decisions were not written (or the commit is unknown):
            // the next lead rebuilds from the log and decides again.
            Err(e) => return Err(e.into()),
        };
        let (Some(first), Some(last)) = (out.first_seq, out.last_seq) else {
            return Ok(Cycle::Done);
        };
        self.stats
            .appended
            .fetch_add(out.appended, Ordering::Relaxed);
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        let _ = self.stats.first_append_unix_ms.compare_exchange(
            0,
            wall_clock().0,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        debug!(service = %self.cfg.service, first, last, "appended");
        let jobs = job_spans.close(first, &mut self.job_traces);
        let batch = Arc::new(self.batch(first, events));
        span.in_scope(|| publish_in_background(self.bus, batch.clone(), jobs));
        let Stage {
            proj,
            decider,
            job_traces,
            ..
        } = self;
        let n = proj.offer(batch, &mut observer(job_traces, decider));
        self.folded(n);
        self.dirty = true;
        let us = self.last_decide.elapsed().as_micros() as u64;
        self.stats.cycle_us.fetch_add(us, Ordering::Relaxed);
        self.stats.cycle_hist.record(us);
        Ok(Cycle::Done)
    }

    /// The decider's events of this producer (others are dropped, loudly).
    fn decide(&mut self) -> Vec<Event> {
        let decided = self.decider.decide(self.proj.state(), wall_clock());
        self.stats.record_work(self.decider.work());
        let (events, foreign): (Vec<Event>, Vec<Event>) = decided
            .into_iter()
            .partition(|e| e.producer() == self.producer);
        for e in &foreign {
            error!(service = %self.cfg.service, kind = e.kind(), "decider emitted another producer's event; dropped");
        }
        events
    }

    fn batch(&self, first: u64, events: Vec<Event>) -> BatchV1 {
        BatchV1::new(producer_name(self.producer), self.epoch, first, events)
    }
}

/// Folds the whole log into a new projection; with the events of
/// `producer` after `published` (to relay) and the count folded.
async fn rebuild<D: Decider>(
    log: &Log,
    warm: Warm<D>,
    producer: Producer,
    published: u64,
    stats: &ServiceStats,
) -> anyhow::Result<(Projection, D, Vec<LoggedEvent>, usize)> {
    let started = Instant::now();
    let Warm {
        mut proj,
        mut decider,
        last_own,
    } = warm;
    // Own events inside a snapshot are read back only when the bus lacks
    // some of them; those folded now are noted as they go by.
    let mut unpublished = if published < last_own {
        own_events(log, producer, published, proj.seq()).await?
    } else {
        Vec::new()
    };
    let folded = {
        let mut obs = |s: &State, seq: u64, e: &Event, ok: bool| {
            if seq > published && e.producer() == producer {
                unpublished.push(LoggedEvent {
                    seq,
                    event: e.clone(),
                });
            }
            if ok {
                decider.observe(s, e);
            }
        };
        proj.catch_up(log, SEQ_MAX, &mut obs).await?
    };
    stats
        .fold_ms
        .store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
    Ok((proj, decider, unpublished, folded))
}

/// Folds what was committed since a hot standby's last read; with the
/// events of `producer` after `published` (read back from the log, and
/// only when the bus lacks some: the standby folded them already) and the
/// count folded.
async fn catch_up<D: Decider>(
    log: &Log,
    mut warm: Warm<D>,
    producer: Producer,
    published: u64,
    stats: &ServiceStats,
) -> anyhow::Result<(Projection, D, Vec<LoggedEvent>, usize)> {
    let started = Instant::now();
    let folded = warm.catch_up(log, SEQ_MAX).await?;
    stats
        .fold_ms
        .store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
    let unpublished = if published < warm.last_own {
        own_events(log, producer, published, warm.proj.seq()).await?
    } else {
        Vec::new()
    };
    let Warm { proj, decider, .. } = warm;
    Ok((proj, decider, unpublished, folded))
}

/// The events of `producer` in the log after `after` up to `upto`.
async fn own_events(
    log: &Log,
    producer: Producer,
    after: u64,
    upto: u64,
) -> anyhow::Result<Vec<LoggedEvent>> {
    let mut out = Vec::new();
    let mut at = after;
    while at < upto {
        let page = log.read_from(at, POLL_PAGE as usize).await?;
        let Some(last) = page.last().map(|le| le.seq) else {
            break;
        };
        out.extend(
            page.into_iter()
                .filter(|le| le.seq <= upto && le.event.producer() == producer),
        );
        at = last;
    }
    Ok(out)
}

/// Adds the time since `since` to a microsecond counter.
fn add_us(counter: &std::sync::atomic::AtomicU64, since: Instant) {
    counter.fetch_add(since.elapsed().as_micros() as u64, Ordering::Relaxed);
}

/// The feed, or `None` (logged) when the bus cannot give one now.
async fn subscribe(bus: &Bus, service: &str) -> Option<Feed> {
    match bus.feed(service).await {
        Ok(feed) => Some(feed),
        Err(e) => {
            warn!(service, error = %e, "no feed from the bus; reading the log");
            None
        }
    }
}

/// The last sequence of this producer on the bus; when the bus cannot
/// say, `u64::MAX` (relay nothing: followers read the log).
async fn last_published(bus: &Bus, producer: Producer, service: &str) -> u64 {
    match bus.last_published(producer_name(producer)).await {
        Ok(seq) => seq,
        Err(e) => {
            warn!(service, error = %e, "bus cannot say what was published; relaying nothing");
            u64::MAX
        }
    }
}

/// The outbox relay: publishes committed batches the bus never got. A
/// failure is logged; followers read those events from the log.
async fn relay(
    bus: &Bus,
    producer: Producer,
    epoch: u64,
    unpublished: Vec<LoggedEvent>,
    stats: &ServiceStats,
) {
    for (first, events) in runs(unpublished) {
        let batch = Arc::new(BatchV1::new(producer_name(producer), epoch, first, events));
        if let Err(e) = bus.publish(batch).await {
            warn!(error = %e, "relaying to the bus failed; followers will read the log");
            return;
        }
        stats.relayed.fetch_add(1, Ordering::Relaxed);
    }
}

/// What folding an event tells the decider and the jobs' trace contexts.
fn observer<'a, D: Decider>(
    job_traces: &'a mut JobContexts,
    decider: &'a mut D,
) -> impl FnMut(&State, u64, &Event, bool) + 'a {
    move |s, _seq, e, ok| {
        job_traces.observe(e);
        if ok {
            decider.observe(s, e);
        }
    }
}

/// Publishes in a task of its own, inside the current span (so the batch
/// carries the current trace context), with its jobs' trace contexts.
fn publish_in_background(bus: &Bus, batch: Arc<BatchV1>, jobs: JobTraces) {
    let bus = bus.clone();
    tokio::spawn(
        async move {
            if let Err(e) = bus.publish_traced(batch, jobs).await {
                // The log has the batch; followers read it from there.
                warn!(error = %e, "publish failed; followers will read the log");
            }
        }
        .instrument(Span::current()),
    );
}
