//! Fencing leases: one active instance per (service, partition).
//!
//! Owns: the `leases` table. A lease is taken when free or expired and each
//! takeover increments its epoch; appends carry the epoch (`Fence`) and the
//! store refuses any that is not the lease's current one (docs/architecture.md, "One writer per stage").
//!
//! A takeover (and a renewal) waits for the appends in flight under the
//! lease, which hold its row `FOR SHARE` until they end: never for long, as
//! the server ends a transaction left idle by a paused writer (it aborts:
//! an append whose epoch check passed either commits before the takeover
//! or not at all), and a wait past the lock timeout fails as
//! `Outage::LockTimedOut` for the caller to retry (`StoreOptions`).
//!
//! Must never: decrease an epoch, hand an unexpired lease to another holder,
//! or use the client's clock (expiry is judged by Postgres's `now()`).
//! Epochs are `u64`, converted to and from the `bigint` column only by
//! `from_bigint`/`to_bigint` (`error.rs`).

use crate::error::{from_bigint, to_bigint};
use crate::{EventStore, Result, StoreError};
use chrono::{DateTime, Utc};
use sqlx::Row;
use std::time::Duration;

/// A lease held by one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The service, e.g. `placement`.
    pub service: String,
    /// The partition (pool) it covers.
    pub partition: String,
    /// Who holds it (an instance id).
    pub holder: String,
    /// Fencing epoch: grows by one on every takeover.
    pub epoch: u64,
    /// When it lapses unless renewed (database clock).
    pub expires_at: DateTime<Utc>,
}

impl Lease {
    /// The fence to append under while holding this lease.
    pub fn fence(&self) -> Fence {
        Fence {
            service: self.service.clone(),
            partition: self.partition.clone(),
            epoch: self.epoch,
        }
    }
}

/// What an append claims: the lease it holds and the epoch it holds it at.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Fence {
    /// The lease's service.
    pub service: String,
    /// The lease's partition.
    pub partition: String,
    /// The epoch the writer believes it holds.
    pub epoch: u64,
}

/// Takes a lease free or expired ($1 service, $2 partition, $3 holder, $4
/// ttl µs); no row when another holder's is unexpired.
pub(crate) const ACQUIRE_SQL: &str =
    "INSERT INTO leases AS l (service, partition, epoch, holder, expires_at)
     VALUES ($1, $2, 1, $3, now() + $4::bigint * interval '1 microsecond')
     ON CONFLICT (service, partition) DO UPDATE
        SET epoch = l.epoch + 1,
            holder = EXCLUDED.holder,
            expires_at = EXCLUDED.expires_at
      WHERE l.expires_at <= now()
     RETURNING service, partition, holder, epoch, expires_at";

/// Extends a held lease ($1 service, $2 partition, $3 epoch, $4 holder, $5
/// ttl µs); no row when it moved on.
pub(crate) const RENEW_SQL: &str = "UPDATE leases
        SET expires_at = now() + $5::bigint * interval '1 microsecond'
      WHERE service = $1 AND partition = $2 AND epoch = $3 AND holder = $4
     RETURNING service, partition, holder, epoch, expires_at";

/// Lets a held lease expire now ($1 service, $2 partition, $3 epoch, $4
/// holder); no row touched when it moved on.
pub(crate) const RELEASE_SQL: &str = "UPDATE leases
        SET expires_at = LEAST(expires_at, now())
      WHERE service = $1 AND partition = $2 AND epoch = $3 AND holder = $4";

pub(crate) fn ttl_micros(ttl: Duration) -> Result<i64> {
    i64::try_from(ttl.as_micros()).map_err(|_| StoreError::BadTtl {
        ttl_ms: ttl.as_millis(),
    })
}

pub(crate) fn lease_from_row(row: &sqlx::postgres::PgRow) -> Result<Lease> {
    Ok(Lease {
        service: row.try_get("service")?,
        partition: row.try_get("partition")?,
        holder: row.try_get("holder")?,
        epoch: from_bigint("leases.epoch", row.try_get("epoch")?)?,
        expires_at: row.try_get("expires_at")?,
    })
}

impl EventStore {
    /// Takes the lease of `service`/`partition` for `holder` for `ttl` if it
    /// is free (never taken, released) or expired, incrementing its epoch
    /// (the first epoch is 1). `None`: another holder's lease is still
    /// unexpired — stay standby and try again later. A holder re-acquiring
    /// its own unexpired lease also gets `None`; it renews instead.
    pub async fn acquire_lease(
        &self,
        service: &str,
        partition: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>> {
        let ttl = ttl_micros(ttl)?;
        let row = sqlx::query(ACQUIRE_SQL)
            .bind(service)
            .bind(partition)
            .bind(holder)
            .bind(ttl)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(lease_from_row).transpose()
    }

    /// Extends a held lease to `ttl` from now. Fails with
    /// `StoreError::LeaseLost` if the lease has moved to another epoch or
    /// holder. A lease that expired but was not taken over is still this
    /// holder's (its epoch still fences everyone else) and is renewed.
    pub async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let ttl = ttl_micros(ttl)?;
        let row = sqlx::query(RENEW_SQL)
            .bind(&lease.service)
            .bind(&lease.partition)
            .bind(to_bigint("leases.epoch", lease.epoch)?)
            .bind(&lease.holder)
            .bind(ttl)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(row) => lease_from_row(&row),
            None => Err(lost(lease)),
        }
    }

    /// Gives a held lease up so a standby can take it at once (it expires
    /// now). The epoch stays: until someone takes over, appends under it are
    /// still accepted. Fails with `StoreError::LeaseLost` if it was already
    /// taken over.
    pub async fn release_lease(&self, lease: &Lease) -> Result<()> {
        let done = sqlx::query(RELEASE_SQL)
            .bind(&lease.service)
            .bind(&lease.partition)
            .bind(to_bigint("leases.epoch", lease.epoch)?)
            .bind(&lease.holder)
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(lost(lease))
        }
    }

    /// The lease of `service`/`partition` as it stands now, if ever taken.
    pub async fn lease(&self, service: &str, partition: &str) -> Result<Option<Lease>> {
        let row = sqlx::query(
            "SELECT service, partition, holder, epoch, expires_at
               FROM leases WHERE service = $1 AND partition = $2",
        )
        .bind(service)
        .bind(partition)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(lease_from_row).transpose()
    }
}

pub(crate) fn lost(lease: &Lease) -> StoreError {
    StoreError::LeaseLost {
        service: lease.service.clone(),
        partition: lease.partition.clone(),
        epoch: lease.epoch,
        holder: lease.holder.clone(),
    }
}
