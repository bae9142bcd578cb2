//! Pipelined publishing of envelopes.
//!
//! Owns: [`Publisher`] and the headers it sets (`Nats-Msg-Id`, and when
//! given the W3C `traceparent` and the per-job [`JOB_TRACES`](crate::JOB_TRACES)).
//! Must never: publish without the idempotency key
//! (`Nats-Msg-Id`), hold more than its bound of unacknowledged publishes,
//! or wait on the server without a bound (every step gives up after the
//! publish timeout and returns an error; the log has the batch anyway).

use std::collections::VecDeque;
use std::time::Duration;

use async_nats::jetstream::{
    self,
    context::{PublishAckFuture, PublishErrorKind},
    message::PublishMessage,
};
use bytes::Bytes;

use crate::{
    bounded, encode, ensure_stream, is_connected, msg_id, BusError, Envelope, JobTraces, Namespace,
    JOB_TRACES,
};

/// Default bound on publishes awaiting their ack (below async-nats' own
/// 5,000).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 4096;

/// Default bound on one [`Publisher::publish`], and on each send and each
/// ack of [`Publisher::publish_all`].
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(2);

/// The W3C trace-context header carried when given.
pub const TRACEPARENT: &str = "traceparent";

/// The trace headers of one publish.
struct Headers<'a> {
    traceparent: Option<&'a str>,
    /// The [`JOB_TRACES`] value, if any pairs.
    jobs: Option<String>,
}

/// What JetStream said about one published envelope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublishOutcome {
    /// Sequence number in the stream (of the original, for a duplicate).
    pub stream_seq: u64,
    /// JetStream dropped it as a duplicate within the dedup window.
    pub duplicate: bool,
}

/// Publishes envelopes to `<root>.evt.<producer>`, many in flight at once.
/// If the events stream is missing (deleted, or the server lost its store)
/// it re-creates it with [`ensure_stream`] and publishes again, once per
/// call.
#[derive(Clone, Debug)]
pub struct Publisher {
    js: jetstream::Context,
    client: async_nats::Client,
    namespace: Namespace,
    max_in_flight: usize,
    timeout: Duration,
}

impl Publisher {
    /// A publisher in this namespace with [`DEFAULT_MAX_IN_FLIGHT`] and
    /// [`DEFAULT_PUBLISH_TIMEOUT`].
    pub fn new(js: jetstream::Context, namespace: Namespace) -> Self {
        Publisher {
            client: js.client(),
            js,
            namespace,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            timeout: DEFAULT_PUBLISH_TIMEOUT,
        }
    }

    /// Sets the bound on unacknowledged publishes (at least 1).
    pub fn with_max_in_flight(mut self, max_in_flight: usize) -> Self {
        self.max_in_flight = max_in_flight.max(1);
        self
    }

    /// Sets the publish timeout (at least 1 ms).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Publishes one envelope and awaits its ack, all within the publish
    /// timeout: [`BusError::NotConnected`] at once while the client is
    /// disconnected, [`BusError::TimedOut`] when the server does not answer
    /// in time.
    pub async fn publish(
        &self,
        envelope: &Envelope,
        traceparent: Option<&str>,
    ) -> Result<PublishOutcome, BusError> {
        self.publish_with(envelope, traceparent, &JobTraces::default())
            .await
    }

    /// [`Publisher::publish`], with the trace context of the jobs whose
    /// events the envelope holds in the [`JOB_TRACES`] header (none sent
    /// when `jobs` is empty).
    pub async fn publish_with(
        &self,
        envelope: &Envelope,
        traceparent: Option<&str>,
        jobs: &JobTraces,
    ) -> Result<PublishOutcome, BusError> {
        self.check_connected()?;
        let headers = Headers {
            traceparent,
            jobs: jobs.to_header(),
        };
        bounded("publish", self.timeout, async {
            match self.publish_one(envelope, &headers).await {
                Err(BusError::NoStream { .. }) => {
                    self.ensure_stream().await?;
                    self.publish_one(envelope, &headers).await
                }
                other => other,
            }
        })
        .await
    }

