//! The submission writer: turns submit requests into `JobSubmitted` events,
//! many per append.
//!
//! Owns: job ids (drawn from the log), idempotency (a repeated key returns
//! the job its first submission created, checked by the log in the same
//! transaction as the append), the gateway's lease, and the start of each
//! job's trace: the `submit` span of the HTTP handlers ([`submit_span`],
//! a child of the request's W3C `traceparent` header when valid), whose
//! context each request takes to the writer and the writer publishes
//! beside the job's events (the `gpusched-job-traces` header) for the
//! services to continue. While the log is unreachable (or the lease cannot
//! be had) every request is answered `Unavailable` quickly, never left
//! waiting. Must never: reply before the append committed, or publish
//! before it; or let a trace context change what is written.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use gpusched_bus::{BatchV1, JobTraces};
use gpusched_events::Event;
use gpusched_model::{ArraySet, ArrayTask, JobId, JobSpec, Timestamp};
use gpusched_runtime::{
    add_remote_link, current_traceparent, is_fenced, set_remote_parent, wall_clock, Bus, Leader,
    LeaseSpec, Log, LoggedEvent,
};
use gpusched_store::{producer_name, Fence, NewEvent};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{field, info_span, warn, Instrument, Span};

/// Events taken into one append: requests are added until it is reached
/// (an array's tasks count one each).
const MAX_BATCH: usize = 2048;

/// Most requests' traces one append's span links to (beyond the one it
/// is a child of).
const MAX_LINKS: usize = 128;

/// The span a submit handler runs in: `submit`, a child of the request's
/// W3C `traceparent` header when it has a valid one (otherwise the root of
/// a new trace). Its `job_id` (or `jobs`) is recorded once known. The
/// writer takes the trace context of whatever span a request is sent from.
pub(crate) fn submit_span(headers: &HeaderMap) -> Span {
    let span = info_span!(
        "submit",
        service = "gateway",
        job_id = field::Empty,
        jobs = field::Empty,
    );
    let traceparent = headers.get("traceparent").and_then(|v| v.to_str().ok());
    set_remote_parent(&span, traceparent.map(str::trim));
    span
}

/// A submission's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Submitted {
    /// The job.
    pub job: JobId,
    /// False when the idempotency key was seen before and this is the job
    /// that first submission created.
    pub created: bool,
    /// Log sequence of its `JobSubmitted`.
    pub seq: u64,
}

/// Why a submission was not written.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The log refused or could not be reached; nothing was written.
    #[error("the event log is unavailable: {0}")]
    Unavailable(String),
    /// The writer has stopped (shutting down).
    #[error("the gateway is shutting down")]
    Closed,
    /// The writer's queue is full; nothing was written. Retry later.
    #[error("too many requests in flight; retry shortly")]
    Busy,
    /// The idempotency key was used before for a different request.
    #[error("Idempotency-Key was used before for a different request")]
    KeyReused,
}

/// What one request asks the writer to append.
enum Work {
    /// A new job: its id is drawn from the log.
    Submit(JobSpec),
    /// A job array: one job per index, ids drawn from the log; the first
    /// task's id names the array.
    SubmitArray(JobSpec, ArraySet),
    /// Events written as given (cancellations, admin changes).
    Write(Vec<Event>),
}

impl Work {
    /// Job ids it needs drawn.
    fn ids_needed(&self) -> usize {
        match self {
            Work::Submit(_) => 1,
            Work::SubmitArray(_, set) => set.indices.len(),
            Work::Write(_) => 0,
        }
    }

    /// Events it appends.
    fn events(&self) -> usize {
        match self {
            Work::Write(events) => events.len(),
            _ => self.ids_needed(),
        }
    }

    /// Its events, drawing job ids from `ids`.
    fn to_events(&self, ids: &mut impl Iterator<Item = u64>, now: Timestamp) -> Vec<Event> {
        match self {
            Work::Submit(spec) => vec![Event::JobSubmitted {
                job: JobId(ids.next().unwrap_or(0)),
                spec: spec.clone(),
                at: now,
            }],
            Work::SubmitArray(spec, set) => {
                let jobs: Vec<u64> = ids.take(set.indices.len()).collect();
                let array = jobs.first().copied().unwrap_or(0);
                jobs.into_iter()
                    .zip(&set.indices)
                    .map(|(job, &index)| Event::JobSubmitted {
                        job: JobId(job),
                        spec: JobSpec {
                            array: Some(ArrayTask {
                                array,
                                index,
                                max_running: set.max_running,
                            }),
                            ..spec.clone()
                        },
                        at: now,
                    })
                    .collect()
            }
            Work::Write(events) => events.clone(),
        }
    }

