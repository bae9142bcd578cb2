//! The bus as services see it: NATS JetStream in production, an in-process
//! broadcast channel in `gpusched dev`.
//!
//! The bus is the fast path only. Every batch on it names the log sequence
//! range it carries, so a follower puts batches back in log order and fills
//! whatever the bus lost or reordered from the log itself.

use std::sync::Arc;
use std::time::Duration;

use gpusched_bus::async_nats::{self, jetstream};
use gpusched_bus::{ensure_stream, BatchV1, BusError, Envelope, Namespace, Publisher, Subscriber};
use tokio::sync::broadcast;

/// Capacity of the in-process channel; a follower that falls further
/// behind reads the gap from the log.
const MEMORY_CAPACITY: usize = 16_384;

/// Most events in one NATS message. A batch's JSON events are a few
/// hundred bytes each; NATS refuses payloads over 1 MiB by default (a
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
                producer: batch.producer.clone(),
                epoch: batch.epoch,
                first_seq,
                last_seq: first_seq + events.len() as u64 - 1,
                correlation_id: batch.correlation_id.clone(),
                events: events.to_vec(),
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
    Memory(broadcast::Sender<Arc<BatchV1>>),
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

/// What a feed delivered.
#[derive(Debug)]
pub enum Incoming {
    /// A decoded batch, with the W3C `traceparent` it came with (NATS
    /// header; never on the in-process bus).
    Batch(Arc<BatchV1>, Option<String>),
    /// A message that could not be decoded (already terminated), and why.
    Malformed(String),
    /// The feed dropped messages; the follower must read the log.
    Lagged,
}

/// A subscription to every producer's batches.
#[derive(Debug)]
pub enum Feed {
    /// A durable JetStream pull consumer.
    Nats(Box<Subscriber>),
    /// An in-process receiver.
    Memory(broadcast::Receiver<Arc<BatchV1>>),
}

impl Bus {
    /// Connects to NATS and makes sure the event and command streams exist.
    pub async fn connect_nats(url: &str, namespace: Namespace) -> Result<Bus, BusError> {
        let client = async_nats::connect(url)
            .await
            .map_err(|e| BusError::nats("connect", e))?;
        let js = jetstream::new(client);
        ensure_stream(&js, &namespace.evt_stream(), vec![namespace.evt_wildcard()]).await?;
        ensure_stream(&js, &namespace.cmd_stream(), vec![namespace.cmd_wildcard()]).await?;
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

    /// Publishes one batch and waits until the bus has it. On NATS the
    /// current span's trace context rides in the `traceparent` header, and
    /// a batch of more than [`MAX_EVENTS_PER_MESSAGE`] events goes out as
    /// consecutive messages of at most that many (each names its own
    /// sequence range), so that none exceeds the server's payload limit.
    pub async fn publish(&self, batch: Arc<BatchV1>) -> Result<(), BusError> {
        match self {
            Bus::Nats(n) => {
                let traceparent = crate::telemetry::current_traceparent();
                for part in split_batch(&batch, MAX_EVENTS_PER_MESSAGE) {
                    n.publisher
                        .publish(&Envelope::V1(part), traceparent.as_deref())
                        .await?;
                }
                Ok(())
            }
            Bus::Memory(tx) => {
                // No receiver yet is not an error: the log has the batch.
                let _ = tx.send(batch);
                Ok(())
            }
        }
    }

    /// Subscribes as `durable` (a service's name) to every producer.
    pub async fn feed(&self, durable: &str) -> Result<Feed, BusError> {
        match self {
            Bus::Nats(n) => {
                let (stream, filter) = (n.namespace.evt_stream(), n.namespace.evt_wildcard());
                let sub = Subscriber::durable(&n.js, &stream, durable, &filter).await?;
                Ok(Feed::Nats(Box::new(sub)))
            }
            Bus::Memory(tx) => Ok(Feed::Memory(tx.subscribe())),
        }
    }

    /// Subscribes to batches published from now on, with no durable state
    /// on the server (read-only followers such as the gateway's view).
    pub async fn feed_ephemeral(&self) -> Result<Feed, BusError> {
        match self {
            Bus::Nats(n) => {
                let (stream, filter) = (n.namespace.evt_stream(), n.namespace.evt_wildcard());
                let idle = Duration::from_secs(30);
                let sub = Subscriber::ephemeral(&n.js, &stream, &filter, idle).await?;
                Ok(Feed::Nats(Box::new(sub)))
            }
            Bus::Memory(tx) => Ok(Feed::Memory(tx.subscribe())),
        }
    }

    /// The last sequence this producer's batches on the bus reach (0: none),
    /// for the outbox relay.
    pub async fn last_published(&self, producer: &str) -> Result<u64, BusError> {
        match self {
            Bus::Nats(n) => {
                let stream =
                    n.js.get_stream(n.namespace.evt_stream())
                        .await
                        .map_err(|e| BusError::nats("get stream", e))?;
                let subject = n.namespace.evt_subject(producer)?;
                match stream.get_last_raw_message_by_subject(&subject).await {
                    Ok(msg) => match gpusched_bus::decode(&msg.payload) {
                        Ok(Envelope::V1(b)) => Ok(b.last_seq),
                        Err(_) => Ok(0),
                    },
                    // No message on the subject yet.
                    Err(_) => Ok(0),
                }
            }
            Bus::Memory(_) => Ok(u64::MAX),
        }
    }
}

impl Feed {
    /// Takes what is waiting (up to `max`), or waits up to `timeout` for
    /// something. Acknowledges NATS messages as it takes them: the log, not
    /// the consumer's position, is what a restarted service resumes from.
    pub async fn next(&mut self, max: usize, timeout: Duration) -> Result<Vec<Incoming>, BusError> {
        match self {
            Feed::Nats(sub) => {
                let deliveries = sub.next_batch(max, timeout).await?;
                let mut out = Vec::with_capacity(deliveries.len());
                for d in deliveries {
                    match d.envelope {
                        Ok(Envelope::V1(ref b)) => {
                            let b = Arc::new(b.clone());
                            d.ack_nowait().await?;
                            out.push(Incoming::Batch(b, d.traceparent.clone()));
                        }
                        Err(ref e) => {
                            let why = format!("subject {}: {e}", d.subject);
                            d.ack_nowait().await?;
                            out.push(Incoming::Malformed(why));
                        }
                    }
                }
                Ok(out)
            }
            Feed::Memory(rx) => {
                let mut out = Vec::new();
                let first = match tokio::time::timeout(timeout, rx.recv()).await {
                    Err(_) => return Ok(out),
                    Ok(r) => r,
                };
                let mut next = Some(first);
                while let Some(r) = next.take() {
                    match r {
                        Ok(b) => out.push(Incoming::Batch(b, None)),
                        Err(broadcast::error::RecvError::Lagged(_)) => out.push(Incoming::Lagged),
                        Err(broadcast::error::RecvError::Closed) => return Ok(out),
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
                Ok(out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_events::Event;

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
