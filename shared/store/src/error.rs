//! The store's errors: what went wrong, naming the field or sequence at fault.
//!
//! Must never: hide a refusal (stale epoch, lost lease) behind a generic
//! database error; callers act differently on each.

use gpusched_core::ApplyError;
use thiserror::Error;

/// Everything the store can fail with.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The append's fencing epoch is not the lease's current epoch: another
    /// instance took the lease over. Nothing was written.
    #[error("stale epoch: lease {service}/{partition} is at epoch {held}, append gave {given}")]
    StaleEpoch {
        /// The lease's service.
        service: String,
        /// The lease's partition.
        partition: String,
        /// The epoch the lease holds now.
        held: i64,
        /// The epoch the append carried.
        given: i64,
    },
    /// The append named a lease that was never acquired. Nothing was written.
    #[error("fence: no lease {service}/{partition} exists")]
    NoLease {
        /// The service named.
        service: String,
        /// The partition named.
        partition: String,
    },
    /// A renew or release found the lease at another epoch or holder: it was
    /// taken over.
    #[error("lease {service}/{partition} epoch {epoch} held by {holder} is lost")]
    LeaseLost {
        /// The lease's service.
        service: String,
        /// The lease's partition.
        partition: String,
        /// The epoch the caller held.
        epoch: i64,
        /// The holder the caller claimed to be.
        holder: String,
    },
    /// A lease time-to-live outside what Postgres intervals can hold.
    #[error("ttl: {ttl_ms} ms is out of range")]
    BadTtl {
        /// The ttl asked, ms.
        ttl_ms: u128,
    },
    /// An event could not be encoded as JSON.
    #[error("payload: cannot encode {kind} event: {source}")]
    Encode {
        /// The event's kind.
        kind: &'static str,
        /// The serializer's error.
        #[source]
        source: serde_json::Error,
    },
    /// A stored payload is not a valid `Event`.
    #[error("payload: cannot decode event at seq {seq}: {source}")]
    Decode {
        /// The row's sequence number.
        seq: i64,
        /// The deserializer's error.
        #[source]
        source: serde_json::Error,
    },
    /// A stored row was written by a newer schema than this build reads.
    #[error("schema_version: {version} at seq {seq} is newer than this build reads")]
    UnknownSchema {
        /// The row's sequence number.
        seq: i64,
        /// Its schema version.
        version: i32,
    },
    /// Replay reached an event the state refuses.
    #[error("replay: event at seq {seq} refused by apply: {source}")]
    Apply {
        /// The refused event's sequence number.
        seq: i64,
        /// Why apply refused it.
        #[source]
        source: ApplyError,
    },
    /// Migrating the schema failed.
    #[error("migrate: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// Postgres or the connection failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

/// The store's result.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
