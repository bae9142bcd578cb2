//! The event log against a real Postgres: ordered batched appends, JSON
//! readable in SQL, fencing by lease epoch, idempotency keys, append-only
//! triggers, and replay equal to the live state.

mod common;

use common::{job_spec, scheduling_run, tenant_spec, TestDb};
use gpusched_core::State;
use gpusched_events::Event;
use gpusched_model::{JobId, Timestamp};
use gpusched_store::{Fence, Lease, NewEvent, StoreError, Until};
use sqlx::Row;
use std::time::Duration;

const TTL: Duration = Duration::from_secs(30);

async fn lease(db: &TestDb, service: &str, holder: &str) -> Lease {
    db.store
        .acquire_lease(service, "pool-a", holder, TTL)
        .await
        .expect("acquire")
        .expect("lease is free")
}

fn submitted(job: u64) -> Event {
    Event::JobSubmitted {
        job: JobId(job),
        spec: job_spec("alpha", 1, 8, 0),
        at: Timestamp::from_secs(job),
    }
}

fn batch(events: &[Event]) -> Vec<NewEvent> {
    events.iter().cloned().map(NewEvent::from).collect()
}

async fn count_events(db: &TestDb) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM events")
        .fetch_one(db.store.pool())
        .await
        .expect("count events")
}

#[tokio::test]
async fn append_reads_back_in_order_with_sql_readable_payload() {
    let db = TestDb::new().await;
    let l = lease(&db, "gateway", "gw-1").await;
    assert_eq!(l.epoch, 1);
    let events: Vec<Event> = std::iter::once(Event::TenantConfigured {
        spec: tenant_spec("alpha", 16),
    })
    .chain((1..=5).map(submitted))
    .chain([Event::JobAccepted { job: JobId(3) }])
    .collect();
    let corr = uuid::Uuid::new_v4();
    let mut b = batch(&events);
    b[1] = b[1]
        .clone()
        .correlated_with(corr)
        .idempotency_key("submit-1");
    let out = db.store.append(&b, &l.fence()).await.expect("append");
    assert_eq!(out.appended, 7);
    assert_eq!(out.duplicates, 0);
    let (first, last) = (out.first_seq.expect("first"), out.last_seq.expect("last"));
    assert_eq!(last - first, 6);
    assert_eq!(db.store.max_seq().await.expect("max"), last);

    let back = db.store.read_from(0, 100).await.expect("read");
    let got: Vec<Event> = back.iter().map(|s| s.event.clone()).collect();
    assert_eq!(got, events);
    assert!(back.windows(2).all(|w| w[0].seq < w[1].seq));
    assert!(back
        .windows(2)
        .all(|w| w[0].recorded_at <= w[1].recorded_at));
    assert_eq!(back[0].seq, first);
    assert_eq!(back[0].aggregate_kind, "tenant");
    assert_eq!(back[0].aggregate_id, "alpha");
    assert_eq!(back[0].producer, "admin");
    assert_eq!(back[1].kind, "job_submitted");
    assert_eq!(back[1].aggregate_kind, "job");
    assert_eq!(back[1].aggregate_id, "1");
    assert_eq!(back[1].producer, "gateway");
    assert_eq!(back[1].epoch, 1);
    assert_eq!(back[1].correlation_id, Some(corr));
    assert_eq!(back[1].idempotency_key.as_deref(), Some("submit-1"));
    assert_eq!(back[2].correlation_id, None);

    // Paging: after the third event, two at a time.
    let page = db.store.read_from(back[2].seq, 2).await.expect("page");
    assert_eq!(
        page.iter().map(|s| s.seq).collect::<Vec<_>>(),
        vec![back[3].seq, back[4].seq]
    );
    assert!(db.store.read_from(last, 10).await.expect("tail").is_empty());

    // Incident review in plain SQL.
    let rows = sqlx::query(
        "SELECT payload->>'type' AS ty, (payload->>'job')::bigint AS job, payload->'spec'->>'tenant' AS tenant
           FROM events WHERE kind = 'job_submitted' ORDER BY seq",
    )
    .fetch_all(db.store.pool())
    .await
    .expect("sql");
    assert_eq!(rows.len(), 5);
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r.get::<String, _>("ty"), "job_submitted");
        assert_eq!(r.get::<i64, _>("job"), i as i64 + 1);
        assert_eq!(r.get::<String, _>("tenant"), "alpha");
    }

    let j3 = db.store.job_events(JobId(3)).await.expect("job events");
    assert_eq!(
        j3.iter().map(|s| s.kind.as_str()).collect::<Vec<_>>(),
        vec!["job_submitted", "job_accepted"]
    );
}

