//! A lease holder's liveness: one dedicated database session per holder,
//! holding an advisory lock keyed by the lease and its epoch for as long
//! as the holder's process lives.
//!
//! Owns: taking, renewing and giving back a lease through that session,
//! and taking a lease over early from a holder whose session is gone.
//!
//! Why: expiry alone frees the lease of a killed holder only after its
//! whole time to live, and its stage decides nothing meanwhile. Postgres
//! ends a session, freeing its advisory locks, as soon as the client's
//! connection closes, which the kernel does for a killed process. So a
//! candidate that finds the lease *overdue* (under half its time to live
//! left: the holder renews with two thirds left, so it missed a renewal)
//! and can take the holder's lock knows the holder's session is gone, and
//! takes over without waiting for the expiry. A candidate under the
//! holder's own name (the same instance restarted by its supervisor: the
//! same `--instance`, or the same host name and process id, as a container
//! restarted in place has) takes over as soon as that lock is free, not
//! waiting for the renewal to be overdue: a restart is not the live holder
//! with a broken session that the overdue rule guards against. A holder
//! that is alive but paused, or cut off from the database, keeps its lock
//! (or had its session ended by the server, which the overdue rule
//! covers): it is taken over at expiry, as without this module.
//!
//! Must never: take over a lease whose holder holds its lock, or one that
//! was renewed after it was judged overdue (the takeover checks the epoch
//! and the overdue rule in the same statement); keep a probe's lock; share
//! its connection with the pool (a session lock would leak to whoever got
//! the connection next). Safety never rests on it: the epoch fences every
//! append whatever the sessions do; this only shortens the idle time.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};

use crate::error::{from_bigint, to_bigint};
use crate::lease::{lease_from_row, lost, ttl_micros, ACQUIRE_SQL, RELEASE_SQL, RENEW_SQL};
use crate::{EventStore, Lease, Result, StoreError};

/// Takes over a lease, overdue or held under the candidate's own name, at
/// the epoch the candidate saw ($1 service, $2 partition, $3 holder, $4
/// ttl µs, $5 epoch seen, $6 overdue margin µs).
const TAKE_OVER_SQL: &str = "UPDATE leases
        SET epoch = epoch + 1,
            holder = $3,
            expires_at = now() + $4::bigint * interval '1 microsecond'
      WHERE service = $1 AND partition = $2 AND epoch = $5
        AND (expires_at < now() + $6::bigint * interval '1 microsecond' OR holder = $3)
     RETURNING service, partition, holder, epoch, expires_at";

/// The epoch of an unexpired lease (an expired one is simply taken) that
/// is overdue or held under the candidate's own name ($1 service, $2
/// partition, $3 overdue margin µs, $4 the candidate's name).
const TAKE_OVER_CANDIDATE_SQL: &str = "SELECT epoch FROM leases
      WHERE service = $1 AND partition = $2
        AND (expires_at < now() + $3::bigint * interval '1 microsecond' OR holder = $4)";

/// The liveness lock of a lease at an epoch ($1 key text, $2 epoch).
const TRY_LOCK_SQL: &str = "SELECT pg_try_advisory_lock(hashtextextended($1, $2))";
const UNLOCK_SQL: &str = "SELECT pg_advisory_unlock(hashtextextended($1, $2))";

/// One holder's (or candidate's) session for one lease (module docs).
pub struct LeaseSession {
    service: String,
    partition: String,
    connect: Arc<PgConnectOptions>,
    connect_timeout: Duration,
    conn: Option<PgConnection>,
    /// The epoch whose liveness lock `conn` holds.
    locked: Option<u64>,
}

impl std::fmt::Debug for LeaseSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseSession")
            .field("service", &self.service)
            .field("partition", &self.partition)
            .field("connected", &self.conn.is_some())
            .field("locked", &self.locked)
            .finish()
    }
}

