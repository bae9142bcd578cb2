//! One writer per stage: the fencing lease as every writer holds it (the
//! deciding services, the gateway's writer, the cluster bootstrap).
//!
//! Owns: taking a lease (once, or waiting as standby), renewing it when a
//! third of its time to live has passed, stepping down when it has moved
//! to another epoch, and giving it back on every way out — a clean exit,
//! an error, a panic or a dropped future (a [`Leader`] dropped unreleased
//! releases itself in the background). On Postgres the lease is held
//! through its own database session, which shows the holder alive: a
//! standby takes over from a killed holder as soon as its renewal is
//! overdue, not at expiry (`gpusched_store::LeaseSession`).
//!
//! Must never: decide anything, hide a lost lease from its holder (a lost
//! lease is an error the holder must act on by stepping down), or judge
//! expiry by the local clock (the store judges it by the database's).
//! Holding a lease is never what keeps a stale writer out: every append
//! carries the lease's [`Fence`] and the log refuses a stale epoch.

use std::time::{Duration, Instant};

use gpusched_store::{Fence, Lease, StoreError};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::log::{Log, LogLeaseSession};

/// Which lease, for whom, for how long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSpec {
    /// The stage, e.g. `quota`.
    pub service: String,
    /// The partition it covers.
    pub partition: String,
    /// This instance's name, recorded in the lease.
    pub holder: String,
    /// Time to live: a standby takes over this long after the holder
    /// last renewed.
    pub ttl: Duration,
}

/// The lease is no longer this holder's: another instance took it over
/// (a later epoch), so every append under it is refused. Step down.
#[derive(Debug, thiserror::Error)]
#[error("lease {service}/{partition} lost at epoch {epoch}")]
pub struct LeaseLost {
    /// The stage.
    pub service: String,
    /// The partition.
    pub partition: String,
    /// The epoch this holder had.
    pub epoch: u64,
}

/// Whether a store error means the writer has been fenced off (another
/// epoch holds the lease, or it was never held).
pub fn is_fenced(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::StaleEpoch { .. } | StoreError::NoLease { .. } | StoreError::LeaseLost { .. }
    )
}

/// A lease this instance holds (module docs).
#[derive(Debug)]
pub struct Leader {
    /// The session the lease is held through; `None` once released or
    /// abandoned.
    session: Option<LogLeaseSession>,
    spec: LeaseSpec,
    lease: Lease,
    renewed: Instant,
}

/// Why one attempt did not take the lease: held elsewhere (`None`) or the
/// log failed; with the session, to close or to try again with.
type NotTaken = (LogLeaseSession, Option<StoreError>);

impl Leader {
    /// Takes the lease if it is free or expired (or overdue with its
    /// holder gone); `Ok(None)` while another holder keeps it.
    pub async fn try_take(log: &Log, spec: &LeaseSpec) -> Result<Option<Leader>, StoreError> {
        let session = log.lease_session(&spec.service, &spec.partition);
        match Leader::attempt(session, spec).await {
            Ok(leader) => Ok(Some(leader)),
            Err((session, e)) => {
                session.close().await;
                e.map_or(Ok(None), Err)
            }
        }
    }

    /// One attempt through `session`.
    async fn attempt(mut session: LogLeaseSession, spec: &LeaseSpec) -> Result<Leader, NotTaken> {
        match session.acquire(&spec.holder, spec.ttl).await {
            Ok(Some(lease)) => Ok(Leader {
                session: Some(session),
                spec: spec.clone(),
                lease,
                renewed: Instant::now(),
            }),
            Ok(None) => Err((session, None)),
            Err(e) => Err((session, Some(e))),
        }
    }