#[tokio::test]
async fn stale_epoch_is_refused_and_writes_nothing() {
    let db = TestDb::new().await;
    let l = lease(&db, "placement", "pl-1").await;
    let stale = Fence {
        epoch: l.epoch + 1,
        ..l.fence()
    };
    let err = db
        .store
        .append(&batch(&[submitted(1), submitted(2)]), &stale)
        .await
        .expect_err("a wrong epoch must be refused");
    assert!(
        matches!(
            err,
            StoreError::StaleEpoch {
                held: Some(1),
                given: 2,
                ..
            }
        ),
        "{err}"
    );
    let unknown = Fence {
        service: "nobody".into(),
        ..l.fence()
    };
    let err = db
        .store
        .append(&batch(&[submitted(1)]), &unknown)
        .await
        .expect_err("no lease, no append");
    assert!(matches!(err, StoreError::NoLease { .. }), "{err}");
    assert_eq!(count_events(&db).await, 0);
    assert_eq!(db.store.max_seq().await.expect("max"), 0);
}

#[tokio::test]
async fn standby_takes_over_after_expiry_and_fences_the_old_holder() {
    let db = TestDb::new().await;
    let store = &db.store;
    let old = store
        .acquire_lease("quota", "pool-a", "q-1", Duration::from_secs(2))
        .await
        .expect("acquire")
        .expect("free");
    assert_eq!(old.epoch, 1);
    store
        .append(&batch(&[submitted(1)]), &old.fence())
        .await
        .expect("holder appends");

    let standby = store
        .acquire_lease("quota", "pool-a", "q-2", TTL)
        .await
        .expect("acquire");
    assert_eq!(standby, None, "an unexpired lease is not taken over");
    let other_pool = store
        .acquire_lease("quota", "pool-b", "q-2", TTL)
        .await
        .expect("acquire")
        .expect("other partitions are independent");
    assert_eq!(other_pool.epoch, 1);

    // Wait out the ttl by the database's clock.
    let db_now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(store.pool())
        .await
        .expect("now");
    let left = (old.expires_at - db_now).to_std().unwrap_or_default();
    tokio::time::sleep(left + Duration::from_millis(100)).await;

    let new = store
        .acquire_lease("quota", "pool-a", "q-2", TTL)
        .await
        .expect("acquire")
        .expect("an expired lease is taken over");
    assert_eq!(new.epoch, old.epoch + 1);
    assert_eq!(new.holder, "q-2");

    let err = store
        .append(&batch(&[submitted(2)]), &old.fence())
        .await
        .expect_err("the old holder is fenced");
    assert!(
        matches!(
            err,
            StoreError::StaleEpoch {
                held: Some(2),
                given: 1,
                ..
            }
        ),
        "{err}"
    );
    let err = store.renew_lease(&old, TTL).await.expect_err("renew");
    assert!(
        matches!(err, StoreError::LeaseLost { epoch: 1, .. }),
        "{err}"
    );
    assert!(store.release_lease(&old).await.is_err());

    let out = store
        .append(&batch(&[submitted(2)]), &new.fence())
        .await
        .expect("new holder appends");
    assert_eq!(out.appended, 1);
    let back = store.read_from(0, 10).await.expect("read");
    assert_eq!(back.iter().map(|s| s.epoch).collect::<Vec<_>>(), vec![1, 2]);

    // Renew keeps the epoch; release lets a standby in at once, epoch + 1.
    let renewed = store.renew_lease(&new, TTL).await.expect("renew");
    assert_eq!(renewed.epoch, new.epoch);
    assert!(renewed.expires_at >= new.expires_at);
    store.release_lease(&renewed).await.expect("release");
    let third = store
        .acquire_lease("quota", "pool-a", "q-3", TTL)
        .await
        .expect("acquire")
        .expect("a released lease is free");
    assert_eq!(third.epoch, 3);
    assert_eq!(
        store.lease("quota", "pool-a").await.expect("lease"),
        Some(third)
    );
}