    /// The keys to look up when this request's `key` was seen before: its
    /// first event's, and for an array its last task's and the one after.
    fn keys_to_check(&self, key: &str) -> Vec<String> {
        match self {
            Work::SubmitArray(_, set) if set.indices.len() > 1 => vec![
                key.to_string(),
                format!("{key}#{}", set.indices.len() - 1),
                format!("{key}#{}", set.indices.len()),
            ],
            _ => vec![key.to_string()],
        }
    }

    /// Whether what the log holds under `key` (looked up by
    /// [`Work::keys_to_check`]) is what this request would have written
    /// first (a repeat, not a reused key). An array repeats when its spec,
    /// its limit, its task count and its first and last indices are the
    /// same.
    fn repeats(&self, key: &str, earlier: &HashMap<String, LoggedEvent>) -> bool {
        let Some(first) = earlier.get(key).map(|le| &le.event) else {
            return false;
        };
        let index_of = |k: &str| match earlier.get(k).map(|le| &le.event) {
            Some(Event::JobSubmitted { spec, .. }) => spec.array.map(|a| a.index),
            _ => None,
        };
        match (self, first) {
            (Work::Submit(spec), Event::JobSubmitted { spec: was, .. }) => spec == was,
            (Work::SubmitArray(spec, set), Event::JobSubmitted { spec: was, .. }) => {
                let (indices, n) = (&set.indices, set.indices.len());
                let last_key = if n > 1 {
                    format!("{key}#{}", n - 1)
                } else {
                    key.to_string()
                };
                *spec
                    == (JobSpec {
                        array: None,
                        ..was.clone()
                    })
                    && was.array.map(|a| a.max_running) == Some(set.max_running)
                    && index_of(key) == indices.first().copied()
                    && index_of(&last_key) == indices.last().copied()
                    && !earlier.contains_key(&format!("{key}#{n}"))
            }
            (Work::Write(evs), ev) => evs.first().map(Event::kind) == Some(ev.kind()),
            _ => false,
        }
    }
}

struct Request {
    work: Work,
    key: Option<String>,
    /// The W3C `traceparent` of the span it was sent from, if any: its
    /// jobs' traces continue it.
    trace: Option<String>,
    reply: oneshot::Sender<Result<Submitted, SubmitError>>,
}

/// A handle to submit jobs through the writer (cheap to clone).
#[derive(Clone, Debug)]
pub struct Submitter {
    tx: mpsc::Sender<Request>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request").field("key", &self.key).finish()
    }
}

impl Submitter {
    /// Submits one job; `key` is the client's idempotency key, already
    /// scoped (e.g. by tenant). Waits for room in the writer's queue.
    pub async fn submit(
        &self,
        spec: JobSpec,
        key: Option<String>,
    ) -> Result<Submitted, SubmitError> {
        self.send(Work::Submit(spec), key, true).await
    }

    /// Submits a job array: one job per index (the spec with its
    /// [`ArrayTask`]), all in one append. The reply's `job` is the first
    /// task's, which names the array; its `seq` is the last task's. Answers
    /// [`SubmitError::Busy`] at once when the writer's queue is full.
    pub async fn try_submit_array(
        &self,
        spec: JobSpec,
        set: ArraySet,
        key: Option<String>,
    ) -> Result<Submitted, SubmitError> {
        self.send(Work::SubmitArray(spec, set), key, false).await
    }

    /// Like [`Submitter::submit`], but answers [`SubmitError::Busy`] at
    /// once when the writer's queue is full (the HTTP path: 429).
    pub async fn try_submit(
        &self,
        spec: JobSpec,
        key: Option<String>,
    ) -> Result<Submitted, SubmitError> {
        self.send(Work::Submit(spec), key, false).await
    }

    /// Submits many jobs at once: they go to the writer together, so they
    /// share its appends (a thousand jobs are one or two transactions).
    /// One result per job, in order; a job that finds the writer's queue
    /// full is [`SubmitError::Busy`], the others are written all the same.
    pub async fn submit_many(
        &self,
        jobs: Vec<(JobSpec, Option<String>)>,
    ) -> Vec<Result<Submitted, SubmitError>> {
        let trace = current_traceparent();
        let queued: Vec<_> = jobs
            .into_iter()
            .map(|(spec, key)| {
                let (reply, rx) = oneshot::channel();
                let req = Request {
                    work: Work::Submit(spec),
                    key,
                    trace: trace.clone(),
                    reply,
                };
                self.tx.try_send(req).map(|()| rx).map_err(|e| match e {
                    mpsc::error::TrySendError::Full(_) => SubmitError::Busy,
                    mpsc::error::TrySendError::Closed(_) => SubmitError::Closed,
                })
            })
            .collect();
        let mut out = Vec::with_capacity(queued.len());
        for q in queued {
            out.push(match q {
                Ok(rx) => rx.await.unwrap_or(Err(SubmitError::Closed)),
                Err(e) => Err(e),
            });
        }
        out
    }

