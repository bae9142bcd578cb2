//! gpusched bus: committed event batches and commands over NATS JetStream.
//!
//! Owns: the versioned wire format of an event batch ([`Envelope`],
//! [`encode`], [`decode`]), the subject and stream names ([`Namespace`]),
//! stream setup ([`ensure_stream`]), pipelined publishing with an idempotency
//! key ([`Publisher`]), pull consumption with explicit acks ([`Subscriber`],
//! one request per call; [`StreamSubscriber`], one long-lived pull stream
//! that binds lazily and re-binds after faults), the time bounds every call
//! keeps ([`bounded`], [`wait_connected`]), the per-job trace context a
//! message may carry ([`JobTraces`], the `gpusched-job-traces` header); and
//! the node protocol between
//! node agents and the node relay ([`node`]) over core NATS subjects or an
//! in-process hub ([`node_net`]).
//!
//! Must never: decide anything about scheduling or change scheduler state
//! (that is `gpusched-core`), treat JetStream as the source of truth (the
//! nats-server here is 2.9, which does not fsync; Postgres is the record),
//! reorder or remove [`Envelope`] variants (only append), panic on a
//! malformed message, or stop consuming because of one.
//!
//! Server: Debian's nats-server 2.9, so only JetStream 2.9 features are used
//! (one filter subject per consumer, no per-message TTL, no stream metadata).
//!
//! # When the server is down or restarts
//!
//! The bus is a fast path beside the log, so nothing here waits on the
//! server without a bound, and nothing needs the server to exist first:
//!
//! - Every call returns within its bound whatever the server does (dead,
//!   restarting, silently dropping a request): [`Publisher`] calls within
//!   their publish timeout ([`DEFAULT_PUBLISH_TIMEOUT`]),
//!   [`StreamSubscriber::next_batch`] and [`Subscriber::next_batch`] within
//!   about their `timeout`. They return an error, never hang.
//! - The client reconnects by itself. While it is disconnected, publishes
//!   fail at once with [`BusError::NotConnected`] and reads wait out their
//!   timeout and fail with [`BusError::Unbound`] (or `NotConnected`),
//!   instead of queueing requests that would go out stale later.
//! - A [`StreamSubscriber`] binds lazily (no server needed to make one) and
//!   re-binds by itself after a read error, a missed idle heartbeat (about
//!   2 s of silence: [`PULL_HEARTBEAT`]) or a disconnect: it re-creates the
//!   stream if missing ([`ensure_stream`]) and the consumer, at most once
//!   per [`REBIND_INTERVAL`] while that fails. Once the server accepts
//!   connections again a consumer is bound within about a second (the
//!   client's reconnect delay plus one bind).
//! - A [`Publisher`] whose stream is missing (the server lost its store)
//!   re-creates it and publishes again, once per call.
//! - Messages in flight when the connection dies may be lost (a durable
//!   consumer gets unacked ones again after its ack wait); followers fill
//!   such gaps from the log.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

mod envelope;
mod error;
mod job_traces;
mod naming;
pub mod node;
pub mod node_net;
mod publisher;
mod subscriber;
pub mod testing;

pub use envelope::{decode, encode, encode_json_form, msg_id, BatchV1, Envelope};
pub use error::BusError;
pub use job_traces::{is_traceparent, JobTraces, JOB_TRACES, MAX_JOB_TRACES};
pub use naming::{ensure_stream, Namespace, DEFAULT_DUPLICATE_WINDOW};
pub use publisher::{
    PublishOutcome, Publisher, DEFAULT_MAX_IN_FLIGHT, DEFAULT_PUBLISH_TIMEOUT, TRACEPARENT,
};
pub use subscriber::{
    ConsumerSpec, Delivery, StreamSubscriber, Subscriber, BIND_TIMEOUT, MIN_PULL_EXPIRES,
    PULL_BATCH, PULL_EXPIRES, PULL_HEARTBEAT, REBIND_INTERVAL,
};

/// The NATS client this crate is built on, re-exported so callers use the
/// same version.
pub use async_nats;

/// How often [`wait_connected`] looks at the connection state.
const CONNECTED_POLL: Duration = Duration::from_millis(10);

/// Runs `work`, giving up with [`BusError::TimedOut`] after `within` (the
/// work is dropped: a request already sent may still take effect).
pub async fn bounded<T>(
    op: &'static str,
    within: Duration,
    work: impl Future<Output = Result<T, BusError>>,
) -> Result<T, BusError> {
    tokio::time::timeout(within, work)
        .await
        .unwrap_or(Err(BusError::TimedOut { op, after: within }))
}

/// Whether `client` is connected to its server now.
pub fn is_connected(client: &async_nats::Client) -> bool {
    client.connection_state() == async_nats::connection::State::Connected
}

/// Waits until `client` is connected, at most `within`; else
/// [`BusError::NotConnected`] for `op`.
pub async fn wait_connected(
    client: &async_nats::Client,
    op: &'static str,
    within: Duration,
) -> Result<(), BusError> {
    let deadline = Instant::now() + within;
    loop {
        if is_connected(client) {
            return Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(BusError::NotConnected { op });
        }
        tokio::time::sleep(CONNECTED_POLL.min(deadline - now)).await;
    }
}
