//! The event log as services see it: Postgres in production, an in-memory
//! log with the same contract in `gpusched dev`.
//!
//! The in-memory log keeps the Postgres log's rules in one critical
//! section: dense sequence numbers, a fence check before anything is
//! written, idempotency keys checked in the same step, leases with epochs
//! that only grow. It needs no service and no dependency; what it lacks is
//! durability, which `gpusched dev` does not promise.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::Utc;
use gpusched_core::snapshot;
use gpusched_events::Event;
use gpusched_store::{
    AppendOutcome, EventStore, Fence, Found, Lease, NewEvent, Result, SkipReason, Skipped,
    SnapshotInfo, StoreError, SEQ_MAX,
};

/// An event with its place in the log.
#[derive(Clone, Debug, PartialEq)]
pub struct LoggedEvent {
    /// Its sequence number (dense, from 1).
    pub seq: u64,
    /// The event.
    pub event: Event,
}

/// The event log.
#[derive(Clone, Debug)]
pub enum Log {
    /// The durable log in Postgres.
    Postgres(EventStore),
    /// The embedded log of `gpusched dev`.
    Memory(MemLog),
}

impl From<gpusched_store::StoredEvent> for LoggedEvent {
    fn from(e: gpusched_store::StoredEvent) -> Self {
        LoggedEvent {
            seq: e.seq,
            event: e.event,
        }
    }
}

impl From<gpusched_store::LogEntry> for LoggedEvent {
    fn from(e: gpusched_store::LogEntry) -> Self {
        LoggedEvent {
            seq: e.seq,
            event: e.event,
        }
    }
}

/// Rows read from the store as the runtime's events.
fn logged<E: Into<LoggedEvent>>(events: Vec<E>) -> Vec<LoggedEvent> {
    events.into_iter().map(Into::into).collect()
}

/// The log after a sequence up to a bound, page by page (`Log::pages`):
/// Postgres reads a page ahead of the caller; the in-memory log has
/// nothing to wait for.
#[derive(Debug)]
pub enum LogPages {
    /// Pages read ahead by the store.
    Postgres(gpusched_store::Pages),
    /// Pages cut from the in-memory log.
    Memory {
        /// The log.
        log: MemLog,
        /// The last sequence handed out.
        after: u64,
        /// The last sequence to hand out.
        upto: u64,
        /// Events per page.
        page: usize,
    },
}

impl LogPages {
    /// The next page; `None` after the last one (a page shorter than the
    /// page size) or after an error.
    pub async fn next(&mut self) -> Option<Result<Vec<LoggedEvent>>> {
        match self {
            LogPages::Postgres(p) => p.next().await.map(|r| r.map(logged)),
            LogPages::Memory {
                log,
                after,
                upto,
                page,
            } => {
                if *after >= *upto {
                    return None;
                }
                let mut got = log.read_from(*after, *page);
                got.retain(|le| le.seq <= *upto);
                *after = match (got.len() == *page, got.last()) {
                    (true, Some(last)) => last.seq,
                    _ => u64::MAX,
                };
                Some(Ok(got))
            }
        }
    }
}

impl Log {
    /// Appends a batch under a fence in one step (see `EventStore::append`).
    pub async fn append(&self, batch: &[NewEvent], fence: &Fence) -> Result<AppendOutcome> {
        match self {
            Log::Postgres(s) => s.append(batch, fence).await,
            Log::Memory(m) => m.append(batch, fence),
        }
    }

    /// Up to `limit` events after `after`, in order.
    pub async fn read_from(&self, after: u64, limit: usize) -> Result<Vec<LoggedEvent>> {
        match self {
            Log::Postgres(s) => Ok(logged(s.read_entries(after, SEQ_MAX, limit).await?)),
            Log::Memory(m) => Ok(m.read_from(after, limit)),
        }
    }

    /// The events after `after` up to `upto` (`SEQ_MAX`: to the end; the
    /// Postgres log refuses a bound above it, `StoreError::OutOfRange`), in
    /// pages of `page` events (see `LogPages`).
    pub fn pages(&self, after: u64, upto: u64, page: usize) -> LogPages {
        match self {
            Log::Postgres(s) => LogPages::Postgres(s.pages(after, upto, page)),
            Log::Memory(m) => LogPages::Memory {
                log: m.clone(),
                after,
                upto,
                page: page.max(1),
            },
        }
    }

