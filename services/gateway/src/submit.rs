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
use gpusched_events::{Event, Producer};
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
}

struct Request {
    spec: JobSpec,
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
    /// scoped (e.g. by tenant).
    pub async fn submit(
        &self,
        spec: JobSpec,
        key: Option<String>,
    ) -> Result<Submitted, SubmitError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request { spec, key, reply })
            .await
            .map_err(|_| SubmitError::Closed)?;
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
    let n = u32::try_from(reqs.len()).unwrap_or(u32::MAX);
    let ids = match log.allocate_job_ids(n).await {
        Ok(ids) if ids.len() == reqs.len() => ids,
        Ok(_) => return fail_all(reqs, "job id allocation came back short"),
        Err(e) => return fail_all(reqs, &e.to_string()),
    };
    let now = wall_clock();
    let batch: Vec<NewEvent> = reqs
        .iter()
        .zip(&ids)
        .map(|(r, id)| {
            let ev = NewEvent::new(Event::JobSubmitted {
                job: JobId(*id),
                spec: r.spec.clone(),
                at: now,
            });
            match &r.key {
                Some(k) => ev.idempotency_key(k.clone()),
                None => ev,
            }
        })
        .collect();
    let out = match log.append(&batch, &lease.fence()).await {
        Ok(out) => out,
        Err(e) => return fail_all(reqs, &e.to_string()),
    };
    // Keys that were already in the log: answer with their first job.
    let dup_keys: Vec<String> = reqs
        .iter()
        .zip(&out.seqs)
        .filter(|(_, s)| s.is_none())
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
    for ((r, id), (seq, ne)) in reqs.into_iter().zip(ids).zip(out.seqs.iter().zip(batch)) {
        let reply = match seq {
            Some(seq) => {
                written.push(ne.event);
                Ok(Submitted {
                    job: JobId(id),
                    created: true,
                    seq: u64::try_from(*seq).unwrap_or(0),
                })
            }
            None => match r.key.as_ref().and_then(|k| earlier.get(k)) {
                Some(le) => match le.event.job() {
                    Some(job) => Ok(Submitted {
                        job,
                        created: false,
                        seq: le.seq,
                    }),
                    None => Err(SubmitError::Unavailable(
                        "idempotency key names an event that is not a submission".into(),
                    )),
                },
                None => Err(SubmitError::Unavailable("duplicate key not found".into())),
            },
        };
        let _ = r.reply.send(reply);
    }
    if let (Some(first), Some(last)) = (out.first_seq, out.last_seq) {
        let batch = Arc::new(BatchV1 {
            producer: producer_name(Producer::Gateway).to_string(),
            epoch: u64::try_from(lease.epoch).unwrap_or(0),
            first_seq: u64::try_from(first).unwrap_or(0),
            last_seq: u64::try_from(last).unwrap_or(0),
            correlation_id: None,
            events: written,
        });
        if let Err(e) = bus.publish(batch).await {
            warn!(error = %e, "publish failed; followers will read the log");
        }
    }
}