    /// Waits as standby until the lease is taken, asking every `poll`
    /// through one session; `None` on shutdown. An unreachable log is
    /// logged and retried.
    pub async fn wait_take(
        log: &Log,
        spec: &LeaseSpec,
        poll: Duration,
        shutdown: &CancellationToken,
    ) -> Option<Leader> {
        let mut candidate = Candidate::new(log, spec);
        loop {
            if shutdown.is_cancelled() {
                candidate.close().await;
                return None;
            }
            if let Some(leader) = candidate.try_take().await {
                return Some(leader);
            }
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(poll) => {}
            }
        }
    }

    /// The fence every append under this lease carries.
    pub fn fence(&self) -> Fence {
        self.lease.fence()
    }

    /// The epoch held.
    pub fn epoch(&self) -> u64 {
        self.lease.epoch
    }

    /// Whether a third of the time to live has passed since the last
    /// renewal.
    pub fn renewal_due(&self) -> bool {
        self.renewed.elapsed() >= self.spec.ttl / 3
    }

    /// Renews the lease if [`Leader::renewal_due`]. A log that cannot be
    /// reached is logged and tried again at the next call (appends are
    /// fenced whatever happens meanwhile); a lease taken over is
    /// [`LeaseLost`].
    pub async fn keep(&mut self) -> Result<(), LeaseLost> {
        if !self.renewal_due() {
            return Ok(());
        }
        self.renew().await
    }

    /// Renews the lease now (see [`Leader::keep`]).
    pub async fn renew(&mut self) -> Result<(), LeaseLost> {
        let Some(session) = self.session.as_mut() else {
            return Err(self.lost());
        };
        match session.renew(&self.lease, self.spec.ttl).await {
            Ok(lease) => {
                self.lease = lease;
                self.renewed = Instant::now();
                Ok(())
            }
            Err(e) if is_fenced(&e) => Err(self.lost()),
            Err(e) => {
                warn!(service = %self.spec.service, error = %e, "renewing the lease");
                Ok(())
            }
        }
    }

    /// The [`LeaseLost`] for this lease.
    pub fn lost(&self) -> LeaseLost {
        LeaseLost {
            service: self.spec.service.clone(),
            partition: self.spec.partition.clone(),
            epoch: self.lease.epoch,
        }
    }

    /// Gives the lease back so a standby can take it at once.
    pub async fn release(mut self) {
        let Some(mut session) = self.session.take() else {
            return;
        };
        match session.release(&self.lease).await {
            Ok(()) => {}
            // Already someone else's: nothing to give back.
            Err(e) if is_fenced(&e) => {}
            Err(e) => warn!(service = %self.spec.service, error = %e, "releasing the lease"),
        }
        session.close().await;
    }

    /// Drops a lease known to be lost, without trying to give it back.
    pub fn abandon(mut self) {
        if let Some(session) = self.session.take() {
            close_in_background(session, None);
        }
    }
}

/// Releases `lease` (when given) and closes `session` on the runtime, if
/// one is still there; a session dropped without it closes its
/// connection all the same.
fn close_in_background(mut session: LogLeaseSession, lease: Option<Lease>) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move {
            if let Some(lease) = lease {
                let _ = session.release(&lease).await;
            }
            session.close().await;
        });
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        // Dropped on an error path or with its future: give the lease back
        // in the background.
        if let Some(session) = self.session.take() {
            close_in_background(session, Some(self.lease.clone()));
        }
    }
}

/// An instance standing by for a lease, asking through one session for
/// as long as it waits (a standby that does other work between attempts,
/// such as folding the log, asks through this).
#[derive(Debug)]
pub struct Candidate {
    session: Option<LogLeaseSession>,
    spec: LeaseSpec,
    announced: bool,
}

impl Candidate {
    /// A candidate for `spec`'s lease on `log`; asks nothing yet.
    pub fn new(log: &Log, spec: &LeaseSpec) -> Candidate {
        Candidate {
            session: Some(log.lease_session(&spec.service, &spec.partition)),
            spec: spec.clone(),
            announced: false,
        }
    }