    /// Publishes all envelopes in order without awaiting each ack inline:
    /// up to the in-flight bound are sent before the oldest ack is awaited.
    /// Returns one outcome per envelope, in order. Fails at once while the
    /// client is disconnected; each send and each ack is bounded by the
    /// publish timeout. On the first error it stops; envelopes already sent may or
    /// may not be stored, and a retry with the same envelopes is
    /// deduplicated by their `Nats-Msg-Id`.
    pub async fn publish_all(
        &self,
        envelopes: &[Envelope],
        traceparent: Option<&str>,
    ) -> Result<Vec<PublishOutcome>, BusError> {
        self.check_connected()?;
        let headers = Headers {
            traceparent,
            jobs: None,
        };
        match self.publish_all_once(envelopes, &headers).await {
            Err(BusError::NoStream { .. }) => {
                self.ensure_stream().await?;
                self.publish_all_once(envelopes, &headers).await
            }
            other => other,
        }
    }

    /// Fails at once while the client is not connected: a publish queued
    /// meanwhile would only go out stale, or time out.
    fn check_connected(&self) -> Result<(), BusError> {
        if is_connected(&self.client) {
            Ok(())
        } else {
            Err(BusError::NotConnected { op: "publish" })
        }
    }

    async fn publish_one(
        &self,
        envelope: &Envelope,
        headers: &Headers<'_>,
    ) -> Result<PublishOutcome, BusError> {
        let ack = self.send(envelope, headers).await?;
        self.wait(ack).await
    }

    async fn publish_all_once(
        &self,
        envelopes: &[Envelope],
        headers: &Headers<'_>,
    ) -> Result<Vec<PublishOutcome>, BusError> {
        let mut outcomes = Vec::with_capacity(envelopes.len());
        let mut in_flight: VecDeque<PublishAckFuture> = VecDeque::new();
        for envelope in envelopes {
            if in_flight.len() >= self.max_in_flight {
                if let Some(ack) = in_flight.pop_front() {
                    outcomes.push(self.wait(ack).await?);
                }
            }
            in_flight.push_back(self.send(envelope, headers).await?);
        }
        while let Some(ack) = in_flight.pop_front() {
            outcomes.push(self.wait(ack).await?);
        }
        Ok(outcomes)
    }

    /// Re-creates the events stream of this namespace if it is missing.
    async fn ensure_stream(&self) -> Result<(), BusError> {
        let (name, subjects) = (self.namespace.evt_stream(), self.namespace.evt_wildcard());
        let ensure = ensure_stream(&self.js, &name, vec![subjects]);
        bounded("ensure stream", self.timeout, async {
            ensure.await.map(drop)
        })
        .await
    }

    async fn send(
        &self,
        envelope: &Envelope,
        headers: &Headers<'_>,
    ) -> Result<PublishAckFuture, BusError> {
        let subject = self.namespace.evt_subject(envelope.producer())?;
        let mut msg = PublishMessage::build()
            .payload(Bytes::from(encode(envelope)?))
            .message_id(msg_id(envelope));
        if let Some(tp) = headers.traceparent {
            msg = msg.header(TRACEPARENT, tp);
        }
        if let Some(jobs) = headers.jobs.as_deref() {
            msg = msg.header(JOB_TRACES, jobs);
        }
        bounded("publish", self.timeout, async {
            self.js
                .send_publish(subject, msg)
                .await
                .map_err(|e| BusError::nats("publish", e))
        })
        .await
    }

    async fn wait(&self, ack: PublishAckFuture) -> Result<PublishOutcome, BusError> {
        let ack = bounded("publish ack", self.timeout, async {
            ack.await.map_err(|e| match e.kind() {
                PublishErrorKind::StreamNotFound => BusError::NoStream {
                    subject: self.namespace.evt_wildcard(),
                },
                PublishErrorKind::TimedOut => BusError::TimedOut {
                    op: "publish ack",
                    after: self.timeout,
                },
                _ => BusError::nats("publish ack", e),
            })
        })
        .await?;
        Ok(PublishOutcome {
            stream_seq: ack.sequence,
            duplicate: ack.duplicate,
        })
    }
}