    /// Every event of one job, in order. Postgres reads it by the job's
    /// aggregate index; the in-memory log scans.
    pub async fn job_events(&self, job: gpusched_model::JobId) -> Result<Vec<LoggedEvent>> {
        match self {
            Log::Postgres(s) => Ok(logged(s.job_events(job).await?)),
            Log::Memory(m) => Ok(m.matching(|e| e.job() == Some(job))),
        }
    }

    /// The preemption plans that chose `job` as a victim, in order.
    pub async fn plans_naming_victim(
        &self,
        job: gpusched_model::JobId,
    ) -> Result<Vec<LoggedEvent>> {
        match self {
            Log::Postgres(s) => Ok(logged(s.plans_naming_victim(job).await?)),
            Log::Memory(m) => Ok(m.matching(|e| match e {
                Event::PreemptionPlanned { victims, .. } => victims.iter().any(|v| v.job == job),
                _ => false,
            })),
        }
    }

    /// The last sequence number (0: empty).
    pub async fn max_seq(&self) -> Result<u64> {
        match self {
            Log::Postgres(s) => s.max_seq().await,
            Log::Memory(m) => Ok(m.lock().events.len() as u64),
        }
    }

    /// The events carrying these idempotency keys, by key.
    pub async fn events_by_keys(&self, keys: &[String]) -> Result<HashMap<String, LoggedEvent>> {
        match self {
            Log::Postgres(s) => Ok(s
                .events_by_keys(keys)
                .await?
                .into_iter()
                .map(|(k, e)| {
                    (
                        k,
                        LoggedEvent {
                            seq: e.seq,
                            event: e.event,
                        },
                    )
                })
                .collect()),
            Log::Memory(m) => {
                let g = m.lock();
                Ok(keys
                    .iter()
                    .filter_map(|k| {
                        let seq = *g.keys.get(k)?;
                        let event = g.events.get(usize::try_from(seq - 1).ok()?)?.clone();
                        Some((k.clone(), LoggedEvent { seq, event }))
                    })
                    .collect())
            }
        }
    }

    /// `n` job ids never handed out before.
    pub async fn allocate_job_ids(&self, n: u32) -> Result<Vec<u64>> {
        match self {
            Log::Postgres(s) => s.allocate_job_ids(n).await,
            Log::Memory(m) => {
                let mut g = m.lock();
                let first = g.next_job_id.max(1);
                g.next_job_id = first + u64::from(n);
                Ok((first..first + u64::from(n)).collect())
            }
        }
    }

    /// The sequence of the last event of `producer` at or before `upto`
    /// (0: none).
    pub async fn last_seq_of(&self, producer: gpusched_events::Producer, upto: u64) -> Result<u64> {
        match self {
            Log::Postgres(s) => {
                s.last_seq_of(gpusched_store::producer_name(producer), upto)
                    .await
            }
            Log::Memory(m) => {
                let g = m.lock();
                let end = usize::try_from(upto)
                    .unwrap_or(usize::MAX)
                    .min(g.events.len());
                Ok(g.events[..end]
                    .iter()
                    .rposition(|e| e.producer() == producer)
                    .map_or(0, |i| i as u64 + 1))
            }
        }
    }

    /// Saves an encoded snapshot (once per sequence) and prunes all but the
    /// newest `keep`; returns whether this call wrote it.
    pub async fn save_snapshot(&self, body: &[u8], taken_by: &str, keep: usize) -> Result<bool> {
        match self {
            Log::Postgres(s) => {
                let written = s.save_snapshot(body, taken_by).await?;
                s.prune_snapshots(keep).await?;
                Ok(written)
            }
            Log::Memory(m) => m.save_snapshot(body, keep),
        }
    }

    /// The sequence of the newest snapshot of this build's format (0: none).
    pub async fn newest_snapshot_seq(&self) -> Result<u64> {
        match self {
            Log::Postgres(s) => Ok(s
                .snapshots()
                .await?
                .iter()
                .find(|i| i.format == snapshot::FORMAT)
                .map_or(0, |i| i.seq)),
            Log::Memory(m) => Ok(m.lock().snapshots.keys().next_back().copied().unwrap_or(0)),
        }
    }

    /// The newest snapshot at or before `log_end` that passes every check,
    /// and the newer ones passed over (see `EventStore::newest_snapshot`).
    pub async fn newest_snapshot(&self, log_end: u64) -> Result<Found> {
        match self {
            Log::Postgres(s) => s.newest_snapshot(log_end).await,
            Log::Memory(m) => Ok(m.newest_snapshot(log_end)),
        }
    }

