//! A read-only follower: keeps a shared [`Projection`] current for readers
//! (the gateway's queries, `gpusched dev`'s progress), with no lease and no
//! decisions. It starts from the newest good snapshot and, as the log
//! grows, writes snapshots for every service to start from: encoding the
//! state between two folds holds only its own folding (readers share the
//! lock), never a deciding service's loop.
//!
//! Must never: write to the log, or hold the projection's write lock while
//! waiting on I/O.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use gpusched_core::State;
use gpusched_events::Event;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::bus::{Bus, Feed, Incoming};
use crate::clock::wall_clock;
use crate::log::Log;
use crate::projection::Projection;
use crate::snapshots::{SnapshotPolicy, Writer};

/// A projection shared between one follower and many readers.
pub type SharedView = Arc<RwLock<Projection>>;

/// How a follower is doing, for readiness and health checks.
#[derive(Debug, Default)]
pub struct FollowerHealth {
    /// Set once the view has folded the whole log as it stood when the
    /// follower started: before that, the view cannot judge anything.
    pub caught_up: AtomicBool,
    /// When the log last answered a read, Unix milliseconds (0: never).
    pub log_ok_unix_ms: AtomicU64,
    /// When the log last failed a read, Unix milliseconds (0: never).
    pub log_failed_unix_ms: AtomicU64,
    /// Whether the bus is failing (the view follows the log alone).
    pub bus_down: AtomicBool,
    /// When the follower's loop last went round, Unix milliseconds.
    pub loop_unix_ms: AtomicU64,
}

impl FollowerHealth {
    /// Whether the view has caught up with the log once.
    pub fn is_caught_up(&self) -> bool {
        self.caught_up.load(Ordering::Relaxed)
    }

    /// Whether the log answered more recently than it failed.
    pub fn log_reachable(&self) -> bool {
        self.log_ok_unix_ms.load(Ordering::Relaxed)
            >= self.log_failed_unix_ms.load(Ordering::Relaxed)
    }

    /// Milliseconds since the loop last went round.
    pub fn loop_age_ms(&self) -> u64 {
        wall_clock()
            .0
            .saturating_sub(self.loop_unix_ms.load(Ordering::Relaxed))
    }
}

/// Reads the shared view (a poisoned lock still holds a consistent state:
/// folding never panics half-way through an event).
pub fn read_view(view: &SharedView) -> std::sync::RwLockReadGuard<'_, Projection> {
    view.read().unwrap_or_else(|p| p.into_inner())
}

fn write_view(view: &SharedView) -> std::sync::RwLockWriteGuard<'_, Projection> {
    view.write().unwrap_or_else(|p| p.into_inner())
}

/// Pause after the log failed a read before the follower tries again.
const LOG_RETRY: Duration = Duration::from_millis(250);

/// Follows the log into `view` until `shutdown`: subscribes to the bus
/// (when it answers), folds the log as it stands, then folds batches as
/// they come and reads the log for gaps and, every `tick`, for a tail the
/// bus missed; while the bus fails, reads the log's tail every
/// [`crate::DEGRADED_POLL`]. An unreachable log is retried, never the
/// end of following; `health` says how it goes.
#[allow(clippy::too_many_arguments)]
pub async fn follow(
    log: Log,
    bus: Bus,
    view: SharedView,
    tick: Duration,
    health: Arc<FollowerHealth>,
    snapshots: SnapshotPolicy,
    holder: String,
    shutdown: CancellationToken,
) {
    let mut feed = bus.feed_ephemeral().await.ok();
    if snapshots.load {
        start_from_snapshot(&log, &view).await;
    }
    let mut writer = Writer::new(snapshots, "follower", &holder, read_view(&view).seq());
    let mut last_poll = Instant::now();
    let mut read_now = true;
    while !shutdown.is_cancelled() {
        health.loop_unix_ms.store(wall_clock().0, Ordering::Relaxed);
        if read_now || last_poll.elapsed() >= tick {
            last_poll = Instant::now();
            if !read_tail(&log, &view, &health).await {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(LOG_RETRY) => {}
                }
                continue;
            }
        }
        let received = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = receive(&bus, &mut feed, &health) => r,
        };
        read_now = fold_received(&view, received);
        if health.is_caught_up() {
            let p = read_view(&view);
            writer.tick(&log, p.state(), p.seq());
        }
    }
}

