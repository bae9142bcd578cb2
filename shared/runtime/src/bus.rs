//! The bus as services see it: NATS JetStream in production, an in-process
//! broadcast channel in `gpusched dev`.
//!
//! Owns: [`Bus`] (connect, publish, subscribe, the outbox relay's
//! [`Bus::last_published`]), [`Feed`], the splitting of large batches, and
//! the trace context a message carries ([`MessageTrace`]: the publishing
//! span's `traceparent` and per-job pairs, on NATS in headers, in process
//! beside the batch).
//! Must never: be needed for a service to start or decide (the log is the
//! record), or wait on nats-server without a bound.
//!
//! The bus is the fast path only. Every batch on it names the log sequence
//! range it carries, so a follower puts batches back in log order and fills
//! whatever the bus lost or reordered from the log itself.
//!
//! # While NATS is down
//!
//! - [`Bus::connect_nats`] succeeds without a server (the client keeps
//!   reconnecting, every [`RECONNECT_DELAY_MAX`] at most); the streams are
//!   created when first needed (a publish that finds none, a feed's bind).
//! - [`Bus::feed`] and [`Bus::feed_ephemeral`] need no server: a feed binds
//!   on its first [`Feed::next`]. While it cannot bind, `next` waits out its
//!   `timeout` and returns `Err` (the caller reads the log); it never takes
//!   much more than `timeout` (scheduling plus [`ACK_BOUND`] at most).
//! - After the server is killed, a feed notices within about 2 s (missed
//!   heartbeats) or at once (disconnect), and once the server accepts
//!   connections again it re-binds within about a second, re-creating the
//!   stream and consumer if the server lost its store. Batches in flight
//!   during the outage may be lost to the feed; the log has them.
//! - [`Bus::publish`] returns `Err` at once while the client is
//!   disconnected, and within [`gpusched_bus::DEFAULT_PUBLISH_TIMEOUT`] per
//!   message when the server does not answer; it re-creates a missing
//!   stream. [`Bus::last_published`] returns `Err` (not 0), as fast.

use std::sync::Arc;
use std::time::Duration;

use gpusched_bus::async_nats;
use gpusched_bus::async_nats::jetstream::{self, stream::LastRawMessageErrorKind, ErrorCode};
use gpusched_bus::{
    bounded, ensure_stream, is_connected, wait_connected, BatchV1, BusError, ConsumerSpec,
    Envelope, JobTraces, Namespace, Publisher, StreamSubscriber,
};
use tokio::sync::broadcast;
use tracing::{info, warn};

/// Capacity of the in-process channel; a follower that falls further
/// behind reads the gap from the log.
const MEMORY_CAPACITY: usize = 16_384;

/// Longest pause between two attempts to reconnect to NATS.
pub const RECONNECT_DELAY_MAX: Duration = Duration::from_secs(1);

/// How long [`Bus::connect_nats`] waits for the first connection before it
/// leaves the streams to be created when first needed.
const CONNECT_GRACE: Duration = Duration::from_millis(500);

/// Bound on one NATS request made here (stream setup, last published).
const REQUEST_BOUND: Duration = Duration::from_secs(2);

/// Bound on acking what one [`Feed::next`] took (acks are buffered
/// publishes; this only bites while the connection is stuck).
pub const ACK_BOUND: Duration = Duration::from_millis(100);

/// How long the server keeps an ephemeral feed's consumer after its last
/// pull.
const EPHEMERAL_IDLE: Duration = Duration::from_secs(30);

/// Most events in one NATS message. An event is tens to hundreds of
/// bytes on the bus (a submission with its command line more); NATS refuses payloads over 1 MiB by default (a
/// 60,000-node registration is ~12 MiB).
pub const MAX_EVENTS_PER_MESSAGE: usize = 1024;

/// `batch` as consecutive batches of at most `max` events each.
pub fn split_batch(batch: &BatchV1, max: usize) -> Vec<BatchV1> {
    let max = max.max(1);
    if batch.events.len() <= max {
        return vec![batch.clone()];
    }
    batch
        .events
        .chunks(max)
        .enumerate()
        .map(|(i, events)| {
            let first_seq = batch.first_seq + (i * max) as u64;
            BatchV1 {
                correlation_id: batch.correlation_id.clone(),
                ..BatchV1::new(
                    batch.producer.clone(),
                    batch.epoch,
                    first_seq,
                    events.to_vec(),
                )
            }
        })
        .collect()
}

