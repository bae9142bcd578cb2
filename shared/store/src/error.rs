//! The store's errors: what went wrong, naming the field or sequence at fault.
//!
//! Owns: the split of database failures into "unavailable now, retry later"
//! (`StoreError::Unavailable`, with its `Outage`) and everything else; and
//! the one conversion between the store's `u64` sequences and epochs and
//! Postgres's `bigint` (`from_bigint` on every read, `to_bigint` on every
//! bind), so callers never convert.
//!
//! Must never: hide a refusal (stale epoch, lost lease) behind a generic
//! database error, or call a failure that retrying cannot cure (bad SQL,
//! a constraint, a wrong password) unavailable; callers act differently on
//! each. Never turn a sequence or epoch it cannot convert into another
//! value (a 0, a clamp): a negative `bigint` read is `Corrupt`, a `u64`
//! above `i64::MAX` to bind is `OutOfRange`.

use gpusched_core::ApplyError;
use thiserror::Error;

/// Everything the store can fail with.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The append's fencing epoch is not the lease's current epoch: another
    /// instance took the lease over. Nothing was written.
    #[error(
        "stale epoch: lease {service}/{partition} is at epoch {}, append gave {given}",
        .held.map_or_else(|| "unknown".to_string(), |h| h.to_string())
    )]
    StaleEpoch {
        /// The lease's service.
        service: String,
        /// The lease's partition.
        partition: String,
        /// The epoch the lease holds now (`None`: the database's refusal
        /// did not say).
        held: Option<u64>,
        /// The epoch the append carried.
        given: u64,
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
        epoch: u64,
        /// The holder the caller claimed to be.
        holder: String,
    },
    /// A lease time-to-live outside what Postgres intervals can hold.
    #[error("ttl: {ttl_ms} ms is out of range")]
    BadTtl {
        /// The ttl asked, ms.
        ttl_ms: u128,
    },
    /// Bytes given as a snapshot are not one.
    #[error("snapshot: {0}")]
    Snapshot(#[source] gpusched_core::snapshot::SnapshotError),
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
        seq: u64,
        /// The deserializer's error.
        #[source]
        source: serde_json::Error,
    },
    /// A stored row was written by a newer schema than this build reads.
    #[error("schema_version: {version} at seq {seq} is newer than this build reads")]
    UnknownSchema {
        /// The row's sequence number.
        seq: u64,
        /// Its schema version.
        version: i32,
    },
    /// Replay reached an event the state refuses.
    #[error("replay: event at seq {seq} refused by apply: {source}")]
    Apply {
        /// The refused event's sequence number.
        seq: u64,
        /// Why apply refused it.
        #[source]
        source: ApplyError,
    },
    /// A sequence or epoch read back from a `bigint` column is negative,
    /// which none can be: the row is corrupt (or was written by something
    /// other than the store).
    #[error("{column}: stored value {value} is negative, not a sequence or epoch")]
    Corrupt {
        /// The column read, e.g. `events.seq`.
        column: &'static str,
        /// The value found there.
        value: i64,
    },
    /// A sequence or epoch given to the store is above the largest a
    /// `bigint` column holds (`i64::MAX`, `SEQ_MAX`). Nothing was sent.
    #[error(
        "{column}: {value} is above the largest value the column holds ({})",
        i64::MAX
    )]
    OutOfRange {
        /// The column it was to be compared with or written to.
        column: &'static str,
        /// The value given.
        value: u64,
    },
    /// Migrating the schema failed.
    #[error("migrate: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The database cannot serve the call now: it is down, restarting or
    /// unreachable, or the call waited too long on a writer that stalled.
    /// Retry later (a server answers 503). An append that failed this way
    /// while committing may have committed: retry it with the same
    /// idempotency keys and the events already written are skipped.
    #[error("database unavailable ({outage}): {source}")]
    Unavailable {
        /// Why.
        outage: Outage,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// Postgres failed in a way retrying does not cure (see `Unavailable`
    /// for the ones it does).
    #[error("database: {0}")]
    Database(#[source] sqlx::Error),
}

/// Why the database could not serve a call (`StoreError::Unavailable`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outage {
    /// No connection within the pool's acquire timeout: connecting kept
    /// failing (the server is down or unreachable) or every connection
    /// stayed busy.
    PoolTimedOut,
    /// Connecting, sending or receiving failed, or the server closed the
    /// connection (SQLSTATE class 08): it stopped, crashed or is cut off.
    ConnectionLost,
    /// The server is shutting down, starting, recovering or full
    /// (57P01, 57P02, 57P03, 53300).
    NotAccepting,
    /// A statement waited longer than `lock_timeout` for the lease row or
    /// the append lock, held by a writer that did not finish (55P03).
    LockTimedOut,
    /// A statement ran longer than `statement_timeout` or was cancelled
    /// (57014).
    StatementTimedOut,
    /// The server ended this session because it sat idle inside a
    /// transaction too long (25P03, e.g. this process was paused in an
    /// append: that append did not commit) or idle too long (57P05).
    SessionTimedOut,
}

