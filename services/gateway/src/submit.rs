//! The submission writer: turns submit requests into `JobSubmitted` events,
//! many per append.
//!
//! Owns: job ids (drawn from the log), idempotency (a repeated key returns
//! the job its first submission created, checked by the log in the same
//! transaction as the append), and the gateway's lease. Must never: reply
//! before the append committed, or publish before it.

use std::sync::Arc;
use std::time::Duration;

use gpusched_bus::BatchV1;
use gpusched_events::Event;
use gpusched_model::{JobId, JobSpec};
use gpusched_runtime::{wall_clock, Bus, Log};
use gpusched_store::{producer_name, Lease, NewEvent};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Requests taken into one append at most.
const MAX_BATCH: usize = 2048;

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
    /// Events written as given (cancellations, admin changes).
    Write(Vec<Event>),
}

struct Request {
    work: Work,
    key: Option<String>,
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

    /// Like [`Submitter::submit`], but answers [`SubmitError::Busy`] at
    /// once when the writer's queue is full (the HTTP path: 429).
    pub async fn try_submit(
        &self,
        spec: JobSpec,
        key: Option<String>,
    ) -> Result<Submitted, SubmitError> {
        self.send(Work::Submit(spec), key, false).await
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
        let req = Request { work, key, reply };
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

/// Starts the writer; it holds the `gateway/<partition>` lease until
/// `shutdown`.
pub fn start_writer(
    log: Log,
    bus: Bus,
    partition: String,
    holder: String,
    shutdown: CancellationToken,
) -> (Submitter, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(16_384);
    let task = tokio::spawn(writer(log, bus, partition, holder, rx, shutdown));
    (Submitter { tx }, task)
}

async fn take_lease(
    log: &Log,
    partition: &str,
    holder: &str,
    shutdown: &CancellationToken,
) -> Option<Lease> {
    loop {
        match log
            .acquire_lease("gateway", partition, holder, Duration::from_secs(10))
            .await
        {
            Ok(Some(l)) => return Some(l),
            Ok(None) => info!(partition, "gateway lease held elsewhere; waiting"),
            Err(e) => warn!(error = %e, "cannot reach the log for the gateway lease"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

async fn writer(
    log: Log,
    bus: Bus,
    partition: String,
    holder: String,
    mut rx: mpsc::Receiver<Request>,
    shutdown: CancellationToken,
) {
    let Some(mut lease) = take_lease(&log, &partition, &holder, &shutdown).await else {
        return;
    };
    let mut renewed = std::time::Instant::now();
    loop {
        let first = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = rx.recv() => match r { Some(r) => r, None => break },
            _ = tokio::time::sleep(Duration::from_secs(2)) => {
                renew(&log, &mut lease, &mut renewed, &partition, &holder, &shutdown).await;
                continue;
            }
        };
        let mut reqs = vec![first];
        while reqs.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(r) => reqs.push(r),
                Err(_) => break,
            }
        }
        if renewed.elapsed() >= Duration::from_secs(3) {
            renew(
                &log,
                &mut lease,
                &mut renewed,
                &partition,
                &holder,
                &shutdown,
            )
            .await;
        }
        write_batch(&log, &bus, &lease, reqs).await;
    }
    let _ = log.release_lease(&lease).await;
}

async fn renew(
    log: &Log,
    lease: &mut Lease,
    renewed: &mut std::time::Instant,
    partition: &str,
    holder: &str,
    shutdown: &CancellationToken,
) {
    match log.renew_lease(lease, Duration::from_secs(10)).await {
        Ok(l) => {
            *lease = l;
            *renewed = std::time::Instant::now();
        }
        Err(e) => {
            warn!(error = %e, "gateway lease lost; taking it again");
            if let Some(l) = take_lease(log, partition, holder, shutdown).await {
                *lease = l;
                *renewed = std::time::Instant::now();
            }
        }
    }
}

fn fail_all(reqs: Vec<Request>, why: &str) {
    for r in reqs {
        let _ = r.reply.send(Err(SubmitError::Unavailable(why.to_string())));
    }
}

async fn write_batch(log: &Log, bus: &Bus, lease: &Lease, reqs: Vec<Request>) {
    let submits = reqs
        .iter()
        .filter(|r| matches!(r.work, Work::Submit(_)))
        .count();
    let mut ids = match u32::try_from(submits) {
        Ok(0) => Vec::new(),
        Ok(n) => match log.allocate_job_ids(n).await {
            Ok(ids) if ids.len() == submits => ids,
            Ok(_) => return fail_all(reqs, "job id allocation came back short"),
            Err(e) => return fail_all(reqs, &e.to_string()),
        },
        Err(_) => return fail_all(reqs, "too many submissions in one batch"),
    }
    .into_iter();
    let now = wall_clock();
    // Each request's events, in order; a key goes on each of them (the
    // first with the key as given), so a repeated request writes nothing.
    let mut batch: Vec<NewEvent> = Vec::with_capacity(reqs.len());
    let mut spans: Vec<std::ops::Range<usize>> = Vec::with_capacity(reqs.len());
    for r in &reqs {
        let from = batch.len();
        let events = match &r.work {
            Work::Submit(spec) => vec![Event::JobSubmitted {
                job: JobId(ids.next().unwrap_or(0)),
                spec: spec.clone(),
                at: now,
            }],
            Work::Write(events) => events.clone(),
        };
        for (i, ev) in events.into_iter().enumerate() {
            let ne = NewEvent::new(ev);
            batch.push(match (&r.key, i) {
                (Some(k), 0) => ne.idempotency_key(k.clone()),
                (Some(k), i) => ne.idempotency_key(format!("{k}#{i}")),
                (None, _) => ne,
            });
        }
        spans.push(from..batch.len());
    }
    let out = match log.append(&batch, &lease.fence()).await {
        Ok(out) => out,
        Err(e) => return fail_all(reqs, &e.to_string()),
    };
    // Keys that were already in the log: answer with what they wrote.
    let dup_keys: Vec<String> = reqs
        .iter()
        .zip(&spans)
        .filter(|(_, sp)| sp.start < sp.end && out.seqs.get(sp.start).is_some_and(|s| s.is_none()))
        .filter_map(|(r, _)| r.key.clone())
        .collect();
    let earlier = if dup_keys.is_empty() {
        Default::default()
    } else {
        match log.events_by_keys(&dup_keys).await {
            Ok(m) => m,
            Err(e) => return fail_all(reqs, &e.to_string()),
        }
    };
    let mut written = Vec::new();
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
                written.extend(
                    seqs.iter()
                        .zip(&batch[span.clone()])
                        .filter_map(|(s, ne)| s.map(|s| (s, ne.event.clone()))),
                );
                Ok(Submitted {
                    job: first.and_then(Event::job).unwrap_or(JobId(0)),
                    created: true,
                    seq: seqs
                        .iter()
                        .rev()
                        .find_map(|s| *s)
                        .and_then(|s| u64::try_from(s).ok())
                        .unwrap_or(0),
                })
            }
            Some(None) => match r.key.as_ref().and_then(|k| earlier.get(k)) {
                Some(le) => match (&r.work, &le.event) {
                    (Work::Submit(spec), Event::JobSubmitted { job, spec: was, .. }) => {
                        if spec == was {
                            Ok(Submitted {
                                job: *job,
                                created: false,
                                seq: le.seq,
                            })
                        } else {
                            Err(SubmitError::KeyReused)
                        }
                    }
                    (Work::Write(evs), ev) if evs.first().map(Event::kind) == Some(ev.kind()) => {
                        Ok(Submitted {
                            job: ev.job().unwrap_or(JobId(0)),
                            created: false,
                            seq: le.seq,
                        })
                    }
                    _ => Err(SubmitError::KeyReused),
                },
                None => Err(SubmitError::Unavailable("duplicate key not found".into())),
            },
        };
        let _ = r.reply.send(reply);
    }
    publish_runs(bus, lease, written).await;
}

/// Publishes what was written, one batch per run of consecutive sequence
/// numbers from one producer.
async fn publish_runs(bus: &Bus, lease: &Lease, mut written: Vec<(i64, Event)>) {
    written.sort_by_key(|(s, _)| *s);
    let mut i = 0;
    while i < written.len() {
        let producer = written[i].1.producer();
        let first = written[i].0;
        let mut j = i + 1;
        while j < written.len()
            && written[j].0 == first + (j - i) as i64
            && written[j].1.producer() == producer
        {
            j += 1;
        }
        let events: Vec<Event> = written[i..j].iter().map(|(_, e)| e.clone()).collect();
        let batch = Arc::new(BatchV1 {
            producer: producer_name(producer).to_string(),
            epoch: u64::try_from(lease.epoch).unwrap_or(0),
            first_seq: u64::try_from(first).unwrap_or(0),
            last_seq: u64::try_from(first).unwrap_or(0) + (j - i) as u64 - 1,
            correlation_id: None,
            events,
        });
        if let Err(e) = bus.publish(batch).await {
            warn!(error = %e, "publish failed; followers will read the log");
        }
        i = j;
    }
}
