//! Snapshots in Postgres: saved once per sequence, the newest good one
//! found (damaged, unknown-format and past-the-log ones skipped with their
//! reason), old ones pruned, the log untouched; a snapshot plus the log
//! after it is the replay from zero.

mod common;

use std::time::Duration;

use common::{scheduling_run, TestDb};
use gpusched_core::snapshot::{self, SnapshotError};
use gpusched_store::{NewEvent, SkipReason, StoreError, Until};

async fn logged_run(db: &TestDb) -> u64 {
    let run = scheduling_run();
    let lease = db
        .store
        .acquire_lease("placement", "default", "t", Duration::from_secs(30))
        .await
        .expect("acquire")
        .expect("free");
    for b in &run.batches {
        let batch: Vec<NewEvent> = b.iter().cloned().map(NewEvent::from).collect();
        db.store
            .append(&batch, &lease.fence())
            .await
            .expect("append");
    }
    db.store.max_seq().await.expect("max")
}

async fn snapshot_at(db: &TestDb, seq: u64) -> Vec<u8> {
    let state = db.store.replay(Until::Seq(seq)).await.expect("replay");
    snapshot::encode(&state, seq)
}

#[tokio::test]
async fn the_newest_good_snapshot_plus_the_tail_is_the_replay() {
    let db = TestDb::new().await;
    let end = logged_run(&db).await;
    let (older, newer) = (end / 3, 2 * end / 3);
    for seq in [older, newer] {
        let body = snapshot_at(&db, seq).await;
        assert!(db.store.save_snapshot(&body, "t").await.expect("save"));
        assert!(
            !db.store.save_snapshot(&body, "t").await.expect("save"),
            "saved once per sequence"
        );
    }
    let found = db.store.newest_snapshot(end).await.expect("find");
    assert!(found.skipped.is_empty());
    let (snap, info) = found.snapshot.expect("a snapshot");
    assert_eq!((snap.seq, info.seq), (newer, newer));
    assert_eq!(info.format, snapshot::FORMAT);
    assert_eq!(info.taken_by, "t");

    let mut state = snap.state;
    db.store
        .replay_onto(&mut state, newer, Until::All)
        .await
        .expect("fold the tail");
    let replayed = db.store.replay(Until::All).await.expect("replay");
    assert_eq!(state.state_hash(), replayed.state_hash());
    assert!(state == replayed, "every field and index equal");
}

#[tokio::test]
async fn bad_snapshots_are_skipped_for_an_older_good_one() {
    let db = TestDb::new().await;
    let end = logged_run(&db).await;
    let good = end / 4;
    let body = snapshot_at(&db, good).await;
    db.store.save_snapshot(&body, "t").await.expect("save");
    for seq in [good + 1, good + 2, good + 3] {
        let body = snapshot_at(&db, seq).await;
        db.store.save_snapshot(&body, "t").await.expect("save");
    }
    // One damaged on disk, one of a format this build does not read, one
    // past the end of a log restored from an older backup.
    sqlx::query(
        "UPDATE snapshots SET body = set_byte(body, 200, get_byte(body, 200) # 90) WHERE seq = $1",
    )
    .bind(i64::try_from(good + 3).expect("seq"))
    .execute(db.store.pool())
    .await
    .expect("damage");
    sqlx::query(
        "UPDATE snapshots SET format = 999,
                body = set_byte(set_byte(body, 4, 231), 5, 3) WHERE seq = $1",
    )
    .bind(i64::try_from(good + 2).expect("seq"))
    .execute(db.store.pool())
    .await
    .expect("reformat");
    let found = db.store.newest_snapshot(good + 2).await.expect("find");
    let why: Vec<_> = found
        .skipped
        .iter()
        .map(|s| (s.seq, s.why.clone()))
        .collect();
    assert_eq!(
        why,
        vec![
            (
                good + 3,
                SkipReason::PastLogEnd {
                    seq: good + 3,
                    log_end: good + 2
                }
            ),
            (
                good + 2,
                SkipReason::Check(SnapshotError::UnknownFormat { found: 999 })
            ),
        ]
    );
    let found = db.store.newest_snapshot(end).await.expect("find");
    assert_eq!(found.skipped.len(), 2);
    assert_eq!(
        found.skipped[0].why,
        SkipReason::Check(SnapshotError::Damaged)
    );
    let (snap, _) = found.snapshot.expect("the older good one");
    assert_eq!(snap.seq, good + 1);
}

#[tokio::test]
async fn pruning_keeps_the_newest_and_never_touches_the_log() {
    let db = TestDb::new().await;
    let end = logged_run(&db).await;
    for seq in 1..=6 {
        let body = snapshot_at(&db, seq).await;
        db.store.save_snapshot(&body, "t").await.expect("save");
    }
    assert_eq!(db.store.prune_snapshots(2).await.expect("prune"), 4);
    let left: Vec<u64> = db
        .store
        .snapshots()
        .await
        .expect("list")
        .iter()
        .map(|s| s.seq)
        .collect();
    assert_eq!(left, vec![6, 5]);
    assert_eq!(db.store.max_seq().await.expect("max"), end);
    let err = db
        .store
        .save_snapshot(b"not a snapshot", "t")
        .await
        .expect_err("refused");
    assert!(matches!(
        err,
        StoreError::Snapshot(SnapshotError::NotASnapshot)
    ));
}