#[tokio::test]
async fn duplicate_idempotency_key_writes_one_row() {
    let db = TestDb::new().await;
    let l = lease(&db, "gateway", "gw-1").await;
    let first = vec![NewEvent::new(submitted(1)).idempotency_key("client-7/req-1")];
    let out = db.store.append(&first, &l.fence()).await.expect("append");
    assert_eq!((out.appended, out.duplicates), (1, 0));

    let again = vec![
        NewEvent::new(submitted(1)).idempotency_key("client-7/req-1"),
        NewEvent::new(submitted(2)).idempotency_key("client-7/req-2"),
        NewEvent::new(submitted(2)).idempotency_key("client-7/req-2"),
        NewEvent::new(Event::JobAccepted { job: JobId(2) }),
    ];
    let out = db.store.append(&again, &l.fence()).await.expect("append");
    assert_eq!(out.appended, 2);
    assert_eq!(out.duplicates, 2);

    let n: i64 =
        sqlx::query_scalar("SELECT count(*) FROM events WHERE idempotency_key = 'client-7/req-1'")
            .fetch_one(db.store.pool())
            .await
            .expect("count");
    assert_eq!(n, 1);
    let kinds: Vec<String> = db
        .store
        .read_from(0, 10)
        .await
        .expect("read")
        .into_iter()
        .map(|s| s.kind)
        .collect();
    assert_eq!(
        kinds,
        vec!["job_submitted", "job_submitted", "job_accepted"]
    );
}

#[tokio::test]
async fn events_refuse_update_delete_and_truncate() {
    let db = TestDb::new().await;
    let l = lease(&db, "gateway", "gw-1").await;
    db.store
        .append(&batch(&[submitted(1)]), &l.fence())
        .await
        .expect("append");
    for sql in [
        "UPDATE events SET kind = 'job_cancelled'",
        "DELETE FROM events",
        "TRUNCATE events",
    ] {
        let err = sqlx::query(sql)
            .execute(db.store.pool())
            .await
            .expect_err(sql);
        assert!(err.to_string().contains("append-only"), "{sql}: {err}");
    }
    let back = db.store.read_from(0, 10).await.expect("read");
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].event, submitted(1));
}

#[tokio::test]
async fn replay_equals_the_live_state() {
    let db = TestDb::new().await;
    let run = scheduling_run();
    let all = run.events();
    assert!(
        all.iter().any(|e| matches!(e, Event::JobBound { .. }))
            && all.iter().any(|e| matches!(e, Event::JobFinished { .. })),
        "the run should bind and finish jobs"
    );
    let l = lease(&db, "placement", "pl-1").await;
    for b in &run.batches {
        db.store
            .append(&batch(b), &l.fence())
            .await
            .expect("append");
    }
    let replayed = db.store.replay(Until::All).await.expect("replay");
    assert_eq!(replayed.state_hash(), run.state.state_hash());
    assert_eq!(replayed.applied(), all.len() as u64);

    // Resuming from a sequence gives the same state.
    let stored = db.store.read_from(0, 10_000).await.expect("read");
    let mid = stored[stored.len() / 2].seq;
    let mut resumed = db.store.replay(Until::Seq(mid)).await.expect("replay");
    let last = db
        .store
        .replay_onto(&mut resumed, mid, Until::All)
        .await
        .expect("resume");
    assert_eq!(last.last_seq, db.store.max_seq().await.expect("max"));
    assert_eq!(resumed.state_hash(), run.state.state_hash());
}

#[tokio::test]
async fn replay_until_a_sequence_or_time_gives_that_point() {
    let db = TestDb::new().await;
    let run = scheduling_run();
    let all = run.events();
    let l = lease(&db, "placement", "pl-1").await;
    for b in &run.batches {
        db.store
            .append(&batch(b), &l.fence())
            .await
            .expect("append");
    }
    let stored = db.store.read_from(0, 10_000).await.expect("read");
    assert_eq!(stored.len(), all.len());
    for k in [1, all.len() / 3, all.len() / 2, all.len() - 1] {
        let mut expect = State::new();
        for ev in &all[..k] {
            expect.apply(ev).expect("apply");
        }
        let at = &stored[k - 1];
        let by_seq = db.store.replay(Until::Seq(at.seq)).await.expect("replay");
        assert_eq!(
            by_seq.state_hash(),
            expect.state_hash(),
            "until seq {}",
            at.seq
        );
        // Time: a prefix up to the last event recorded at that instant.
        let upto_time = stored
            .iter()
            .take_while(|s| s.recorded_at <= at.recorded_at)
            .count();
        let mut expect_t = State::new();
        for ev in &all[..upto_time] {
            expect_t.apply(ev).expect("apply");
        }
        let by_time = db
            .store
            .replay(Until::Time(at.recorded_at))
            .await
            .expect("replay");
        assert_eq!(
            by_time.state_hash(),
            expect_t.state_hash(),
            "until {}",
            at.recorded_at
        );
    }
}

