//! Snapshots in running services over the real Postgres log: a hot standby
//! and a read-only follower write them as the log grows, a leader never
//! does; a restart loads the newest and folds only the events after it,
//! then decides on from there (nothing decided twice or missed); a damaged
//! snapshot is skipped for an older one.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::stage::{decisions, submit, wait_decided, Instance};
use gpusched_core::snapshot;
use std::sync::{Arc, RwLock};

use gpusched_runtime::{
    follow, read_view, Bus, FollowerHealth, Log, Projection, SharedView, SnapshotPolicy,
};
use gpusched_store::testing::TestDb;
use gpusched_store::Until;
use tokio_util::sync::CancellationToken;

fn start(log: &Log, bus: &Bus, holder: &str) -> Instance {
    Instance::start(log, bus, holder, |cfg| {
        cfg.snapshots = SnapshotPolicy {
            every_events: 500,
            every: Duration::from_secs(3600),
            keep: 2,
            load: true,
        }
    })
}

async fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn newest_snapshot_seq(db: &TestDb) -> u64 {
    db.store
        .snapshots()
        .await
        .unwrap()
        .first()
        .map_or(0, |s| s.seq)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_folds_only_what_came_after_the_newest_snapshot() {
    let db = TestDb::new().await;
    let log = Log::Postgres(db.store.clone());
    let bus = Bus::memory();

    let a = start(&log, &bus, "a");
    wait_for("a leads", || {
        a.stats.leading_epoch.load(Ordering::Relaxed) > 0
    })
    .await;
    let b = start(&log, &bus, "b");
    for round in 0..6 {
        submit(&log, 1 + round * 200, 200).await;
    }
    assert_eq!(wait_decided(&log, 1200).await.len(), 1200);
    wait_for("the standby wrote a snapshot", || {
        b.stats.snapshots_written.load(Ordering::Relaxed) >= 1
    })
    .await;
    assert_eq!(
        a.stats.snapshots_written.load(Ordering::Relaxed),
        0,
        "a leader never stalls its loop for a snapshot"
    );
    b.stop().await;
    a.stop().await;

    // Each stored snapshot is the replay up to its sequence, exactly.
    let stored = db.store.snapshots().await.unwrap();
    assert!(
        !stored.is_empty() && stored.len() <= 2,
        "pruned to 2: {stored:?}"
    );
    for s in &stored {
        let body = db
            .store
            .snapshot_body(s.seq, s.format)
            .await
            .unwrap()
            .unwrap();
        let snap = snapshot::decode(&body).unwrap();
        let replayed = db.store.replay(Until::Seq(s.seq)).await.unwrap();
        assert!(
            snap.state == replayed,
            "snapshot at {} is its replay",
            s.seq
        );
    }

    // A restart loads the newest and folds the rest; new work is decided.
    let (snap_seq, end) = (newest_snapshot_seq(&db).await, log.max_seq().await.unwrap());
    let b = start(&log, &bus, "b2");
    submit(&log, 1201, 10).await;
    assert_eq!(wait_decided(&log, 1210).await.len(), 1210);
    assert_eq!(b.stats.snapshot_seq.load(Ordering::Relaxed), snap_seq);
    let folded = b.stats.takeover_folded.load(Ordering::Relaxed);
    assert!(
        folded >= end - snap_seq && folded <= end - snap_seq + 10,
        "folded {folded} after a snapshot at {snap_seq} of a log of {end}"
    );
    b.stop().await;

    // A damaged newest snapshot is skipped: the start uses an older one or
    // the whole log, and decides the same.
    let newest = newest_snapshot_seq(&db).await;
    sqlx::query(
        "UPDATE snapshots SET body = set_byte(body, 100, get_byte(body, 100) # 1) WHERE seq = $1",
    )
    .bind(newest as i64)
    .execute(db.store.pool())
    .await
    .unwrap();
    let c = start(&log, &bus, "c");
    submit(&log, 1211, 10).await;
    assert_eq!(wait_decided(&log, 1220).await.len(), 1220);
    assert!(c.stats.snapshot_seq.load(Ordering::Relaxed) < newest);
    c.stop().await;

    let d = decisions(&log).await;
    assert!(d.values().all(|&n| n == 1), "each job decided once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_writes_snapshots_and_a_new_follower_reaches_the_same_state() {
    let db = TestDb::new().await;
    let log = Log::Postgres(db.store.clone());
    let bus = Bus::memory();
    submit(&log, 1, 300).await;
    let policy = SnapshotPolicy {
        every_events: 100,
        every: Duration::from_secs(3600),
        keep: 3,
        load: true,
    };
    let follower = |view: SharedView, shutdown: CancellationToken| {
        tokio::spawn(follow(
            log.clone(),
            bus.clone(),
            view,
            Duration::from_millis(50),
            Arc::new(FollowerHealth::default()),
            policy,
            "viewer".to_string(),
            shutdown,
        ))
    };
    let view: SharedView = Arc::new(RwLock::new(Projection::new()));
    let shutdown = CancellationToken::new();
    let task = follower(view.clone(), shutdown.clone());
    let mut written = 0;
    for _ in 0..400 {
        written = newest_snapshot_seq(&db).await;
        if written == 300 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(written, 300, "a snapshot of the whole log");
    shutdown.cancel();
    task.await.unwrap();

    // A new follower starts at the snapshot; more events fold after it.
    submit(&log, 301, 5).await;
    let view: SharedView = Arc::new(RwLock::new(Projection::new()));
    let shutdown = CancellationToken::new();
    let task = follower(view.clone(), shutdown.clone());
    wait_for("the view folded the tail", || read_view(&view).seq() == 305).await;
    let state = read_view(&view).state().clone();
    assert!(state == db.store.replay(Until::All).await.unwrap());
    shutdown.cancel();
    task.await.unwrap();
}