    /// One attempt: the lease, or `None` while another holder keeps it or
    /// the log cannot be reached (logged; try again later).
    pub async fn try_take(&mut self) -> Option<Leader> {
        let spec = &self.spec;
        let session = self.session.take()?;
        match Leader::attempt(session, spec).await {
            Ok(leader) => return Some(leader),
            Err((back, None)) => {
                self.session = Some(back);
                if !self.announced {
                    info!(service = %spec.service, partition = %spec.partition, "lease held elsewhere; standing by");
                    self.announced = true;
                }
            }
            Err((back, Some(e))) => {
                self.session = Some(back);
                warn!(service = %spec.service, error = %e, "cannot reach the log for the lease");
            }
        }
        None
    }

    /// Stops standing by, closing the session.
    pub async fn close(mut self) {
        if let Some(session) = self.session.take() {
            session.close().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_events::Event;
    use gpusched_store::NewEvent;

    fn spec(holder: &str, ttl_ms: u64) -> LeaseSpec {
        LeaseSpec {
            service: "quota".into(),
            partition: "default".into(),
            holder: holder.into(),
            ttl: Duration::from_millis(ttl_ms),
        }
    }

    fn event() -> Vec<NewEvent> {
        vec![NewEvent::new(Event::TopologyConfigured {
            levels: vec!["rack".into()],
        })]
    }

    #[tokio::test]
    async fn one_holder_at_a_time_and_a_takeover_fences_the_old_one() {
        let log = Log::Memory(crate::log::MemLog::new());
        let mut a = Leader::try_take(&log, &spec("a", 50))
            .await
            .unwrap()
            .unwrap();
        assert!(Leader::try_take(&log, &spec("b", 50))
            .await
            .unwrap()
            .is_none());
        // `a` stops renewing (paused); its lease lapses and `b` takes it.
        tokio::time::sleep(Duration::from_millis(80)).await;
        let b = Leader::try_take(&log, &spec("b", 50))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(b.epoch(), a.epoch() + 1);
        // `a` wakes on a view that lags: its append is refused, and
        // keeping the lease says it is lost.
        let refused = log.append(&event(), &a.fence()).await.unwrap_err();
        assert!(is_fenced(&refused), "{refused}");
        assert!(a.renew().await.is_err());
        assert_eq!(log.append(&event(), &b.fence()).await.unwrap().appended, 1);
        assert_eq!(log.read_from(0, 10).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn released_on_every_way_out() {
        let log = Log::Memory(crate::log::MemLog::new());
        let a = Leader::try_take(&log, &spec("a", 60_000))
            .await
            .unwrap()
            .unwrap();
        a.release().await;
        let b = Leader::try_take(&log, &spec("b", 60_000))
            .await
            .unwrap()
            .unwrap();
        // Dropped without a release (an error path): given back anyway.
        drop(b);
        tokio::task::yield_now().await;
        let shutdown = CancellationToken::new();
        let c = tokio::time::timeout(
            Duration::from_secs(5),
            Leader::wait_take(
                &log,
                &spec("c", 60_000),
                Duration::from_millis(5),
                &shutdown,
            ),
        )
        .await
        .unwrap();
        assert_eq!(c.map(|c| c.epoch()), Some(3));
    }

    #[tokio::test]
    async fn keep_renews_only_when_due() {
        let log = Log::Memory(crate::log::MemLog::new());
        let mut a = Leader::try_take(&log, &spec("a", 90))
            .await
            .unwrap()
            .unwrap();
        assert!(!a.renewal_due());
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_millis(30)).await;
            a.keep().await.unwrap();
        }
        // Kept alive well past one TTL: nobody else could take it.
        assert!(Leader::try_take(&log, &spec("b", 90))
            .await
            .unwrap()
            .is_none());
        let shutdown = CancellationToken::new();
        shutdown.cancel();
        assert!(
            Leader::wait_take(&log, &spec("b", 90), Duration::from_millis(5), &shutdown)
                .await
                .is_none()
        );
    }
}