/// A handle to publish and subscribe.
#[derive(Clone, Debug)]
pub enum Bus {
    /// NATS JetStream.
    Nats(Box<NatsBus>),
    /// In-process broadcast (embedded mode).
    Memory(broadcast::Sender<(Arc<BatchV1>, MessageTrace)>),
}

/// The NATS side of a [`Bus`].
#[derive(Clone, Debug)]
pub struct NatsBus {
    /// The JetStream context.
    pub js: jetstream::Context,
    /// Subject and stream names.
    pub namespace: Namespace,
    /// Pipelined publisher.
    pub publisher: Publisher,
}

/// The trace context a message came with. Tracing only: nothing here may
/// change what a service decides.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MessageTrace {
    /// The W3C `traceparent` of the span that published it.
    pub traceparent: Option<String>,
    /// The trace context of the jobs whose events it holds, those that
    /// have one (well-formed pairs only).
    pub jobs: JobTraces,
}

/// What a feed delivered.
#[derive(Debug)]
pub enum Incoming {
    /// A decoded batch, with the trace context it came with.
    Batch(Arc<BatchV1>, MessageTrace),
    /// A message that could not be decoded (already terminated), and why.
    Malformed(String),
    /// The feed dropped messages; the follower must read the log.
    Lagged,
}

/// A subscription to every producer's batches.
#[derive(Debug)]
pub enum Feed {
    /// A JetStream pull consumer (durable or ephemeral), bound lazily and
    /// re-bound after faults.
    Nats(Box<StreamSubscriber>),
    /// An in-process receiver.
    Memory(broadcast::Receiver<(Arc<BatchV1>, MessageTrace)>),
}

impl Bus {
    /// Connects to NATS, or keeps trying in the background if it is down:
    /// succeeds without a server (fails only on a malformed URL). If the
    /// server answers within half a second, makes sure the event and
    /// command streams exist; otherwise they are made when first needed.
    pub async fn connect_nats(url: &str, namespace: Namespace) -> Result<Bus, BusError> {
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .reconnect_delay_callback(reconnect_delay)
            .connect(url)
            .await
            .map_err(|e| BusError::nats("connect", e))?;
        let js = jetstream::new(client);
        ensure_streams_if_up(&js, &namespace).await;
        let publisher = Publisher::new(js.clone(), namespace.clone());
        Ok(Bus::Nats(Box::new(NatsBus {
            js,
            namespace,
            publisher,
        })))
    }

    /// A fresh in-process bus.
    pub fn memory() -> Bus {
        Bus::Memory(broadcast::channel(MEMORY_CAPACITY).0)
    }

    /// Publishes one batch and waits until the bus has it. The current
    /// span's trace context goes with it (on NATS in the `traceparent`
    /// header), and a batch of more than [`MAX_EVENTS_PER_MESSAGE`] events
    /// goes out as consecutive messages of at most that many (each names
    /// its own sequence range), so that none exceeds the server's payload
    /// limit.
    pub async fn publish(&self, batch: Arc<BatchV1>) -> Result<(), BusError> {
        self.publish_traced(batch, JobTraces::default()).await
    }

    /// [`Bus::publish`], with the trace context of jobs whose events the
    /// batch holds (on NATS in the `gpusched-job-traces` header, each
    /// message of a split batch with the pairs of its own jobs).
    pub async fn publish_traced(
        &self,
        batch: Arc<BatchV1>,
        jobs: JobTraces,
    ) -> Result<(), BusError> {
        let traceparent = crate::telemetry::current_traceparent();
        match self {
            Bus::Nats(n) => {
                let parts = split_batch(&batch, MAX_EVENTS_PER_MESSAGE);
                let whole = parts.len() == 1;
                for part in parts {
                    let jobs = if whole {
                        jobs.clone()
                    } else {
                        jobs.for_events(&part.events)
                    };
                    n.publisher
                        .publish_with(&Envelope::V1(part), traceparent.as_deref(), &jobs)
                        .await?;
                }
                Ok(())
            }
            Bus::Memory(tx) => {
                // No receiver yet is not an error: the log has the batch.
                let _ = tx.send((batch, MessageTrace { traceparent, jobs }));
                Ok(())
            }
        }
    }