    /// Appends `events` as one unit, in the same append as other requests
    /// of the moment. The reply's `seq` is that of the last event; `job` is
    /// the first event's job, if any. With a `key` seen before, nothing is
    /// written and `created` is false.
    pub async fn write(
        &self,
        events: Vec<Event>,
        key: Option<String>,
    ) -> Result<Submitted, SubmitError> {
        self.send(Work::Write(events), key, false).await
    }

    async fn send(
        &self,
        work: Work,
        key: Option<String>,
        wait: bool,
    ) -> Result<Submitted, SubmitError> {
        let (reply, rx) = oneshot::channel();
        let req = Request {
            work,
            key,
            trace: current_traceparent(),
            reply,
        };
        if wait {
            self.tx.send(req).await.map_err(|_| SubmitError::Closed)?;
        } else {
            self.tx.try_send(req).map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => SubmitError::Busy,
                mpsc::error::TrySendError::Closed(_) => SubmitError::Closed,
            })?;
        }
        rx.await.map_err(|_| SubmitError::Closed)?
    }
}

/// Starts the writer; it holds the `gateway/<partition>` lease (time to
/// live `lease_ttl`) until `shutdown`.
pub fn start_writer(
    log: Log,
    bus: Bus,
    spec: LeaseSpec,
    shutdown: CancellationToken,
) -> (Submitter, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(16_384);
    let task = tokio::spawn(writer(Writer::new(log, bus, spec), rx, shutdown));
    (Submitter { tx }, task)
}

/// After the log failed a write, requests are answered 503 at once for
/// this long instead of each waiting out a connection timeout; the first
/// batch after it tries the log again.
const LOG_DOWN_HOLD: Duration = Duration::from_millis(500);

/// The writer's lease and the log's recent health.
struct Writer {
    log: Log,
    bus: Bus,
    spec: LeaseSpec,
    leader: Option<Leader>,
    log_failed_at: Option<Instant>,
}

impl Writer {
    fn new(log: Log, bus: Bus, spec: LeaseSpec) -> Self {
        Writer {
            log,
            bus,
            spec,
            leader: None,
            log_failed_at: None,
        }
    }

    /// Renews the lease when due; forgets it when another epoch has it.
    async fn keep(&mut self) {
        if let Some(l) = self.leader.as_mut() {
            if l.keep().await.is_err() {
                warn!("gateway lease lost; taking it again");
                if let Some(l) = self.leader.take() {
                    l.abandon();
                }
            }
        }
    }

    /// The fence to write under, taking the lease if it is not held.
    async fn fence(&mut self) -> Result<Fence, String> {
        self.keep().await;
        if self.leader.is_none() {
            self.leader = match Leader::try_take(&self.log, &self.spec).await {
                Ok(Some(l)) => Some(l),
                Ok(None) => {
                    return Err(format!(
                        "the lease of gateway instance {} is still held by an earlier process; retry shortly",
                        self.spec.partition
                    ))
                }
                Err(e) => return Err(e.to_string()),
            };
        }
        self.leader
            .as_ref()
            .map(Leader::fence)
            .ok_or_else(|| "no gateway lease".to_string())
    }

    /// Writes one batch of requests, or answers them all 503 while the log
    /// is known to be down or the lease cannot be had.
    async fn handle(&mut self, reqs: Vec<Request>) {
        if self
            .log_failed_at
            .is_some_and(|t| t.elapsed() < LOG_DOWN_HOLD)
        {
            return fail_all(reqs, "the event log is unreachable; retry shortly");
        }
        let fence = match self.fence().await {
            Ok(f) => f,
            Err(why) => {
                self.log_failed_at = Some(Instant::now());
                return fail_all(reqs, &why);
            }
        };
        let span = write_span(&reqs);
        match write_batch(&self.log, &self.bus, &fence, reqs)
            .instrument(span)
            .await
        {
            Written::Ok => self.log_failed_at = None,
            Written::LogFailed => self.log_failed_at = Some(Instant::now()),
            Written::Fenced => {
                if let Some(l) = self.leader.take() {
                    l.abandon();
                }
            }
        }
    }

