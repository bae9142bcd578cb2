//! gpusched bus: committed event batches and commands over NATS JetStream.
//!
//! Owns: the versioned wire format of an event batch ([`Envelope`],
//! [`encode`], [`decode`]), the subject and stream names ([`Namespace`]),
//! stream setup ([`ensure_stream`]), pipelined publishing with an idempotency
//! key ([`Publisher`]) and durable pull consumption with explicit acks
//! ([`Subscriber`]); and the node protocol between node agents and the node
//! relay ([`node`]) over core NATS subjects or an in-process hub
//! ([`node_net`]).
//!
//! Must never: decide anything about scheduling or change scheduler state
//! (that is `gpusched-core`), treat JetStream as the source of truth (the
//! nats-server here is 2.9, which does not fsync; Postgres is the record),
//! reorder or remove [`Envelope`] variants (only append), panic on a
//! malformed message, or stop consuming because of one.
//!
//! Server: Debian's nats-server 2.9, so only JetStream 2.9 features are used
//! (one filter subject per consumer, no per-message TTL, no stream metadata).

mod envelope;
mod error;
mod naming;
pub mod node;
pub mod node_net;
mod publisher;
mod subscriber;

pub use envelope::{decode, encode, msg_id, BatchV1, Envelope};
pub use error::BusError;
pub use naming::{ensure_stream, Namespace, DEFAULT_DUPLICATE_WINDOW};
pub use publisher::{PublishOutcome, Publisher, DEFAULT_MAX_IN_FLIGHT, TRACEPARENT};
pub use subscriber::{Delivery, Subscriber};

/// The NATS client this crate is built on, re-exported so callers use the
/// same version.
pub use async_nats;
