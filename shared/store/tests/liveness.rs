//! Lease liveness against a real Postgres: a holder whose session is gone
//! is taken over once its renewal is overdue, before its lease expires (at
//! once by an instance restarted under the holder's name); a
//! holder alive (paused, or renewing) is not; a holder whose session the
//! server ended takes its lock again at its next renewal.

use std::time::Duration;

use gpusched_store::testing::TestDb;
use gpusched_store::{Lease, LeaseSession};

const SERVICE: &str = "placement";
const PARTITION: &str = "default";

async fn take(session: &mut LeaseSession, holder: &str, ttl: Duration) -> Option<Lease> {
    session.acquire(holder, ttl).await.expect("acquire")
}

/// Polls `session` every 20 ms until it takes the lease (at most 4 TTLs).
async fn take_when_possible(session: &mut LeaseSession, holder: &str, ttl: Duration) -> Lease {
    for _ in 0..(4 * ttl.as_millis() / 20) {
        if let Some(lease) = take(session, holder, ttl).await {
            return lease;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{holder} never took the lease");
}

/// When `taken` was taken, by the database's clock.
fn taken_at(taken: &Lease, ttl: Duration) -> chrono::DateTime<chrono::Utc> {
    taken.expires_at - chrono::Duration::from_std(ttl).expect("ttl")
}

#[tokio::test]
async fn a_holder_whose_session_is_gone_is_taken_over_before_expiry() {
    let db = TestDb::new().await;
    let ttl = Duration::from_secs(4);
    let mut holder = db.store.lease_session(SERVICE, PARTITION);
    let old = take(&mut holder, "killed", ttl).await.expect("free lease");
    let mut standby = db.store.lease_session(SERVICE, PARTITION);
    assert_eq!(
        take(&mut standby, "standby", ttl).await,
        None,
        "holder alive"
    );

    // The holder's process dies: its connection closes, its lock goes.
    drop(holder);
    let new = take_when_possible(&mut standby, "standby", ttl).await;
    assert_eq!(new.epoch, old.epoch + 1);
    let at = taken_at(&new, ttl);
    assert!(
        at < old.expires_at,
        "taken at {at}, the lease ran to {}",
        old.expires_at
    );
    // Not before the holder missed its renewal (half the TTL left).
    let half = chrono::Duration::from_std(ttl / 2).expect("ttl");
    assert!(at >= old.expires_at - half, "taken at {at}, too early");
}

/// A supervisor restarts an instance under its own name: it takes its
/// lease back as soon as the old process's session is gone, not half a
/// TTL later; an instance alive under that name keeps it.
#[tokio::test]
async fn a_holder_restarted_under_its_own_name_takes_its_lease_back_at_once() {
    let db = TestDb::new().await;
    let ttl = Duration::from_secs(10);
    let mut holder = db.store.lease_session(SERVICE, PARTITION);
    let old = take(&mut holder, "placement-0", ttl)
        .await
        .expect("free lease");
    let mut twin = db.store.lease_session(SERVICE, PARTITION);
    assert_eq!(
        take(&mut twin, "placement-0", ttl).await,
        None,
        "the holder under that name is alive"
    );

    drop(holder);
    let mut stranger = db.store.lease_session(SERVICE, PARTITION);
    let mut restarted = db.store.lease_session(SERVICE, PARTITION);
    let new = take_when_possible(&mut restarted, "placement-0", ttl).await;
    assert_eq!(new.epoch, old.epoch + 1);
    let at = taken_at(&new, ttl);
    let half = chrono::Duration::from_std(ttl / 2).expect("ttl");
    assert!(
        at < old.expires_at - half,
        "taken at {at}: waited for the renewal to be overdue ({})",
        old.expires_at - half
    );
    // Another name still waits for an overdue renewal: the restarted
    // instance holds the lease and its lock now.
    assert_eq!(take(&mut stranger, "placement-1", ttl).await, None);
}

#[tokio::test]
async fn a_paused_holder_keeps_its_lease_until_expiry() {
    let db = TestDb::new().await;
    let ttl = Duration::from_secs(2);
    let mut holder = db.store.lease_session(SERVICE, PARTITION);
    let old = take(&mut holder, "paused", ttl).await.expect("free lease");
    // The holder renews no more but its session lives (SIGSTOP).
    let mut standby = db.store.lease_session(SERVICE, PARTITION);
    let new = take_when_possible(&mut standby, "standby", ttl).await;
    assert_eq!(new.epoch, old.epoch + 1);
    let at = taken_at(&new, ttl);
    assert!(
        at >= old.expires_at,
        "taken at {at}, before expiry {}",
        old.expires_at
    );
    // Woken, the old holder finds its lease gone.
    assert!(holder.renew(&old, ttl).await.is_err());
}

#[tokio::test]
async fn a_renewing_holder_is_never_taken_over() {
    let db = TestDb::new().await;
    let ttl = Duration::from_millis(900);
    let mut holder = db.store.lease_session(SERVICE, PARTITION);
    let mut lease = take(&mut holder, "alive", ttl).await.expect("free lease");
    let mut standby = db.store.lease_session(SERVICE, PARTITION);
    for _ in 0..30 {
        // Renewing at a third, as `Leader::keep` does.
        tokio::time::sleep(ttl / 3).await;
        lease = holder.renew(&lease, ttl).await.expect("renew");
        assert_eq!(take(&mut standby, "standby", ttl).await, None);
    }
}

/// Ends the sessions holding advisory locks in this test's database.
async fn end_lock_holding_sessions(db: &TestDb) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM (
           SELECT pg_terminate_backend(pid) FROM pg_locks
            WHERE locktype = 'advisory' AND granted
              AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
         ) ended",
    )
    .fetch_one(db.store.pool())
    .await
    .expect("terminate")
}

#[tokio::test]
async fn a_holder_cut_off_by_the_server_locks_again_at_its_next_renewal() {
    let db = TestDb::new().await;
    let ttl = Duration::from_secs(2);
    let mut holder = db.store.lease_session(SERVICE, PARTITION);
    let lease = take(&mut holder, "alive", ttl).await.expect("free lease");
    assert_eq!(end_lock_holding_sessions(&db).await, 1, "the holder's lock");

    // The first renewal finds its connection gone; the next reconnects,
    // renews and takes the lock again.
    let mut renewed = None;
    for _ in 0..3 {
        if let Ok(l) = holder.renew(&lease, ttl).await {
            renewed = Some(l);
            break;
        }
    }
    let renewed = renewed.expect("renewed after reconnecting");
    // Now overdue but alive: a standby waits for the expiry.
    let mut standby = db.store.lease_session(SERVICE, PARTITION);
    let new = take_when_possible(&mut standby, "standby", ttl).await;
    assert!(
        taken_at(&new, ttl) >= renewed.expires_at,
        "taken from a live holder"
    );
}