impl Outage {
    /// The outage a driver error reports; `None`: not one retrying cures.
    pub fn of(e: &sqlx::Error) -> Option<Outage> {
        match e {
            sqlx::Error::PoolTimedOut => Some(Outage::PoolTimedOut),
            sqlx::Error::Io(_) => Some(Outage::ConnectionLost),
            sqlx::Error::Database(db) => db.code().as_deref().and_then(Outage::of_sqlstate),
            _ => None,
        }
    }

    /// The outage a Postgres SQLSTATE reports, if any.
    fn of_sqlstate(code: &str) -> Option<Outage> {
        match code {
            "55P03" => Some(Outage::LockTimedOut),
            "57014" => Some(Outage::StatementTimedOut),
            "25P03" | "57P05" => Some(Outage::SessionTimedOut),
            "57P01" | "57P02" | "57P03" | "53300" => Some(Outage::NotAccepting),
            c if c.starts_with("08") => Some(Outage::ConnectionLost),
            _ => None,
        }
    }
}

impl std::fmt::Display for Outage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Outage::PoolTimedOut => "no connection within the acquire timeout",
            Outage::ConnectionLost => "connection lost",
            Outage::NotAccepting => "server not accepting work",
            Outage::LockTimedOut => "lock wait timed out",
            Outage::StatementTimedOut => "statement timed out",
            Outage::SessionTimedOut => "session ended by the server",
        })
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(source: sqlx::Error) -> Self {
        match Outage::of(&source) {
            Some(outage) => StoreError::Unavailable { outage, source },
            None => StoreError::Database(source),
        }
    }
}

impl StoreError {
    /// Why the database could not serve the call, when retrying later can
    /// cure it (`Unavailable`, or a migration that failed for such a
    /// reason).
    pub fn outage(&self) -> Option<Outage> {
        use sqlx::migrate::MigrateError;
        match self {
            StoreError::Unavailable { outage, .. } => Some(*outage),
            StoreError::Migrate(
                MigrateError::Execute(e) | MigrateError::ExecuteMigration(e, _),
            ) => Outage::of(e),
            _ => None,
        }
    }

    /// True when the database could not serve the call now and a retry
    /// later may succeed (answer 503; see `Unavailable`).
    pub fn is_unavailable(&self) -> bool {
        self.outage().is_some()
    }
}

/// The store's result.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A sequence or epoch read from the `bigint` column `column`; a negative
/// value is `StoreError::Corrupt`.
pub(crate) fn from_bigint(column: &'static str, value: i64) -> Result<u64> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt { column, value })
}

/// A sequence or epoch to bind against the `bigint` column `column`; one
/// above `i64::MAX` is `StoreError::OutOfRange`.
pub(crate) fn to_bigint(column: &'static str, value: u64) -> Result<i64> {
    i64::try_from(value).map_err(|_| StoreError::OutOfRange { column, value })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_failures_are_unavailable() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let cases = [
            (sqlx::Error::PoolTimedOut, Outage::PoolTimedOut),
            (sqlx::Error::Io(refused), Outage::ConnectionLost),
        ];
        for (e, want) in cases {
            let err = StoreError::from(e);
            assert_eq!(err.outage(), Some(want), "{err}");
            assert!(err.is_unavailable());
            assert!(matches!(err, StoreError::Unavailable { .. }));
        }
    }

    #[test]
    fn other_driver_failures_are_not_unavailable() {
        for e in [sqlx::Error::RowNotFound, sqlx::Error::PoolClosed] {
            let err = StoreError::from(e);
            assert!(matches!(err, StoreError::Database(_)), "{err}");
            assert!(!err.is_unavailable());
        }
    }

    #[test]
    fn bigints_convert_once_and_refuse_what_does_not_fit() {
        assert_eq!(from_bigint("events.seq", 0).unwrap(), 0);
        assert_eq!(
            from_bigint("events.seq", i64::MAX).unwrap(),
            i64::MAX as u64
        );
        let err = from_bigint("leases.epoch", -1).unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::Corrupt {
                    column: "leases.epoch",
                    value: -1
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("leases.epoch"), "{err}");
        assert!(!err.is_unavailable());

        assert_eq!(to_bigint("events.seq", 7).unwrap(), 7);
        assert_eq!(to_bigint("events.seq", i64::MAX as u64).unwrap(), i64::MAX);
        let above = i64::MAX as u64 + 1;
        for value in [above, u64::MAX] {
            let err = to_bigint("events.seq", value).unwrap_err();
            assert!(
                matches!(err, StoreError::OutOfRange { column: "events.seq", value: v } if v == value),
                "{err}"
            );
            assert!(err.to_string().contains("events.seq"), "{err}");
        }
    }

    #[test]
    fn sqlstates_map_to_outages() {
        let cases = [
            ("55P03", Some(Outage::LockTimedOut)),
            ("57014", Some(Outage::StatementTimedOut)),
            ("25P03", Some(Outage::SessionTimedOut)),
            ("57P01", Some(Outage::NotAccepting)),
            ("57P03", Some(Outage::NotAccepting)),
            ("08006", Some(Outage::ConnectionLost)),
            ("23505", None),
            ("42P01", None),
            ("28P01", None),
        ];
        for (code, want) in cases {
            assert_eq!(Outage::of_sqlstate(code), want, "{code}");
        }
    }
}