    /// Subscribes as `durable` (a service's name) to every producer. Needs
    /// no server: the feed binds on its first [`Feed::next`].
    pub async fn feed(&self, durable: &str) -> Result<Feed, BusError> {
        match self {
            Bus::Nats(n) => {
                let ns = &n.namespace;
                let spec = ConsumerSpec::durable(
                    &ns.evt_stream(),
                    vec![ns.evt_wildcard()],
                    durable,
                    &ns.evt_wildcard(),
                )?;
                let sub = StreamSubscriber::new(n.js.clone(), spec);
                Ok(Feed::Nats(Box::new(sub)))
            }
            Bus::Memory(tx) => Ok(Feed::Memory(tx.subscribe())),
        }
    }

    /// Subscribes to batches published from now on, with no durable state
    /// on the server (read-only followers such as the gateway's view).
    /// Needs no server; "now" is when the feed first binds (on its first
    /// [`Feed::next`], and again after the server lost the consumer).
    pub async fn feed_ephemeral(&self) -> Result<Feed, BusError> {
        match self {
            Bus::Nats(n) => {
                let ns = &n.namespace;
                let spec = ConsumerSpec::ephemeral(
                    &ns.evt_stream(),
                    vec![ns.evt_wildcard()],
                    &ns.evt_wildcard(),
                    EPHEMERAL_IDLE,
                );
                let sub = StreamSubscriber::new(n.js.clone(), spec);
                Ok(Feed::Nats(Box::new(sub)))
            }
            Bus::Memory(tx) => Ok(Feed::Memory(tx.subscribe())),
        }
    }

    /// The last sequence this producer's batches on the bus reach, for the
    /// outbox relay: `Ok(0)` only when the bus holds none of them (no
    /// message on the subject, or no stream at all); `Err` when NATS cannot
    /// say (down, timed out) or the last message does not decode. Bounded
    /// in time.
    pub async fn last_published(&self, producer: &str) -> Result<u64, BusError> {
        match self {
            Bus::Nats(n) => n.last_published(producer).await,
            Bus::Memory(_) => Ok(u64::MAX),
        }
    }
}

impl NatsBus {
    async fn last_published(&self, producer: &str) -> Result<u64, BusError> {
        let subject = self.namespace.evt_subject(producer)?;
        if !is_connected(&self.js.client()) {
            return Err(BusError::NotConnected {
                op: "last published",
            });
        }
        let stream = self
            .js
            .get_stream_no_info(self.namespace.evt_stream())
            .await
            .map_err(|e| BusError::nats("last published", e))?;
        let last = bounded("last published", REQUEST_BOUND, async {
            let got = stream.get_last_raw_message_by_subject(&subject).await;
            Ok(got)
        })
        .await?;
        let msg = match last {
            Ok(msg) => msg,
            Err(e) if nothing_published(e.kind()) => return Ok(0),
            Err(e) => return Err(BusError::nats("last published", e)),
        };
        match gpusched_bus::decode(&msg.payload)? {
            Envelope::V1(b) => Ok(b.last_seq),
        }
    }
}

/// Whether a failed "last message on the subject" means there is none:
/// the subject has no message, or the stream does not exist.
fn nothing_published(kind: LastRawMessageErrorKind) -> bool {
    match kind {
        LastRawMessageErrorKind::NoMessageFound => true,
        LastRawMessageErrorKind::JetStream(e) => e.error_code() == ErrorCode::STREAM_NOT_FOUND,
        _ => false,
    }
}

/// Pause before reconnect attempt `attempts` (counted from 1): none for the
/// first, then 100 ms doubling up to [`RECONNECT_DELAY_MAX`].
fn reconnect_delay(attempts: usize) -> Duration {
    if attempts <= 1 {
        return Duration::ZERO;
    }
    let ms = 50u64 << (attempts - 1).min(16);
    Duration::from_millis(ms).min(RECONNECT_DELAY_MAX)
}

/// Creates the event and command streams if the server answers within
/// [`CONNECT_GRACE`]; otherwise (or on failure) leaves them to be created
/// when first needed.
async fn ensure_streams_if_up(js: &jetstream::Context, ns: &Namespace) {
    if wait_connected(&js.client(), "connect", CONNECT_GRACE)
        .await
        .is_err()
    {
        info!("nats not reachable yet; the bus binds when it comes up");
        return;
    }
    let streams = [
        (ns.evt_stream(), ns.evt_wildcard()),
        (ns.cmd_stream(), ns.cmd_wildcard()),
    ];
    for (name, subjects) in streams {
        let ensure = async { ensure_stream(js, &name, vec![subjects]).await.map(drop) };
        if let Err(e) = bounded("ensure stream", REQUEST_BOUND, ensure).await {
            warn!(stream = %name, error = %e, "cannot create the stream yet; retried when needed");
        }
    }
}

