//! A read-only follower: keeps a shared [`Projection`] current for readers
//! (the gateway's queries, `gpusched dev`'s progress), with no lease and no
//! decisions.
//!
//! Must never: write to the log, or hold the projection's write lock while
//! waiting on I/O.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use gpusched_core::State;
use gpusched_events::Event;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::bus::{Bus, Incoming};
use crate::log::Log;
use crate::projection::Projection;

/// A projection shared between one follower and many readers.
pub type SharedView = Arc<RwLock<Projection>>;

/// Reads the shared view (a poisoned lock still holds a consistent state:
/// folding never panics half-way through an event).
pub fn read_view(view: &SharedView) -> std::sync::RwLockReadGuard<'_, Projection> {
    view.read().unwrap_or_else(|p| p.into_inner())
}

fn write_view(view: &SharedView) -> std::sync::RwLockWriteGuard<'_, Projection> {
    view.write().unwrap_or_else(|p| p.into_inner())
}

/// Follows the log into `view` until `shutdown`: subscribes to the bus,
/// folds the log as it stands, then folds batches as they come and reads
/// the log for gaps and, every `tick`, for a tail the bus missed.
pub async fn follow(
    log: Log,
    bus: Bus,
    view: SharedView,
    tick: Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut feed = bus.feed_ephemeral().await?;
    let mut noop = |_: &State, _: u64, _: &Event, _: bool| {};
    fold_log_tail(&log, &view, &mut noop).await?;
    let gap_wait = Duration::from_millis(20);
    let mut last_poll = Instant::now();
    loop {
        let incoming = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            r = feed.next(1024, Duration::from_millis(50)) => r,
        };
        let mut need_read = false;
        match incoming {
            Ok(items) => {
                let mut p = write_view(&view);
                for item in items {
                    match item {
                        Incoming::Batch(b, _) => {
                            p.offer(b, &mut noop);
                        }
                        Incoming::Malformed(why) => warn!(%why, "malformed message skipped"),
                        Incoming::Lagged => need_read = true,
                    }
                }
            }
            Err(e) => {
                warn!(error = %e, "bus read failed; reading the log");
                need_read = true;
            }
        }
        let gap_due = read_view(&view)
            .gap_since()
            .is_some_and(|t| t.elapsed() >= gap_wait);
        if need_read || gap_due || last_poll.elapsed() >= tick {
            last_poll = Instant::now();
            fold_log_tail(&log, &view, &mut noop).await?;
        }
    }
}

/// Folds the log after the view's position into it, page by page, without
/// holding the lock across a read; then folds waiting batches that became
/// contiguous.
async fn fold_log_tail(
    log: &Log,
    view: &SharedView,
    observe: &mut crate::projection::Observer<'_>,
) -> anyhow::Result<()> {
    const PAGE: usize = 10_000;
    loop {
        let from = read_view(view).seq();
        let page = log.read_from(from, PAGE).await?;
        let n = page.len();
        let mut p = write_view(view);
        for le in page {
            p.fold_one(le.seq, &le.event, observe);
        }
        p.settle(observe);
        if n < PAGE {
            return Ok(());
        }
    }
}