    /// A session for the lease of `service`/`partition`: how a
    /// [`crate::Leader`] takes, keeps and gives back its lease.
    pub fn lease_session(&self, service: &str, partition: &str) -> LogLeaseSession {
        match self {
            Log::Postgres(s) => LogLeaseSession::Postgres(s.lease_session(service, partition)),
            Log::Memory(m) => LogLeaseSession::Memory {
                log: m.clone(),
                service: service.to_string(),
                partition: partition.to_string(),
            },
        }
    }
}

/// A lease session on either log. On Postgres it is a dedicated session
/// whose lock shows the holder alive, so a standby takes over from a
/// killed holder early (`gpusched_store::LeaseSession`); in memory, one
/// process holds every lease and only expiry frees one.
#[derive(Debug)]
pub enum LogLeaseSession {
    /// On the durable log.
    Postgres(gpusched_store::LeaseSession),
    /// On the embedded log.
    Memory {
        /// The log.
        log: MemLog,
        /// The lease's service.
        service: String,
        /// The lease's partition.
        partition: String,
    },
}

impl LogLeaseSession {
    /// Takes the lease if free or expired (or, on Postgres, overdue with
    /// its holder gone); `None` while another holder keeps it.
    pub async fn acquire(&mut self, holder: &str, ttl: Duration) -> Result<Option<Lease>> {
        match self {
            LogLeaseSession::Postgres(s) => s.acquire(holder, ttl).await,
            LogLeaseSession::Memory {
                log,
                service,
                partition,
            } => Ok(log.acquire(service, partition, holder, ttl)),
        }
    }

    /// Extends a held lease.
    pub async fn renew(&mut self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        match self {
            LogLeaseSession::Postgres(s) => s.renew(lease, ttl).await,
            LogLeaseSession::Memory { log, .. } => log.renew(lease, ttl),
        }
    }

    /// Gives a held lease up.
    pub async fn release(&mut self, lease: &Lease) -> Result<()> {
        match self {
            LogLeaseSession::Postgres(s) => s.release(lease).await,
            LogLeaseSession::Memory { log, .. } => log.release(lease),
        }
    }

    /// Ends the session (on Postgres, closing its connection).
    pub async fn close(self) {
        if let LogLeaseSession::Postgres(s) = self {
            s.close().await;
        }
    }
}

#[derive(Debug, Default)]
struct MemInner {
    events: Vec<Event>,
    keys: HashMap<String, u64>,
    leases: HashMap<(String, String), Lease>,
    next_job_id: u64,
    /// Encoded snapshots, with when they were saved, by sequence.
    snapshots: std::collections::BTreeMap<u64, (Vec<u8>, chrono::DateTime<Utc>)>,
}

/// The embedded in-memory log (module docs).
#[derive(Clone, Debug, Default)]
pub struct MemLog {
    inner: Arc<Mutex<MemInner>>,
}

fn lost(lease: &Lease) -> StoreError {
    StoreError::LeaseLost {
        service: lease.service.clone(),
        partition: lease.partition.clone(),
        epoch: lease.epoch,
        holder: lease.holder.clone(),
    }
}

fn expiry(ttl: Duration) -> chrono::DateTime<Utc> {
    Utc::now() + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX)
}

impl MemLog {
    /// Every event `keep` picks, with its sequence number (a scan).
    fn matching(&self, keep: impl Fn(&Event) -> bool) -> Vec<LoggedEvent> {
        self.lock()
            .events
            .iter()
            .enumerate()
            .filter(|(_, e)| keep(e))
            .map(|(i, e)| LoggedEvent {
                seq: i as u64 + 1,
                event: e.clone(),
            })
            .collect()
    }

    /// An empty log.
    pub fn new() -> Self {
        MemLog::default()
    }

    fn lock(&self) -> MutexGuard<'_, MemInner> {
        // A panic while holding the lock cannot leave the log half-written
        // (each step checks before it writes), so a poisoned lock is usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every event, in order.
    pub fn events(&self) -> Vec<Event> {
        self.lock().events.clone()
    }