impl EventStore {
    /// A session for the lease of `service`/`partition`; it connects on
    /// first use, with the pool's settings and acquire timeout.
    pub fn lease_session(&self, service: &str, partition: &str) -> LeaseSession {
        LeaseSession {
            service: service.to_string(),
            partition: partition.to_string(),
            connect: self.pool.connect_options(),
            connect_timeout: self.pool.options().get_acquire_timeout(),
            conn: None,
            locked: None,
        }
    }
}

impl LeaseSession {
    /// Takes the lease for `holder` for `ttl` if it is free, expired, or
    /// overdue or held under `holder`'s name with its holder's session
    /// gone; `None` while another holder keeps it. Like
    /// `EventStore::acquire_lease`, every takeover increments the epoch.
    pub async fn acquire(&mut self, holder: &str, ttl: Duration) -> Result<Option<Lease>> {
        let result = self.try_acquire(holder, ttl).await;
        self.forget_broken(result)
    }

    /// Extends a held lease to `ttl` from now, and takes its liveness lock
    /// again if this session lost it (a new connection after a database
    /// restart). `StoreError::LeaseLost` when it moved on.
    pub async fn renew(&mut self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let result = self.try_renew(lease, ttl).await;
        self.forget_broken(result)
    }

    /// Gives a held lease back (it expires now) and its liveness lock.
    /// `StoreError::LeaseLost` when it had already moved on.
    pub async fn release(&mut self, lease: &Lease) -> Result<()> {
        let result = self.try_release(lease).await;
        self.forget_broken(result)
    }

    /// Closes the session, freeing its lock.
    pub async fn close(mut self) {
        if let Some(conn) = self.conn.take() {
            let _ = conn.close().await;
        }
    }

    async fn try_acquire(&mut self, holder: &str, ttl: Duration) -> Result<Option<Lease>> {
        let ttl_us = ttl_micros(ttl)?;
        let (service, partition) = (self.service.clone(), self.partition.clone());
        let conn = self.conn().await?;
        let free = sqlx::query(ACQUIRE_SQL)
            .bind(&service)
            .bind(&partition)
            .bind(holder)
            .bind(ttl_us)
            .fetch_optional(&mut *conn)
            .await?;
        let lease = match free {
            Some(row) => Some(lease_from_row(&row)?),
            None => self.take_from_the_dead(holder, ttl_us).await?,
        };
        if let Some(lease) = &lease {
            // Taken even if the lock is not (yet): the next renewal tries.
            let locked = self.hold_lock(lease.epoch).await;
            let _ = self.forget_broken(locked);
        }
        Ok(lease)
    }

    /// Takes over a lease whose holder's lock is free, when it is overdue
    /// or held under `holder`'s own name (module docs).
    async fn take_from_the_dead(&mut self, holder: &str, ttl_us: i64) -> Result<Option<Lease>> {
        let overdue_us = ttl_us / 2;
        let (service, partition, key) = (self.service.clone(), self.partition.clone(), self.key());
        let own = self.locked;
        let conn = self.conn().await?;
        let seen: Option<i64> = sqlx::query_scalar(TAKE_OVER_CANDIDATE_SQL)
            .bind(&service)
            .bind(&partition)
            .bind(overdue_us)
            .bind(holder)
            .fetch_optional(&mut *conn)
            .await?;
        let Some(seen) = seen else { return Ok(None) };
        // Compared as an epoch; bound back below as read (a corrupt one is
        // refused here, before any bind).
        let epoch = from_bigint("leases.epoch", seen)?;
        if own == Some(epoch) {
            // Never our own: re-entrant locks would say "free".
            return Ok(None);
        }
        let holder_gone: bool = sqlx::query_scalar(TRY_LOCK_SQL)
            .bind(&key)
            .bind(seen)
            .fetch_one(&mut *conn)
            .await?;
        if !holder_gone {
            return Ok(None);
        }
        let taken = sqlx::query(TAKE_OVER_SQL)
            .bind(&service)
            .bind(&partition)
            .bind(holder)
            .bind(ttl_us)
            .bind(seen)
            .bind(overdue_us)
            .fetch_optional(&mut *conn)
            .await;
        // The probe's lock goes whatever the takeover did.
        let unlocked = sqlx::query_scalar::<_, bool>(UNLOCK_SQL)
            .bind(&key)
            .bind(seen)
            .fetch_one(&mut *conn)
            .await;
        let lease = taken?.as_ref().map(lease_from_row).transpose()?;
        if lease.is_none() {
            // Still probing with this session: it must not keep the lock.
            unlocked?;
        }
        // Taken: the lease is ours even if the unlock failed (a session
        // that broke has lost its locks anyway).
        Ok(lease)
    }

