//! Pipelined publishing of envelopes.
//!
//! Owns: [`Publisher`]. Must never: publish without the idempotency key
//! (`Nats-Msg-Id`), or hold more than its bound of unacknowledged publishes.

use std::collections::VecDeque;

use async_nats::jetstream::{self, context::PublishAckFuture, message::PublishMessage};
use bytes::Bytes;

use crate::{encode, msg_id, BusError, Envelope, Namespace};

/// Default bound on publishes awaiting their ack (below async-nats' own
/// 5,000).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 4096;

/// The W3C trace-context header carried when given.
pub const TRACEPARENT: &str = "traceparent";

/// What JetStream said about one published envelope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublishOutcome {
    /// Sequence number in the stream (of the original, for a duplicate).
    pub stream_seq: u64,
    /// JetStream dropped it as a duplicate within the dedup window.
    pub duplicate: bool,
}

/// Publishes envelopes to `<root>.evt.<producer>`, many in flight at once.
#[derive(Clone, Debug)]
pub struct Publisher {
    js: jetstream::Context,
    namespace: Namespace,
    max_in_flight: usize,
}

impl Publisher {
    /// A publisher in this namespace with [`DEFAULT_MAX_IN_FLIGHT`].
    pub fn new(js: jetstream::Context, namespace: Namespace) -> Self {
        Publisher {
            js,
            namespace,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        }
    }

    /// Sets the bound on unacknowledged publishes (at least 1).
    pub fn with_max_in_flight(mut self, max_in_flight: usize) -> Self {
        self.max_in_flight = max_in_flight.max(1);
        self
    }

    /// Publishes one envelope and awaits its ack.
    pub async fn publish(
        &self,
        envelope: &Envelope,
        traceparent: Option<&str>,
    ) -> Result<PublishOutcome, BusError> {
        let ack = self.send(envelope, traceparent).await?;
        Self::wait(ack).await
    }

    /// Publishes all envelopes in order without awaiting each ack inline:
    /// up to the in-flight bound are sent before the oldest ack is awaited.
    /// Returns one outcome per envelope, in order. On the first error it
    /// stops; envelopes already sent may or may not be stored, and a retry
    /// with the same envelopes is deduplicated by their `Nats-Msg-Id`.
    pub async fn publish_all(
        &self,
        envelopes: &[Envelope],
        traceparent: Option<&str>,
    ) -> Result<Vec<PublishOutcome>, BusError> {
        let mut outcomes = Vec::with_capacity(envelopes.len());
        let mut in_flight: VecDeque<PublishAckFuture> = VecDeque::new();
        for envelope in envelopes {
            if in_flight.len() >= self.max_in_flight {
                if let Some(ack) = in_flight.pop_front() {
                    outcomes.push(Self::wait(ack).await?);
                }
            }
            in_flight.push_back(self.send(envelope, traceparent).await?);
        }
        while let Some(ack) = in_flight.pop_front() {
            outcomes.push(Self::wait(ack).await?);
        }
        Ok(outcomes)
    }

    async fn send(
        &self,
        envelope: &Envelope,
        traceparent: Option<&str>,
    ) -> Result<PublishAckFuture, BusError> {
        let subject = self.namespace.evt_subject(envelope.producer())?;
        let mut msg = PublishMessage::build()
            .payload(Bytes::from(encode(envelope)?))
            .message_id(msg_id(envelope));
        if let Some(tp) = traceparent {
            msg = msg.header(TRACEPARENT, tp);
        }
        self.js
            .send_publish(subject, msg)
            .await
            .map_err(|e| BusError::nats("publish", e))
    }

    async fn wait(ack: PublishAckFuture) -> Result<PublishOutcome, BusError> {
        let ack = ack.await.map_err(|e| BusError::nats("publish ack", e))?;
        Ok(PublishOutcome {
            stream_seq: ack.sequence,
            duplicate: ack.duplicate,
        })
    }
}