impl Feed {
    /// Takes what is waiting (up to `max`), or waits up to `timeout` for
    /// something. Acknowledges NATS messages as it takes them: the log, not
    /// the consumer's position, is what a restarted service resumes from.
    ///
    /// Returns within about `timeout` whatever NATS does. `Err` means the
    /// feed is not bound now (NATS down, restarting, or the bind failing):
    /// the caller reads the log; the feed re-binds by itself. Cancel-safe
    /// up to the acks: a call dropped while acking loses what it took.
    pub async fn next(&mut self, max: usize, timeout: Duration) -> Result<Vec<Incoming>, BusError> {
        Ok(self.next_counted(max, timeout).await?.0)
    }

    /// [`Feed::next`], with the messages still waiting after what it took
    /// (the bus's backlog for this consumer; 0 when nothing came).
    pub async fn next_counted(
        &mut self,
        max: usize,
        timeout: Duration,
    ) -> Result<(Vec<Incoming>, u64), BusError> {
        match self {
            Feed::Nats(sub) => {
                let deliveries = sub.next_batch(max, timeout).await?;
                let backlog = deliveries.last().map_or(0, |d| d.pending);
                Ok((take_deliveries(deliveries).await, backlog))
            }
            Feed::Memory(rx) => {
                let mut out = Vec::new();
                let first = match tokio::time::timeout(timeout, rx.recv()).await {
                    Err(_) => return Ok((out, 0)),
                    Ok(r) => r,
                };
                let mut next = Some(first);
                while let Some(r) = next.take() {
                    match r {
                        Ok((b, trace)) => out.push(Incoming::Batch(b, trace)),
                        Err(broadcast::error::RecvError::Lagged(_)) => out.push(Incoming::Lagged),
                        Err(broadcast::error::RecvError::Closed) => return Ok((out, 0)),
                    }
                    if out.len() < max {
                        next = match rx.try_recv() {
                            Ok(b) => Some(Ok(b)),
                            Err(broadcast::error::TryRecvError::Lagged(n)) => {
                                Some(Err(broadcast::error::RecvError::Lagged(n)))
                            }
                            Err(_) => None,
                        };
                    }
                }
                Ok((out, rx.len() as u64))
            }
        }
    }
}

/// Turns deliveries into [`Incoming`] items and acks them (terminates
/// malformed ones) within [`ACK_BOUND`]. What was taken is returned even if
/// acking fails: unacked ones come again after the ack wait, and followers
/// drop repeats by sequence.
async fn take_deliveries(deliveries: Vec<gpusched_bus::Delivery>) -> Vec<Incoming> {
    let acked = bounded("ack", ACK_BOUND, async {
        for d in &deliveries {
            d.ack_nowait().await?;
        }
        Ok(())
    })
    .await;
    if let Err(e) = acked {
        warn!(error = %e, "acking bus messages failed; they may come again");
    }
    deliveries
        .into_iter()
        .map(|d| match d.envelope {
            Ok(Envelope::V1(b)) => Incoming::Batch(
                Arc::new(b),
                MessageTrace {
                    traceparent: d.traceparent,
                    jobs: d.job_traces,
                },
            ),
            Err(e) => Incoming::Malformed(format!("subject {}: {e}", d.subject)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_events::Event;

    #[test]
    fn reconnects_back_off_to_the_cap() {
        let delays: Vec<u64> = (1..=8)
            .map(|n| reconnect_delay(n).as_millis() as u64)
            .collect();
        assert_eq!(delays, vec![0, 100, 200, 400, 800, 1000, 1000, 1000]);
        assert_eq!(reconnect_delay(usize::MAX), RECONNECT_DELAY_MAX);
    }

    #[test]
    fn a_large_batch_is_split_into_consecutive_ranges() {
        let b = BatchV1 {
            producer: "agent".into(),
            epoch: 3,
            first_seq: 10,
            last_seq: 14,
            correlation_id: None,
            events: (0..5)
                .map(|_| Event::TopologyConfigured { levels: vec![] })
                .collect(),
        };
        let parts = split_batch(&b, 2);
        let ranges: Vec<(u64, u64, usize)> = parts
            .iter()
            .map(|p| (p.first_seq, p.last_seq, p.events.len()))
            .collect();
        assert_eq!(ranges, vec![(10, 11, 2), (12, 13, 2), (14, 14, 1)]);
        assert!(parts.iter().all(|p| p.epoch == 3 && p.producer == "agent"));
        assert_eq!(split_batch(&b, 5).len(), 1);
    }
}