    async fn try_renew(&mut self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let ttl_us = ttl_micros(ttl)?;
        let conn = self.conn().await?;
        let row = sqlx::query(RENEW_SQL)
            .bind(&lease.service)
            .bind(&lease.partition)
            .bind(to_bigint("leases.epoch", lease.epoch)?)
            .bind(&lease.holder)
            .bind(ttl_us)
            .fetch_optional(&mut *conn)
            .await?;
        let renewed = match row {
            Some(row) => lease_from_row(&row)?,
            None => return Err(lost(lease)),
        };
        if self.locked != Some(renewed.epoch) {
            let locked = self.hold_lock(renewed.epoch).await;
            let _ = self.forget_broken(locked);
        }
        Ok(renewed)
    }

    async fn try_release(&mut self, lease: &Lease) -> Result<()> {
        let conn = self.conn().await?;
        let done = sqlx::query(RELEASE_SQL)
            .bind(&lease.service)
            .bind(&lease.partition)
            .bind(to_bigint("leases.epoch", lease.epoch)?)
            .bind(&lease.holder)
            .execute(&mut *conn)
            .await?;
        self.drop_lock().await?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(lost(lease))
        }
    }

    /// Holds the liveness lock of `epoch` (and no other). Nobody else can
    /// hold it: probes take an epoch's lock only once it is overdue, and
    /// this is called right after the epoch was taken or renewed. A probe
    /// that overlaps a database restart may still hold it for a moment; the
    /// next renewal tries again.
    async fn hold_lock(&mut self, epoch: u64) -> Result<()> {
        self.drop_lock().await?;
        let seed = to_bigint("leases.epoch", epoch)?;
        let key = self.key();
        let conn = self.conn().await?;
        let got: bool = sqlx::query_scalar(TRY_LOCK_SQL)
            .bind(&key)
            .bind(seed)
            .fetch_one(&mut *conn)
            .await?;
        self.locked = got.then_some(epoch);
        Ok(())
    }

    async fn drop_lock(&mut self) -> Result<()> {
        let Some(epoch) = self.locked.take() else {
            return Ok(());
        };
        let seed = to_bigint("leases.epoch", epoch)?;
        let key = self.key();
        let conn = self.conn().await?;
        sqlx::query_scalar::<_, bool>(UNLOCK_SQL)
            .bind(&key)
            .bind(seed)
            .fetch_one(&mut *conn)
            .await?;
        Ok(())
    }

    fn key(&self) -> String {
        format!("gpusched-lease/{}/{}", self.service, self.partition)
    }

    /// The session's connection, connecting within the timeout.
    async fn conn(&mut self) -> Result<&mut PgConnection> {
        if self.conn.is_none() {
            let connecting = self.connect.connect();
            let conn = tokio::time::timeout(self.connect_timeout, connecting)
                .await
                .map_err(|_| StoreError::from(sqlx::Error::PoolTimedOut))??;
            self.conn = Some(conn);
        }
        self.conn
            .as_mut()
            .ok_or_else(|| StoreError::from(sqlx::Error::PoolTimedOut))
    }

    /// After a failure the database may have ended the session (and its
    /// lock): start a new one next time.
    fn forget_broken<T>(&mut self, result: Result<T>) -> Result<T> {
        if matches!(result, Err(StoreError::Unavailable { .. })) {
            self.conn = None;
            self.locked = None;
        }
        result
    }
}
