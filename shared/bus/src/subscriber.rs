//! Durable pull consumption of envelopes with explicit acks.
//!
//! Owns: [`Subscriber`] and [`Delivery`]. Must never: stop consuming
//! because a message is malformed (it is terminated and reported), or ack a
//! message on the caller's behalf when it decoded (the caller acks after it
//! has acted on it).

use std::time::Duration;

use async_nats::jetstream::{
    self,
    consumer::{pull, AckPolicy, Consumer},
    AckKind,
};
use futures::StreamExt;

use crate::{decode, BusError, Envelope};

/// The shortest wait [`Subscriber::next_batch`] sends to the server as a
/// pull request's expiry; a shorter wait is a local sleep.
pub const MIN_PULL_EXPIRES: Duration = Duration::from_millis(20);

/// A durable pull consumer on one stream and filter subject.
#[derive(Debug)]
pub struct Subscriber {
    consumer: Consumer<pull::Config>,
    /// Whether the consumer wants acks (an ephemeral follower's does not).
    acks: bool,
}

/// One message taken from the stream.
#[derive(Debug)]
pub struct Delivery {
    /// Its sequence number in the stream.
    pub stream_seq: u64,
    /// The subject it was published on.
    pub subject: String,
    /// Its `Nats-Msg-Id`, if any.
    pub msg_id: Option<String>,
    /// Its W3C `traceparent` header, if the publisher sent one.
    pub traceparent: Option<String>,
    /// The decoded envelope, or why it could not be decoded. A malformed
    /// message has already been terminated (never redelivered).
    pub envelope: Result<Envelope, BusError>,
    terminated: bool,
    message: jetstream::Message,
}

impl Delivery {
    /// The ack this message needs: none if already terminated, `Term` if
    /// malformed, else `Ack`.
    fn ack_kind(&self) -> Option<AckKind> {
        if self.terminated {
            None
        } else if self.envelope.is_ok() {
            Some(AckKind::Ack)
        } else {
            Some(AckKind::Term)
        }
    }

    /// Acknowledges the message and waits for the server to confirm, so a
    /// consumer started afterwards with the same durable name resumes after
    /// it. For a malformed message whose termination failed, retries it.
    pub async fn ack(&self) -> Result<(), BusError> {
        let Some(kind) = self.ack_kind() else {
            return Ok(());
        };
        self.message
            .double_ack_with(kind)
            .await
            .map_err(|e| BusError::nats("ack", e))
    }

    /// Acknowledges without waiting for the server's confirmation (one
    /// publish, no round trip): for followers that track their own position
    /// elsewhere and only need the consumer not to redeliver.
    pub async fn ack_nowait(&self) -> Result<(), BusError> {
        let Some(kind) = self.ack_kind() else {
            return Ok(());
        };
        self.message
            .ack_with(kind)
            .await
            .map_err(|e| BusError::nats("ack", e))
    }

    /// Asks for redelivery after `delay` (e.g. when acting on it failed).
    pub async fn nak(&self, delay: Option<Duration>) -> Result<(), BusError> {
        self.message
            .ack_with(AckKind::Nak(delay))
            .await
            .map_err(|e| BusError::nats("nak", e))
    }
}

impl Subscriber {
    /// Binds to (or creates) the durable pull consumer `durable` on
    /// `stream`, with explicit acks, receiving only `filter_subject`.
    pub async fn durable(
        js: &jetstream::Context,
        stream: &str,
        durable: &str,
        filter_subject: &str,
    ) -> Result<Self, BusError> {
        let config = pull::Config {
            durable_name: Some(durable.to_string()),
            filter_subject: filter_subject.to_string(),
            ack_policy: AckPolicy::Explicit,
            ..Default::default()
        };
        Self::bind(js, stream, config).await
    }

    /// An ephemeral pull consumer on `stream` that receives only messages
    /// published from now on (for read-only followers that load everything
    /// older from the log); the server removes it `inactive` after its
    /// last fetch.
    pub async fn ephemeral(
        js: &jetstream::Context,
        stream: &str,
        filter_subject: &str,
        inactive: Duration,
    ) -> Result<Self, BusError> {
        let config = pull::Config {
            durable_name: None,
            filter_subject: filter_subject.to_string(),
            ack_policy: AckPolicy::None,
            deliver_policy: jetstream::consumer::DeliverPolicy::New,
            inactive_threshold: inactive,
            ..Default::default()
        };
        Self::bind(js, stream, config).await
    }