#[tokio::test]
async fn replay_skips_and_counts_an_event_apply_refuses() {
    let db = TestDb::new().await;
    let l = lease(&db, "agent", "node-7").await;
    db.store
        .append(
            &batch(&[
                Event::TopologyConfigured {
                    levels: vec!["rack".into(), "block".into()],
                },
                Event::JobStarted {
                    job: JobId(99),
                    at: Timestamp(5),
                },
            ]),
            &l.fence(),
        )
        .await
        .expect("the store does not judge events");
    let mut state = State::new();
    let out = db
        .store
        .replay_onto(&mut state, 0, Until::All)
        .await
        .expect("replay");
    assert_eq!((out.last_seq, out.applied, out.superseded), (2, 1, 1));
    assert_eq!(state.applied(), 1);
}

#[tokio::test]
async fn sequence_stays_dense_across_duplicates_and_refused_appends() {
    let db = TestDb::new().await;
    let l = lease(&db, "gateway", "gw-1").await;
    let keyed = |n: u64| NewEvent::new(submitted(n)).idempotency_key(format!("k{n}"));
    db.store
        .append(&[keyed(1), keyed(2)], &l.fence())
        .await
        .expect("append");
    let stale = Fence {
        epoch: l.epoch + 5,
        ..l.fence()
    };
    assert!(db.store.append(&[keyed(3)], &stale).await.is_err());
    let out = db
        .store
        .append(&[keyed(2), keyed(4), keyed(4), keyed(5)], &l.fence())
        .await
        .expect("append");
    assert_eq!(out.seqs, vec![None, Some(3), None, Some(4)]);
    let seqs: Vec<u64> = db
        .store
        .read_from(0, 100)
        .await
        .expect("read")
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, vec![1, 2, 3, 4]);
    let found = db
        .store
        .events_by_keys(&["k2".to_string(), "nope".to_string()])
        .await
        .expect("by keys");
    assert_eq!(found.len(), 1);
    assert_eq!(found.get("k2").map(|e| e.seq), Some(2));
    let ids = db.store.allocate_job_ids(3).await.expect("ids");
    let more = db.store.allocate_job_ids(2).await.expect("ids");
    assert_eq!(ids.len() + more.len(), 5);
    assert!(ids.iter().all(|i| !more.contains(i)));
}

#[tokio::test]
async fn concurrent_appenders_commit_in_sequence_order() {
    let db = TestDb::new().await;
    let a = lease(&db, "gateway", "gw-1").await;
    let b = db
        .store
        .acquire_lease("agent", "pool-a", "ag-1", TTL)
        .await
        .expect("acquire")
        .expect("free");
    let write = |fence: Fence, base: u64| {
        let store = db.store.clone();
        tokio::spawn(async move {
            for i in 0..20u64 {
                let evs: Vec<Event> = (0..25).map(|k| submitted(base + i * 100 + k)).collect();
                store.append(&batch(&evs), &fence).await.expect("append");
            }
        })
    };
    let (ra, rb) = tokio::join!(write(a.fence(), 1_000_000), write(b.fence(), 2_000_000));
    ra.expect("writer a");
    rb.expect("writer b");
    let back = db.store.read_from(0, 10_000).await.expect("read");
    assert_eq!(back.len(), 1000);
    assert!(back.windows(2).all(|w| w[0].seq < w[1].seq));
    assert!(back
        .windows(2)
        .all(|w| w[0].recorded_at <= w[1].recorded_at));
    // Each batch is contiguous: a batch's 25 events are never interleaved.
    for chunk in back.chunks(25) {
        let writer = |s: &gpusched_store::StoredEvent| s.event.job().map(|j| j.0 / 1_000_000);
        assert!(chunk.iter().all(|s| writer(s) == writer(&chunk[0])));
        assert!(chunk.windows(2).all(|w| w[1].seq == w[0].seq + 1));
    }
}