    fn append(&self, batch: &[NewEvent], fence: &Fence) -> Result<AppendOutcome> {
        let mut g = self.lock();
        let key = (fence.service.clone(), fence.partition.clone());
        match g.leases.get(&key) {
            None => {
                return Err(StoreError::NoLease {
                    service: fence.service.clone(),
                    partition: fence.partition.clone(),
                })
            }
            Some(l) if l.epoch != fence.epoch => {
                return Err(StoreError::StaleEpoch {
                    service: fence.service.clone(),
                    partition: fence.partition.clone(),
                    held: Some(l.epoch),
                    given: fence.epoch,
                })
            }
            Some(_) => {}
        }
        let mut seqs = Vec::with_capacity(batch.len());
        for ne in batch {
            if let Some(k) = &ne.idempotency_key {
                if g.keys.contains_key(k) {
                    seqs.push(None);
                    continue;
                }
            }
            g.events.push(ne.event.clone());
            let seq = g.events.len() as u64;
            if let Some(k) = &ne.idempotency_key {
                g.keys.insert(k.clone(), seq);
            }
            seqs.push(Some(seq));
        }
        let appended = seqs.iter().flatten().count() as u64;
        Ok(AppendOutcome {
            first_seq: seqs.iter().flatten().min().copied(),
            last_seq: seqs.iter().flatten().max().copied(),
            appended,
            duplicates: batch.len() as u64 - appended,
            seqs,
        })
    }

    fn save_snapshot(&self, body: &[u8], keep: usize) -> Result<bool> {
        let h = snapshot::header(body).map_err(StoreError::Snapshot)?;
        let mut g = self.lock();
        let written = !g.snapshots.contains_key(&h.seq);
        g.snapshots
            .entry(h.seq)
            .or_insert_with(|| (body.to_vec(), Utc::now()));
        while g.snapshots.len() > keep.max(1) {
            g.snapshots.pop_first();
        }
        Ok(written)
    }

    fn newest_snapshot(&self, log_end: u64) -> Found {
        let g = self.lock();
        let mut found = Found::default();
        for (&seq, (body, taken_at)) in g.snapshots.iter().rev() {
            if seq > log_end {
                found.skipped.push(Skipped {
                    seq,
                    why: SkipReason::PastLogEnd { seq, log_end },
                });
                continue;
            }
            match snapshot::decode(body) {
                Ok(snap) => {
                    let info = SnapshotInfo {
                        seq,
                        format: snapshot::FORMAT,
                        state_hash: snap.state.state_hash(),
                        bytes: body.len() as u64,
                        taken_by: "memory".to_string(),
                        taken_at: *taken_at,
                    };
                    found.snapshot = Some((snap, info));
                    return found;
                }
                Err(e) => found.skipped.push(Skipped { seq, why: e.into() }),
            }
        }
        found
    }

    fn read_from(&self, after: u64, limit: usize) -> Vec<LoggedEvent> {
        let g = self.lock();
        let start = usize::try_from(after)
            .unwrap_or(usize::MAX)
            .min(g.events.len());
        g.events[start..]
            .iter()
            .take(limit)
            .enumerate()
            .map(|(i, e)| LoggedEvent {
                seq: (start + i + 1) as u64,
                event: e.clone(),
            })
            .collect()
    }

    fn acquire(
        &self,
        service: &str,
        partition: &str,
        holder: &str,
        ttl: Duration,
    ) -> Option<Lease> {
        let mut g = self.lock();
        let key = (service.to_string(), partition.to_string());
        let epoch = match g.leases.get(&key) {
            Some(l) if l.expires_at > Utc::now() => return None,
            Some(l) => l.epoch + 1,
            None => 1,
        };
        let lease = Lease {
            service: service.to_string(),
            partition: partition.to_string(),
            holder: holder.to_string(),
            epoch,
            expires_at: expiry(ttl),
        };
        g.leases.insert(key, lease.clone());
        Some(lease)
    }

    fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let mut g = self.lock();
        let key = (lease.service.clone(), lease.partition.clone());
        match g.leases.get_mut(&key) {
            Some(l) if l.epoch == lease.epoch && l.holder == lease.holder => {
                l.expires_at = expiry(ttl);
                Ok(l.clone())
            }
            _ => Err(lost(lease)),
        }
    }

    fn release(&self, lease: &Lease) -> Result<()> {
        let mut g = self.lock();
        let key = (lease.service.clone(), lease.partition.clone());
        match g.leases.get_mut(&key) {
            Some(l) if l.epoch == lease.epoch && l.holder == lease.holder => {
                l.expires_at = l.expires_at.min(Utc::now());
                Ok(())
            }
            _ => Err(lost(lease)),
        }
    }
}
