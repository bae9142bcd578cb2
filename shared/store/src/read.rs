//! Reads for folding: the log in sequence order with only what a fold
//! needs (sequence, time, event), a page ahead of the folder.
//!
//! Owns: the lean read (`read_entries`) and the read-ahead (`Pages`): a task
//! that fetches and decodes the next pages while the caller folds the
//! current one, so the database, the decoder and the fold each keep a core
//! busy instead of taking turns.
//!
//! Must never: reorder, skip or repeat an event; read past the bound it was
//! given, or stretch a bound it cannot bind (one above `SEQ_MAX` is
//! `StoreError::OutOfRange`); outlive its caller (dropping `Pages` stops
//! the task).

use chrono::{DateTime, Utc};
use gpusched_events::Event;
use sqlx::Row;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::error::{from_bigint, to_bigint};
use crate::{decode_payload, EventStore, Result};

/// Pages fetched ahead of the folder: enough to keep the database busy
/// while one page is folded, few enough to bound memory (a page is
/// `REPLAY_PAGE` events).
const PAGES_AHEAD: usize = 2;

/// An event as a fold needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct LogEntry {
    /// Global sequence: the order of the log.
    pub seq: u64,
    /// When it was recorded (database clock).
    pub recorded_at: DateTime<Utc>,
    /// The event.
    pub event: Event,
}

impl EventStore {
    /// Up to `limit` events with `after_seq` < sequence ≤ `upto_seq`, in
    /// order, without their delivery metadata (`read_from` has it).
    /// `upto_seq` = `SEQ_MAX` reads to the end of the log.
    pub async fn read_entries(
        &self,
        after_seq: u64,
        upto_seq: u64,
        limit: usize,
    ) -> Result<Vec<LogEntry>> {
        let (after, upto) = (
            to_bigint("events.seq", after_seq)?,
            to_bigint("events.seq", upto_seq)?,
        );
        let rows = sqlx::query(
            "SELECT seq, recorded_at, schema_version, payload::text
               FROM events WHERE seq > $1 AND seq <= $2 ORDER BY seq LIMIT $3",
        )
        .bind(after)
        .bind(upto)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|row| {
                let seq = from_bigint("events.seq", row.try_get(0)?)?;
                let event = decode_payload(seq, row.try_get(2)?, row.try_get(3)?)?;
                Ok(LogEntry {
                    seq,
                    recorded_at: row.try_get(1)?,
                    event,
                })
            })
            .collect()
    }

    /// The events after `after_seq` up to `upto_seq`, in pages of `page`
    /// events, read ahead of the caller (module docs). A bound above
    /// `SEQ_MAX` makes the first page `StoreError::OutOfRange`.
    pub fn pages(&self, after_seq: u64, upto_seq: u64, page: usize) -> Pages {
        let (tx, rx) = mpsc::channel(PAGES_AHEAD);
        let store = self.clone();
        let page = page.max(1);
        let task = tokio::spawn(async move {
            let bounds =
                to_bigint("events.seq", after_seq).and_then(|_| to_bigint("events.seq", upto_seq));
            if let Err(e) = bounds {
                let _ = tx.send(Err(e)).await;
                return;
            }
            let mut after = after_seq;
            while after < upto_seq {
                let read = store.read_entries(after, upto_seq, page).await;
                let (last, full) = match &read {
                    Ok(entries) => (entries.last().map(|e| e.seq), entries.len() == page),
                    Err(_) => (None, false),
                };
                if tx.send(read).await.is_err() || !full {
                    return;
                }
                match last {
                    Some(seq) => after = seq,
                    None => return,
                }
            }
        });
        Pages { rx, task }
    }
}

/// The log's pages in order, read ahead by a task (`EventStore::pages`).
/// The last page is the first one shorter than the page size; an error
/// ends the pages.
#[derive(Debug)]
pub struct Pages {
    rx: mpsc::Receiver<Result<Vec<LogEntry>>>,
    task: JoinHandle<()>,
}

impl Pages {
    /// The next page; `None` after the last one (or after an error).
    pub async fn next(&mut self) -> Option<Result<Vec<LogEntry>>> {
        self.rx.recv().await
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        self.task.abort();
    }
}