    async fn release(mut self) {
        if let Some(l) = self.leader.take() {
            l.release().await;
        }
    }
}

async fn writer(mut w: Writer, mut rx: mpsc::Receiver<Request>, shutdown: CancellationToken) {
    let idle = w.spec.ttl / 3;
    loop {
        let first = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = rx.recv() => match r { Some(r) => r, None => break },
            _ = tokio::time::sleep(idle) => {
                w.keep().await;
                continue;
            }
        };
        let mut events = first.work.events();
        let mut reqs = vec![first];
        while events < MAX_BATCH {
            match rx.try_recv() {
                Ok(r) => {
                    events += r.work.events();
                    reqs.push(r);
                }
                Err(_) => break,
            }
        }
        w.handle(reqs).await;
    }
    w.release().await;
}

/// The span of one append of requests: a child of the first traced
/// request's span, linked to (some of) the others'.
fn write_span(reqs: &[Request]) -> Span {
    let span = info_span!(
        "write submissions",
        service = "gateway",
        requests = reqs.len()
    );
    let mut traced = reqs.iter().filter_map(|r| r.trace.as_deref());
    set_remote_parent(&span, traced.next());
    for tp in traced.take(MAX_LINKS) {
        add_remote_link(&span, Some(tp));
    }
    span
}

fn fail_all(reqs: Vec<Request>, why: &str) {
    for r in reqs {
        let _ = r.reply.send(Err(SubmitError::Unavailable(why.to_string())));
    }
}

/// How a batch went.
enum Written {
    /// Written (or answered as a repeat), and answered.
    Ok,
    /// The log could not be reached; every request was answered 503.
    LogFailed,
    /// The lease moved on; every request was answered 503.
    Fenced,
}

/// Answers, without writing them, the keyed arrays whose key the log holds
/// already (a repeat, or a reused key): an array's later tasks have keys
/// of their own, so a different array sent with the key must not reach the
/// append, where those would be new. Returns the requests still to write,
/// or `None` when the log could not be read (every request is answered).
async fn answer_known_arrays(log: &Log, reqs: Vec<Request>) -> Option<Vec<Request>> {
    let keys: Vec<String> = reqs
        .iter()
        .filter(|r| matches!(r.work, Work::SubmitArray(..)))
        .filter_map(|r| r.key.as_deref().map(|k| r.work.keys_to_check(k)))
        .flatten()
        .collect();
    if keys.is_empty() {
        return Some(reqs);
    }
    let earlier = match log.events_by_keys(&keys).await {
        Ok(m) => m,
        Err(e) => {
            fail_all(reqs, &e.to_string());
            return None;
        }
    };
    let mut rest = Vec::with_capacity(reqs.len());
    for r in reqs {
        let known = match (&r.work, r.key.as_deref()) {
            (Work::SubmitArray(..), Some(k)) => earlier.get(k).map(|le| (k, le)),
            _ => None,
        };
        match known {
            Some((k, le)) => {
                let reply = if r.work.repeats(k, &earlier) {
                    Ok(Submitted {
                        job: le.event.job().unwrap_or(JobId(0)),
                        created: false,
                        seq: le.seq,
                    })
                } else {
                    Err(SubmitError::KeyReused)
                };
                let _ = r.reply.send(reply);
            }
            None => rest.push(r),
        }
    }
    Some(rest)
}

