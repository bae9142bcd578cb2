//! Snapshots in Postgres: the `snapshots` table, written beside the log
//! and read back at a start (the encoding and its checks are
//! `gpusched_core::snapshot`).
//!
//! Owns: saving a snapshot once per sequence, listing them, finding the
//! newest one that passes every check (and why each newer one did not),
//! and pruning old ones.
//!
//! Must never: return a snapshot that failed a check, one past the end of
//! the log (a log restored from an older backup), or touch the `events`
//! table: snapshots are a cache of the log, and deleting every row only
//! makes the next start slower. Never read a negative `seq` as anything
//! but `StoreError::Corrupt`, or clamp one it cannot bind.

use chrono::{DateTime, Utc};
use gpusched_core::snapshot::{self, Snapshot, SnapshotError};
use sqlx::Row;

use crate::error::{from_bigint, to_bigint};
use crate::{EventStore, Result};

/// A stored snapshot, without its body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// The sequence of the last event folded into it.
    pub seq: u64,
    /// Its encoding's version.
    pub format: u16,
    /// The state hash it was written with.
    pub state_hash: String,
    /// Its size.
    pub bytes: u64,
    /// The instance that wrote it.
    pub taken_by: String,
    /// When it was written.
    pub taken_at: DateTime<Utc>,
}

/// A stored snapshot that was passed over, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Skipped {
    /// Its sequence.
    pub seq: u64,
    /// Why it was not used.
    pub why: SkipReason,
}

/// Why a stored snapshot was not used.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SkipReason {
    /// It failed a check of its encoding.
    #[error(transparent)]
    Check(#[from] SnapshotError),
    /// It is ahead of the log (the log was restored from an older backup).
    #[error("snapshot at {seq} is past the log's end at {log_end}")]
    PastLogEnd {
        /// Its sequence.
        seq: u64,
        /// The log's last sequence.
        log_end: u64,
    },
}

/// What a look for a snapshot found.
#[derive(Debug, Default)]
pub struct Found {
    /// The newest snapshot that passed every check, with its row.
    pub snapshot: Option<(Snapshot, SnapshotInfo)>,
    /// The newer ones passed over.
    pub skipped: Vec<Skipped>,
}

fn info_from_row(row: &sqlx::postgres::PgRow) -> Result<SnapshotInfo> {
    Ok(SnapshotInfo {
        seq: from_bigint("snapshots.seq", row.try_get("seq")?)?,
        format: u16::try_from(row.try_get::<i32, _>("format")?).unwrap_or(u16::MAX),
        state_hash: row.try_get("state_hash")?,
        bytes: from_bigint("snapshots.bytes", row.try_get("bytes")?)?,
        taken_by: row.try_get("taken_by")?,
        taken_at: row.try_get("taken_at")?,
    })
}

impl EventStore {
    /// Saves an encoded snapshot (`snapshot::encode`), once per sequence
    /// and format; returns whether this call wrote it. Bytes that are not
    /// a snapshot are refused before anything is written.
    pub async fn save_snapshot(&self, body: &[u8], taken_by: &str) -> Result<bool> {
        let h = snapshot::header(body).map_err(crate::StoreError::Snapshot)?;
        let done = sqlx::query(
            "INSERT INTO snapshots (seq, format, state_hash, bytes, taken_by, body)
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (seq, format) DO NOTHING",
        )
        .bind(to_bigint("snapshots.seq", h.seq)?)
        .bind(i32::from(h.format))
        .bind(&h.state_hash)
        .bind(i64::try_from(body.len()).unwrap_or(i64::MAX))
        .bind(taken_by)
        .bind(body)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Every stored snapshot, newest first, without bodies.
    pub async fn snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        let rows = sqlx::query(
            "SELECT seq, format, state_hash, bytes, taken_by, taken_at
               FROM snapshots ORDER BY seq DESC, format DESC",
        )
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(info_from_row).collect()
    }

    /// The newest snapshot at or before `log_end` that this build reads
    /// and that passes every check; newer ones that fail are listed with
    /// the reason. Bodies are fetched one at a time, newest first.
    pub async fn newest_snapshot(&self, log_end: u64) -> Result<Found> {
        let mut found = Found::default();
        for info in self.snapshots().await? {
            if info.seq > log_end {
                found.skipped.push(Skipped {
                    seq: info.seq,
                    why: SkipReason::PastLogEnd {
                        seq: info.seq,
                        log_end,
                    },
                });
                continue;
            }
            if info.format != snapshot::FORMAT {
                found.skipped.push(Skipped {
                    seq: info.seq,
                    why: SnapshotError::UnknownFormat { found: info.format }.into(),
                });
                continue;
            }
            let Some(body) = self.snapshot_body(info.seq, info.format).await? else {
                continue; // pruned meanwhile
            };
            match snapshot::decode(&body) {
                Ok(s) => {
                    found.snapshot = Some((s, info));
                    return Ok(found);
                }
                Err(e) => found.skipped.push(Skipped {
                    seq: info.seq,
                    why: e.into(),
                }),
            }
        }
        Ok(found)
    }

    /// The body of one stored snapshot.
    pub async fn snapshot_body(&self, seq: u64, format: u16) -> Result<Option<Vec<u8>>> {
        let body = sqlx::query_scalar("SELECT body FROM snapshots WHERE seq = $1 AND format = $2")
            .bind(to_bigint("snapshots.seq", seq)?)
            .bind(i32::from(format))
            .fetch_optional(self.pool())
            .await?;
        Ok(body)
    }

    /// Keeps the newest `keep` snapshots of this build's format (at least
    /// one) and deletes every snapshot older than the oldest kept; returns
    /// how many were deleted.
    pub async fn prune_snapshots(&self, keep: usize) -> Result<u64> {
        let done = sqlx::query(
            "WITH kept AS (SELECT seq FROM snapshots WHERE format = $1
                            ORDER BY seq DESC LIMIT $2)
             DELETE FROM snapshots WHERE seq < (SELECT min(seq) FROM kept)",
        )
        .bind(i32::from(snapshot::FORMAT))
        .bind(i64::try_from(keep.max(1)).unwrap_or(i64::MAX))
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected())
    }
}
