//! Errors of the bus crate.
//!
//! Owns: [`BusError`]. Must never: carry secrets or whole payloads in
//! messages.

use std::time::Duration;

/// Everything that can go wrong on the bus.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// The postcard message (header, or events in their binary form)
    /// could not be decoded.
    #[error("envelope: malformed postcard bytes: {0}")]
    Envelope(#[source] postcard::Error),
    /// The events are in a binary form this build does not read (written
    /// by another release): the reader reads them from the log instead.
    #[error(
        "events: binary form {found}, this build reads form {}",
        gpusched_events::binary::FORM
    )]
    UnknownBinaryForm {
        /// The form the message was written in.
        found: u16,
    },
    /// The envelope decoded but bytes were left over after it.
    #[error("envelope: {0} trailing bytes after the envelope")]
    TrailingBytes(usize),
    /// The events of the older JSON form could not be decoded.
    #[error("events: malformed JSON payload: {0}")]
    Events(#[source] serde_json::Error),
    /// Encoding failed (should not happen for well-formed values).
    #[error("encode: {0}")]
    Encode(String),
    /// A name (producer, command, namespace root) is not a valid NATS token.
    #[error("{field}: {value:?} is not a valid subject token (letters, digits, '-' or '_')")]
    InvalidName {
        /// Which name.
        field: &'static str,
        /// The value given.
        value: String,
    },
    /// A NATS or JetStream operation failed.
    #[error("nats {op}: {source}")]
    Nats {
        /// What was being done.
        op: &'static str,
        /// The client's error.
        #[source]
        source: async_nats::Error,
    },
    /// A NATS operation got no answer within its bound (the server is
    /// down, restarting, or lost the request).
    #[error("nats {op}: no answer within {} ms", after.as_millis())]
    TimedOut {
        /// What was being done.
        op: &'static str,
        /// The bound that ran out.
        after: Duration,
    },
    /// The client is not connected to the server now (it keeps
    /// reconnecting by itself).
    #[error("nats {op}: not connected to the server")]
    NotConnected {
        /// What was being done.
        op: &'static str,
    },
    /// No stream takes the subject (deleted, or the server lost its store):
    /// JetStream answered a publish with "no responders".
    #[error("nats publish: no stream takes subject {subject}")]
    NoStream {
        /// The subject published to.
        subject: String,
    },
    /// A consumer is not bound to the server now; it binds again by itself
    /// while the caller reads the log.
    #[error("nats consumer {consumer}: not bound ({reason})")]
    Unbound {
        /// The durable name, or `ephemeral`.
        consumer: String,
        /// Why: the last bind or read error, or that the client is
        /// disconnected.
        reason: String,
    },
}

impl BusError {
    /// Wraps a NATS client error with the operation that failed.
    pub fn nats(op: &'static str, source: impl Into<async_nats::Error>) -> Self {
        BusError::Nats {
            op,
            source: source.into(),
        }
    }
}