    /// Binds to the durable consumer `config` names (creating it if
    /// missing), or creates an ephemeral one; acks only if its policy wants.
    async fn bind(
        js: &jetstream::Context,
        stream: &str,
        config: pull::Config,
    ) -> Result<Self, BusError> {
        let stream = js
            .get_stream(stream)
            .await
            .map_err(|e| BusError::nats("get stream", e))?;
        let acks = config.ack_policy != AckPolicy::None;
        let consumer = match config.durable_name.clone() {
            Some(name) => stream.get_or_create_consumer(&name, config).await,
            None => stream.create_consumer(config).await,
        }
        .map_err(|e| BusError::nats("create consumer", e))?;
        Ok(Subscriber { consumer, acks })
    }

    /// Takes up to `max` messages. Returns at once with what is waiting; if
    /// nothing is, waits up to `timeout` for the first message and returns
    /// as soon as it comes, with whatever else is waiting by then. An empty
    /// vector means nothing came. Malformed messages are terminated here and
    /// returned with their decode error. A `timeout` under
    /// [`MIN_PULL_EXPIRES`] with nothing waiting is slept here, not asked
    /// of the server.
    pub async fn next_batch(
        &self,
        max: usize,
        timeout: Duration,
    ) -> Result<Vec<Delivery>, BusError> {
        let max = max.max(1);
        let mut out = self.fetch_waiting(max).await?;
        if out.is_empty() && timeout < MIN_PULL_EXPIRES {
            // nats-server 2.9 drops a pull request that expires before it
            // is served without answering it, and the client then waits
            // out its own 5 s request timeout. Too short to ask: wait here.
            tokio::time::sleep(timeout).await;
        } else if out.is_empty() {
            // A pull request for one message returns when it arrives; one
            // for `max` would wait out `timeout` unless `max` arrived.
            let batch = self
                .consumer
                .batch()
                .max_messages(1)
                .expires(timeout)
                .messages()
                .await
                .map_err(|e| BusError::nats("fetch", e))?;
            out = Self::collect(batch, self.acks).await?;
            if !out.is_empty() && max > 1 {
                out.extend(self.fetch_waiting(max - 1).await?);
            }
        }
        Ok(out)
    }

    /// Up to `max` messages already waiting, without waiting for more.
    async fn fetch_waiting(&self, max: usize) -> Result<Vec<Delivery>, BusError> {
        let batch = self
            .consumer
            .fetch()
            .max_messages(max)
            .messages()
            .await
            .map_err(|e| BusError::nats("fetch", e))?;
        Self::collect(batch, self.acks).await
    }

    async fn collect(mut batch: pull::Batch, acks: bool) -> Result<Vec<Delivery>, BusError> {
        let mut out = Vec::new();
        while let Some(item) = batch.next().await {
            match item {
                Ok(message) => out.push(Self::deliver(message, acks).await),
                // Keep what arrived; report the error only if nothing did.
                Err(e) if out.is_empty() => return Err(BusError::nats("fetch", e)),
                Err(_) => break,
            }
        }
        Ok(out)
    }

    async fn deliver(message: jetstream::Message, acks: bool) -> Delivery {
        let stream_seq = message.info().map(|i| i.stream_sequence).unwrap_or(0);
        let msg_id = message
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|v| v.as_str().to_string());
        let traceparent = message
            .headers
            .as_ref()
            .and_then(|h| h.get(crate::publisher::TRACEPARENT))
            .map(|v| v.as_str().to_string());
        let envelope = decode(&message.payload);
        // Without acks there is nothing to terminate: count it as done.
        let terminated =
            !acks || (envelope.is_err() && message.double_ack_with(AckKind::Term).await.is_ok());
        Delivery {
            stream_seq,
            subject: message.subject.to_string(),
            msg_id,
            traceparent,
            envelope,
            terminated,
            message,
        }
    }
}