/// An empty view starts at the newest good snapshot, if there is one: the
/// first read of the log then folds only what came after it.
async fn start_from_snapshot(log: &Log, view: &SharedView) {
    if read_view(view).seq() > 0 {
        return;
    }
    if let Some((snap, _)) = crate::snapshots::load_newest(log, "follower").await {
        let mut p = write_view(view);
        if p.seq() == 0 {
            p.restart_at(snap.state, snap.seq);
        }
    }
}

/// What one read from the bus gave: batches, or `None` when the log must
/// be read (the bus failed, dropped messages, carried one this build cannot
/// read, or left a gap waiting).
fn fold_received(view: &SharedView, received: Option<Vec<Incoming>>) -> bool {
    let Some(items) = received else { return true };
    let mut noop = |_: &State, _: u64, _: &Event, _: bool| {};
    let mut p = write_view(view);
    let mut need_read = false;
    for item in items {
        match item {
            Incoming::Batch(b, _) => {
                p.offer(b, &mut noop);
            }
            Incoming::Malformed(why) => {
                // What it held may be missing: the log has it.
                warn!(%why, "malformed message skipped");
                need_read = true;
            }
            Incoming::Lagged => need_read = true,
        }
    }
    need_read
        || p.gap_since()
            .is_some_and(|t| t.elapsed() >= Duration::from_millis(20))
}

/// Waits up to 50 ms for batches; `None` when the bus failed (after a
/// pause of [`crate::DEGRADED_POLL`]).
async fn receive(
    bus: &Bus,
    feed: &mut Option<Feed>,
    health: &FollowerHealth,
) -> Option<Vec<Incoming>> {
    if feed.is_none() {
        *feed = bus.feed_ephemeral().await.ok();
    }
    let got = match feed.as_mut() {
        Some(f) => f.next(1024, Duration::from_millis(50)).await.ok(),
        None => None,
    };
    let down = got.is_none();
    if health.bus_down.swap(down, Ordering::Relaxed) != down {
        if down {
            warn!("bus failing; the view follows the log");
        } else {
            info!("bus answering again");
        }
    }
    if down {
        tokio::time::sleep(crate::stage::DEGRADED_POLL).await;
    }
    got
}

/// Reads the log's tail into the view; records the outcome in `health`
/// (the first full read marks the view caught up). False: the log failed.
async fn read_tail(log: &Log, view: &SharedView, health: &FollowerHealth) -> bool {
    let mut noop = |_: &State, _: u64, _: &Event, _: bool| {};
    match fold_log_tail(log, view, &mut noop).await {
        Ok(()) => {
            health
                .log_ok_unix_ms
                .store(wall_clock().0, Ordering::Relaxed);
            if !health.caught_up.swap(true, Ordering::Relaxed) {
                info!(seq = read_view(view).seq(), "view caught up with the log");
            }
            true
        }
        Err(e) => {
            let now = wall_clock().0;
            if health.log_failed_unix_ms.swap(now, Ordering::Relaxed)
                <= health.log_ok_unix_ms.load(Ordering::Relaxed)
            {
                warn!(error = %e, "cannot read the log; the view is stale until it answers");
            }
            false
        }
    }
}

/// Folds the log after the view's position into it, page by page (the
/// next read while one is folded), without holding the lock across a
/// read; then folds waiting batches that became contiguous. Events the
/// bus brought meanwhile are skipped (`fold_one` takes only the next).
async fn fold_log_tail(
    log: &Log,
    view: &SharedView,
    observe: &mut crate::projection::Observer<'_>,
) -> anyhow::Result<()> {
    const PAGE: usize = 10_000;
    let from = read_view(view).seq();
    let mut pages = log.pages(from, gpusched_store::SEQ_MAX, PAGE);
    while let Some(page) = pages.next().await {
        let page = page?;
        let mut p = write_view(view);
        for le in page {
            p.fold_one(le.seq, &le.event, observe);
        }
        p.settle(observe);
    }
    Ok(())
}
