//! Errors of the bus crate.
//!
//! Owns: [`BusError`]. Must never: carry secrets or whole payloads in
//! messages.

/// Everything that can go wrong on the bus.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// The outer postcard envelope could not be decoded.
    #[error("envelope: malformed postcard bytes: {0}")]
    Envelope(#[source] postcard::Error),
    /// The envelope decoded but bytes were left over after it.
    #[error("envelope: {0} trailing bytes after the envelope")]
    TrailingBytes(usize),
    /// The events payload (JSON inside the envelope) could not be decoded.
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