/// A database migrated by the first release holds migration 1's checksum as
/// it was then (only its first comment line changed since): `migrate` must
/// record the current checksum and go on, keeping every event.
#[tokio::test]
async fn a_log_migrated_by_the_first_release_still_migrates() {
    const FIRST_RELEASE_CHECKSUM: &str = "b81973fcb035131429bc2d101173561495bdcd32b4b45dd70d4513a3567d64673252984023578e013d45e459d62b96f6";
    let db = TestDb::new().await;
    let l = lease(&db, "admission", "a-1").await;
    db.store
        .append(&batch(&[submitted(1), submitted(2)]), &l.fence())
        .await
        .expect("append");
    let current: Vec<u8> =
        sqlx::query_scalar("SELECT checksum FROM _sqlx_migrations WHERE version = 1")
            .fetch_one(db.store.pool())
            .await
            .expect("current checksum");
    sqlx::query("UPDATE _sqlx_migrations SET checksum = decode($1, 'hex') WHERE version = 1")
        .bind(FIRST_RELEASE_CHECKSUM)
        .execute(db.store.pool())
        .await
        .expect("store the first release's checksum");
    assert_ne!(hex_of(&current), FIRST_RELEASE_CHECKSUM);

    db.store
        .migrate()
        .await
        .expect("migrate a first-release log");

    let after: Vec<u8> =
        sqlx::query_scalar("SELECT checksum FROM _sqlx_migrations WHERE version = 1")
            .fetch_one(db.store.pool())
            .await
            .expect("checksum after");
    assert_eq!(after, current);
    assert_eq!(count_events(&db).await, 2);
}

/// A checksum that is neither the first release's nor the current one is a
/// changed migration: `migrate` refuses it rather than papering over it.
#[tokio::test]
async fn a_log_with_an_unknown_migration_checksum_is_refused() {
    let db = TestDb::new().await;
    sqlx::query("UPDATE _sqlx_migrations SET checksum = '\\x00' WHERE version = 1")
        .execute(db.store.pool())
        .await
        .expect("store a foreign checksum");
    assert!(db.store.migrate().await.is_err());
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Sequences and epochs cross into `bigint` in the store alone: a negative
/// epoch written behind the store's back is refused on read, naming the
/// column, and a bound above `SEQ_MAX` is refused before any query, never
/// read as 0 or clamped.
#[tokio::test]
async fn a_bigint_that_is_no_sequence_or_epoch_is_an_error() {
    let db = TestDb::new().await;
    let l = lease(&db, "gateway", "gw-1").await;
    db.store
        .append(&batch(&[submitted(1)]), &l.fence())
        .await
        .expect("append");
    sqlx::query(
        "INSERT INTO events (seq, aggregate_kind, aggregate_id, kind, schema_version,
                             payload, producer, epoch)
         SELECT 2, aggregate_kind, aggregate_id, kind, schema_version, payload, producer, -7
           FROM events WHERE seq = 1",
    )
    .execute(db.store.pool())
    .await
    .expect("insert a corrupt row");

    let err = db.store.read_from(0, 10).await.expect_err("corrupt epoch");
    assert!(
        matches!(
            err,
            StoreError::Corrupt {
                column: "events.epoch",
                value: -7
            }
        ),
        "{err}"
    );
    assert_eq!(db.store.max_seq().await.expect("max"), 2);
    let before = db.store.read_from(0, 1).await.expect("the row before it");
    assert_eq!(before.len(), 1);

    let above = gpusched_store::SEQ_MAX + 1;
    let err = db.store.read_from(above, 10).await.expect_err("too far");
    assert!(
        matches!(err, StoreError::OutOfRange { column: "events.seq", value } if value == above),
        "{err}"
    );
    let err = db
        .store
        .replay(Until::Seq(u64::MAX))
        .await
        .expect_err("bound too far");
    assert!(matches!(err, StoreError::OutOfRange { .. }), "{err}");
    let stale = Fence {
        epoch: above,
        ..l.fence()
    };
    let err = db
        .store
        .append(&batch(&[submitted(3)]), &stale)
        .await
        .expect_err("epoch too large");
    assert!(
        matches!(
            err,
            StoreError::OutOfRange {
                column: "leases.epoch",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(count_events(&db).await, 2, "nothing written");
}