async fn write_batch(log: &Log, bus: &Bus, fence: &Fence, reqs: Vec<Request>) -> Written {
    let Some(reqs) = answer_known_arrays(log, reqs).await else {
        return Written::LogFailed;
    };
    if reqs.is_empty() {
        return Written::Ok;
    }
    let submits: usize = reqs.iter().map(|r| r.work.ids_needed()).sum();
    let mut ids = match u32::try_from(submits) {
        Ok(0) => Vec::new(),
        Ok(n) => match log.allocate_job_ids(n).await {
            Ok(ids) if ids.len() == submits => ids,
            Ok(_) => {
                fail_all(reqs, "job id allocation came back short");
                return Written::LogFailed;
            }
            Err(e) => {
                fail_all(reqs, &e.to_string());
                return Written::LogFailed;
            }
        },
        Err(_) => {
            fail_all(reqs, "too many submissions in one batch");
            return Written::Ok;
        }
    }
    .into_iter();
    let now = wall_clock();
    // Each request's events, in order; a key goes on each of them (the
    // first with the key as given), so a repeated request writes nothing.
    let mut batch: Vec<NewEvent> = Vec::with_capacity(reqs.len());
    let mut spans: Vec<std::ops::Range<usize>> = Vec::with_capacity(reqs.len());
    for r in &reqs {
        let from = batch.len();
        for (i, ev) in r.work.to_events(&mut ids, now).into_iter().enumerate() {
            let ne = NewEvent::new(ev);
            batch.push(match (&r.key, i) {
                (Some(k), 0) => ne.idempotency_key(k.clone()),
                (Some(k), i) => ne.idempotency_key(format!("{k}#{i}")),
                (None, _) => ne,
            });
        }
        spans.push(from..batch.len());
    }
    let out = match log.append(&batch, fence).await {
        Ok(out) => out,
        Err(e) => {
            fail_all(reqs, &e.to_string());
            return if is_fenced(&e) {
                Written::Fenced
            } else {
                Written::LogFailed
            };
        }
    };
    // Keys that were already in the log: answer with what they wrote.
    let dup_keys: Vec<String> = reqs
        .iter()
        .zip(&spans)
        .filter(|(_, sp)| sp.start < sp.end && out.seqs.get(sp.start).is_some_and(|s| s.is_none()))
        .filter_map(|(r, _)| r.key.as_deref().map(|k| r.work.keys_to_check(k)))
        .flatten()
        .collect();
    let earlier = if dup_keys.is_empty() {
        Default::default()
    } else {
        match log.events_by_keys(&dup_keys).await {
            Ok(m) => m,
            Err(e) => {
                fail_all(reqs, &e.to_string());
                return Written::LogFailed;
            }
        }
    };
    let mut written = Vec::new();
    // The trace each written job continues: its request's.
    let mut traces = JobTraces::new();
    for (r, span) in reqs.into_iter().zip(spans) {
        let first = batch.get(span.start).map(|ne| &ne.event);
        let seqs = &out.seqs[span.clone()];
        let reply = match seqs.first() {
            None => Ok(Submitted {
                job: JobId(0),
                created: false,
                seq: 0,
            }),
            Some(Some(_)) => {
                let from = written.len();
                written.extend(
                    seqs.iter()
                        .zip(&batch[span.clone()])
                        .filter_map(|(s, ne)| s.map(|s| (s, ne.event.clone()))),
                );
                if let Some(tp) = r.trace.as_deref() {
                    for job in written[from..].iter().filter_map(|(_, e)| e.job()) {
                        traces.insert(job, tp);
                    }
                }
                Ok(Submitted {
                    job: first.and_then(Event::job).unwrap_or(JobId(0)),
                    created: true,
                    seq: seqs.iter().rev().find_map(|s| *s).unwrap_or(0),
                })
            }
            Some(None) => match r.key.as_deref().and_then(|k| Some((k, earlier.get(k)?))) {
                Some((k, le)) if r.work.repeats(k, &earlier) => Ok(Submitted {
                    job: le.event.job().unwrap_or(JobId(0)),
                    created: false,
                    seq: le.seq,
                }),
                Some(_) => Err(SubmitError::KeyReused),
                None => Err(SubmitError::Unavailable("duplicate key not found".into())),
            },
        };
        let _ = r.reply.send(reply);
    }
    // The log has it; the bus is only the fast path, so a slow or failing
    // bus never holds up the next write. The publish stays in this append's
    // span (its messages carry that trace context).
    let (bus, epoch) = (bus.clone(), fence.epoch);
    tokio::spawn(
        async move { publish_runs(&bus, epoch, written, &traces).await }
            .instrument(Span::current()),
    );
    Written::Ok
}

/// Publishes what was written, one batch per run of consecutive sequence
/// numbers from one producer, each with its jobs' trace contexts.
async fn publish_runs(bus: &Bus, epoch: u64, mut written: Vec<(u64, Event)>, traces: &JobTraces) {
    written.sort_by_key(|(s, _)| *s);
    let mut i = 0;
    while i < written.len() {
        let producer = written[i].1.producer();
        let first = written[i].0;
        let mut j = i + 1;
        while j < written.len()
            && written[j].0 == first + (j - i) as u64
            && written[j].1.producer() == producer
        {
            j += 1;
        }
        let events: Vec<Event> = written[i..j].iter().map(|(_, e)| e.clone()).collect();
        let batch = Arc::new(BatchV1::new(producer_name(producer), epoch, first, events));
        let jobs = traces.for_events(&batch.events);
        if let Err(e) = bus.publish_traced(batch, jobs).await {
            warn!(error = %e, "publish failed; followers will read the log");
        }
        i = j;
    }
}
