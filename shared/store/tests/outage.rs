//! The store under faults, against a private Postgres each test starts on
//! a free port in a temp dir (`testing::PrivatePostgres`; the shared server
//! is never touched): a writer paused inside its append holds no lock
//! and never commits after a takeover; with the server down every
//! call fails fast as unavailable and the same store works again once it
//! is back; a restart in the middle of appends loses and duplicates
//! nothing when failed appends are retried with their idempotency keys;
//! a writer blocked behind a lock gives up after the lock timeout.
//!
//! Figures are printed (`--nocapture`); the time bounds are generous (the
//! brief's "TTL + 1 s" and "about 1.5 s").

use gpusched_events::Event;
use gpusched_model::JobId;
use gpusched_store::testing::{PrivatePostgres, StopMode};
use gpusched_store::{EventStore, Fence, Lease, NewEvent, Outage, StoreError, StoreOptions};
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Lease TTL of the paused-leader test.
const TTL: Duration = Duration::from_secs(2);
/// The lease the paused leader holds and the standby takes over.
const SERVICE: &str = "placement";
const PARTITION: &str = "pool-a";
/// The child's Postgres application name, to find its session.
const CHILD_APP: &str = "paused-leader";
/// Tells the test binary, run as a child, to act as the leader.
const CHILD_URL_ENV: &str = "GPUSCHED_OUTAGE_CHILD_URL";
/// Events per batch of the paused leader.
const LEADER_BATCH: usize = 20;
/// Starts each line the child reports (the test harness may print on the
/// same line before it).
const MARK: &str = "@@ ";

/// Reports one line from the child to the parent.
macro_rules! report {
    ($($arg:tt)*) => { println!("{MARK}{}", format!($($arg)*)) };
}

fn accepted(job: u64) -> Event {
    Event::JobAccepted { job: JobId(job) }
}

/// Batch `n` of `prefix`: `size` events keyed `prefix-n-i`.
fn keyed_batch(prefix: &str, n: u64, size: usize) -> Vec<NewEvent> {
    (0..size)
        .map(|i| {
            NewEvent::new(accepted(n * 1000 + i as u64))
                .idempotency_key(format!("{prefix}-{n}-{i}"))
        })
        .collect()
}

/// The batch number in a key `prefix-n-i`.
fn batch_of(key: &str) -> u64 {
    key.split('-')
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("key names its batch")
}

async fn store_on(pg: &PrivatePostgres, options: StoreOptions) -> EventStore {
    let store = EventStore::connect_with(&pg.url("postgres"), options)
        .await
        .expect("connect to the private Postgres");
    store.migrate().await.expect("migrate");
    store
}

async fn take_lease(store: &EventStore, service: &str, holder: &str, ttl: Duration) -> Lease {
    store
        .acquire_lease(service, PARTITION, holder, ttl)
        .await
        .expect("acquire")
        .expect("lease is free")
}

/// (count, min seq, max seq) of the log.
async fn log_shape(store: &EventStore) -> (i64, i64, i64) {
    sqlx::query_as("SELECT count(*), coalesce(min(seq), 0), coalesce(max(seq), 0) FROM events")
        .fetch_one(store.pool())
        .await
        .expect("log shape")
}

async fn assert_dense(store: &EventStore) -> i64 {
    let (count, min, max) = log_shape(store).await;
    assert!(count == 0 || min == 1, "log starts at {min}");
    assert_eq!(count, max, "the sequence has gaps or repeats");
    count
}

/// Keys with `prefix` in the log, with how often each is there.
async fn keys_with(store: &EventStore, prefix: &str) -> BTreeMap<String, i64> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT idempotency_key, count(*) FROM events
          WHERE idempotency_key LIKE $1 || '-%' GROUP BY idempotency_key",
    )
    .bind(prefix)
    .fetch_all(store.pool())
    .await
    .expect("keys");
    rows.into_iter().collect()
}

fn fenced(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::StaleEpoch { .. } | StoreError::LeaseLost { .. }
    )
}

// ---------------------------------------------------------------------------
// A leader paused inside its append (SIGSTOP of a child process).

/// The child: the test binary run again with `CHILD_URL_ENV` set. It takes
/// the lease and appends keyed batches in a loop, renewing like a service,
/// printing `acked n` / `failed n …` / `fenced n`, until fenced off.
#[tokio::test]
#[ignore = "child process of paused_leader_stalls_nobody_and_never_commits_after_takeover"]
async fn paused_leader_child() {
    let Ok(url) = std::env::var(CHILD_URL_ENV) else {
        return;
    };
    let store = EventStore::connect_with(
        &url,
        StoreOptions {
            max_connections: 2,
            ..StoreOptions::default()
        },
    )
    .await
    .expect("child connects");
    let mut lease = take_lease(&store, SERVICE, "leader", TTL).await;
    report!("leader {}", lease.epoch);
    let mut renewed = Instant::now();
    let mut n = 0;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(120) {
        if renewed.elapsed() >= TTL / 3 {
            match store.renew_lease(&lease, TTL).await {
                Ok(l) => (lease, renewed) = (l, Instant::now()),
                Err(e) if fenced(&e) => return report!("fenced {n} {e}"),
                Err(e) => report!("renew-failed {n} {e}"),
            }
        }
        match store
            .append(&keyed_batch("leader", n, LEADER_BATCH), &lease.fence())
            .await
        {
            Ok(out) => {
                report!("acked {n} duplicates={}", out.duplicates);
                n += 1;
            }
            Err(e) if fenced(&e) => return report!("fenced {n} {e}"),
            Err(e) => {
                report!("failed {n} unavailable={} {e}", e.is_unavailable());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    report!("gave up");
}

/// The child process, killed when dropped (a stopped one too).
struct ChildGuard {
    child: Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
}

impl ChildGuard {
    fn spawn(url: &str) -> ChildGuard {
        let mut child = Command::new(std::env::current_exe().expect("test binary path"))
            .args(["paused_leader_child", "--exact", "--ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(CHILD_URL_ENV, url)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the child");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if let Some((_, report)) = line.split_once(MARK) {
                    let _ = tx.send(report.to_string());
                }
            }
        });
        ChildGuard {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} the child");
    }

    /// Waits for a line starting with `prefix`, keeping every line seen.
    async fn wait_for(&mut self, prefix: &str, within: Duration) -> String {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => {
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Ok(None) => panic!("child ended before {prefix:?}: {:?}", self.tail()),
                Err(_) => panic!("no {prefix:?} from the child: {:?}", self.tail()),
            }
        }
    }

    /// The last lines seen (for failure messages).
    fn tail(&self) -> &[String] {
        &self.seen[self.seen.len().saturating_sub(10)..]
    }

    /// Every line until the child's output ends.
    async fn rest(&mut self, within: Duration) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + within;
        while let Ok(Some(line)) = tokio::time::timeout_at(deadline, self.lines.recv()).await {
            self.seen.push(line);
        }
        self.seen.clone()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The child's sessions: (running a statement, inside a transaction
/// between statements, holding the append lock while not running one).
async fn child_sessions(store: &EventStore) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE a.state = 'active'),
                count(*) FILTER (WHERE a.state LIKE 'idle in transaction%'),
                count(*) FILTER (WHERE a.state <> 'active' AND EXISTS
                    (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid
                        AND l.locktype = 'advisory' AND l.granted))
           FROM pg_stat_activity a WHERE a.application_name = $1",
    )
    .bind(CHILD_APP)
    .fetch_one(store.pool())
    .await
    .expect("pg_stat_activity")
}

/// SIGSTOPs the child the moment its session is seen running an append,
/// then checks that the paused child holds no lock once that statement
/// ended: an append is one statement, committed on the server, so a
/// writer paused at any point never holds the append lock (a transaction
/// run from the client held it across its round trips, and a pause
/// between them held it until the server's idle timeout). Returns when it
/// was stopped.
async fn pause_inside_append(store: &EventStore, child: &ChildGuard) -> Instant {
    for attempt in 0..5000u64 {
        if child_sessions(store).await.0 == 0 {
            continue;
        }
        let stopped_at = Instant::now();
        child.signal("-STOP");
        eprintln!("paused while appending after {} looks", attempt + 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (running, in_transaction, holding) = child_sessions(store).await;
        assert_eq!(
            (running, in_transaction, holding),
            (0, 0, 0),
            "the paused child still runs a statement, sits in a transaction or holds the append lock"
        );
        return stopped_at;
    }
    panic!("the child was never seen appending");
}

/// Polls for the lease as a standby would; (the lease, when it came,
/// errors seen meanwhile).
async fn standby_takes_over(store: &EventStore, since: Instant) -> (Lease, Duration, Vec<String>) {
    let mut errors = Vec::new();
    while since.elapsed() < Duration::from_secs(20) {
        match store
            .acquire_lease(SERVICE, PARTITION, "standby", TTL)
            .await
        {
            Ok(Some(l)) => return (l, since.elapsed(), errors),
            Ok(None) => {}
            Err(e) => errors.push(e.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the standby never got the lease; errors: {errors:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_leader_stalls_nobody_and_never_commits_after_takeover() {
    let pg = PrivatePostgres::start();
    let store = store_on(&pg, StoreOptions::default()).await;
    let other = take_lease(&store, "gateway", "gw", Duration::from_secs(60)).await;
    let mut child = ChildGuard::spawn(&format!(
        "{}?application_name={CHILD_APP}",
        pg.url("postgres")
    ));
    child.wait_for("leader 1", Duration::from_secs(60)).await;
    child.wait_for("acked 3", Duration::from_secs(60)).await;

    let paused_at = pause_inside_append(&store, &child).await;
    let other_append = async {
        let out = store
            .append(&keyed_batch("other", 0, 5), &other.fence())
            .await;
        (out, paused_at.elapsed())
    };
    let ((other_out, other_after), (standby, standby_after, standby_errors)) =
        tokio::join!(other_append, standby_takes_over(&store, paused_at));
    eprintln!(
        "leader paused in its append: another holder appended after {other_after:?}, \
         the standby took the lease after {standby_after:?} (errors meanwhile: {standby_errors:?})"
    );
    assert_eq!(other_out.expect("another holder appends").appended, 5);
    let bound = TTL + Duration::from_secs(1);
    assert!(other_after <= bound, "other holder waited {other_after:?}");
    assert!(standby_after <= bound, "standby waited {standby_after:?}");
    assert_eq!(standby.epoch, 2);
    let idle_in_tx: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
          WHERE application_name = $1 AND state LIKE 'idle in transaction%'",
    )
    .bind(CHILD_APP)
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(idle_in_tx, 0, "the paused transaction is still open");
    let out = store
        .append(&keyed_batch("standby", 0, 5), &standby.fence())
        .await
        .expect("the standby appends");
    assert_eq!(out.appended, 5);

    child.signal("-CONT");
    let lines = child.rest(Duration::from_secs(60)).await;
    check_paused_leader_log(&store, &lines).await;
}

/// The leader's acked batches are in the log whole, its unacked one is
/// not, every leader event precedes every standby event, and the log is
/// dense.
async fn check_paused_leader_log(store: &EventStore, lines: &[String]) {
    let numbered = |tag: &str| -> Vec<u64> {
        lines
            .iter()
            .filter_map(|l| l.strip_prefix(tag))
            .filter_map(|rest| rest.split(' ').next()?.parse().ok())
            .collect()
    };
    for line in lines.iter().filter(|l| !l.starts_with("acked ")) {
        eprintln!("the resumed leader: {line}");
    }
    let acked: BTreeSet<u64> = numbered("acked ").into_iter().collect();
    let failed = numbered("failed ");
    assert!(
        lines.iter().any(|l| l.starts_with("fenced ")),
        "the resumed leader was not fenced off: {:?}",
        &lines[lines.len().saturating_sub(10)..]
    );
    assert!(
        lines
            .iter()
            .filter(|l| l.starts_with("failed "))
            .all(|l| l.contains("unavailable=true")),
        "{lines:?}"
    );
    let in_log = keys_with(store, "leader").await;
    assert!(in_log.values().all(|&c| c == 1), "duplicated keys");
    let mut per_batch: BTreeMap<u64, usize> = BTreeMap::new();
    for key in in_log.keys() {
        *per_batch.entry(batch_of(key)).or_default() += 1;
    }
    let logged: BTreeSet<u64> = per_batch.keys().copied().collect();
    assert_eq!(logged, acked, "batches in the log vs acked");
    assert!(
        per_batch.values().all(|&c| c == LEADER_BATCH),
        "partial batch"
    );
    for n in &failed {
        assert!(!logged.contains(n), "batch {n} failed yet is in the log");
    }
    let (leader_last, standby_first): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT max(seq) FROM events WHERE idempotency_key LIKE 'leader-%'),
                (SELECT min(seq) FROM events WHERE idempotency_key LIKE 'standby-%')",
    )
    .fetch_one(store.pool())
    .await
    .expect("leader and standby seqs");
    assert!(
        leader_last < standby_first,
        "old epoch wrote after the takeover"
    );
    let epochs: Vec<(i64,)> =
        sqlx::query_as("SELECT DISTINCT epoch FROM events WHERE idempotency_key LIKE 'leader-%'")
            .fetch_all(store.pool())
            .await
            .expect("leader epochs");
    assert_eq!(epochs, vec![(1,)]);
    let total = assert_dense(store).await;
    eprintln!(
        "log: {total} events, {} leader batches acked and present, failed: {failed:?}, 0 lost, 0 duplicated",
        acked.len()
    );
}

// ---------------------------------------------------------------------------
// The server stopped, then started again.

/// Runs `call` with the server down: it must fail as unavailable, fast.
async fn fails_fast<T: std::fmt::Debug>(
    name: &str,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Duration {
    let started = Instant::now();
    let out = call.await;
    let took = started.elapsed();
    match out {
        Err(e) => {
            eprintln!("{name}: {took:?}: {e}");
            assert!(e.is_unavailable(), "{name}: not unavailable: {e}");
        }
        Ok(v) => panic!("{name} succeeded with the server down: {v:?}"),
    }
    assert!(took < Duration::from_millis(1500), "{name} took {took:?}");
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_fail_fast_while_postgres_is_down_and_work_again_after() {
    let pg = PrivatePostgres::start();
    let store = store_on(&pg, StoreOptions::default()).await;
    let lease = take_lease(&store, SERVICE, "leader", Duration::from_secs(60)).await;
    let fence = lease.fence();
    store
        .append(&keyed_batch("before", 0, 10), &fence)
        .await
        .expect("append before the outage");

    pg.stop(StopMode::Fast).await;
    let keys = vec!["before-0-0".to_string()];
    let took = [
        fails_fast("append", store.append(&keyed_batch("down", 0, 3), &fence)).await,
        fails_fast("read_from", store.read_from(0, 100)).await,
        fails_fast("max_seq", store.max_seq()).await,
        fails_fast("events_by_keys", store.events_by_keys(&keys)).await,
        fails_fast("job_events", store.job_events(JobId(1))).await,
        fails_fast(
            "acquire_lease",
            store.acquire_lease("quota", PARTITION, "q", TTL),
        )
        .await,
        fails_fast("renew_lease", store.renew_lease(&lease, TTL)).await,
        fails_fast("lease", store.lease(SERVICE, PARTITION)).await,
        fails_fast("allocate_job_ids", store.allocate_job_ids(1)).await,
    ];
    eprintln!(
        "slowest failure with the server down: {:?}",
        took.iter().max()
    );

    pg.start_again().await;
    let out = store
        .append(&keyed_batch("after", 0, 10), &fence)
        .await
        .expect("the same store appends once the server is back");
    assert_eq!(out.appended, 10);
    assert_eq!(keys_with(&store, "before").await.len(), 10, "lost events");
    assert_eq!(keys_with(&store, "after").await.len(), 10);
    assert_eq!(assert_dense(&store).await, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_fails_fast_when_the_server_is_down() {
    let pg = PrivatePostgres::start();
    pg.stop(StopMode::Fast).await;
    let options = StoreOptions {
        startup_timeout: Duration::ZERO,
        ..StoreOptions::default()
    };
    let started = Instant::now();
    let err = EventStore::connect_with(&pg.url("postgres"), options)
        .await
        .expect_err("nothing to connect to");
    let took = started.elapsed();
    eprintln!("connect with the server down: {took:?}: {err}");
    assert_eq!(err.outage(), Some(Outage::PoolTimedOut), "{err}");
    assert!(took < Duration::from_millis(1500), "took {took:?}");
}

// ---------------------------------------------------------------------------
// Restarts while appends run.

/// What the appending loop saw.
#[derive(Debug, Default)]
struct LoopReport {
    /// Batches acknowledged.
    acked: u64,
    /// Attempts that failed (all as unavailable), by outage.
    failures: BTreeMap<String, u64>,
    /// Retries that found their batch already written (the failed attempt
    /// had committed).
    already_written: u64,
}

/// Appends keyed batches until `stop`, retrying each failed batch with the
/// same keys until it is acknowledged.
async fn append_until(store: EventStore, fence: Fence, stop: Arc<AtomicBool>) -> LoopReport {
    const SIZE: usize = 5;
    let mut report = LoopReport::default();
    while !stop.load(Ordering::Relaxed) {
        let batch = keyed_batch("loop", report.acked, SIZE);
        for attempt in 0.. {
            assert!(attempt < 2000, "batch {} never went in", report.acked);
            match store.append(&batch, &fence).await {
                Ok(out) => {
                    assert_eq!(out.appended + out.duplicates, SIZE as u64);
                    assert!(out.appended == 0 || out.duplicates == 0, "{out:?}");
                    report.already_written += u64::from(out.duplicates > 0);
                    break;
                }
                Err(e) => {
                    let outage = e.outage().unwrap_or_else(|| panic!("not unavailable: {e}"));
                    *report.failures.entry(format!("{outage:?}")).or_default() += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        report.acked += 1;
    }
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_during_appends_lose_and_duplicate_nothing() {
    let pg = PrivatePostgres::start();
    let store = store_on(&pg, StoreOptions::default()).await;
    let lease = take_lease(&store, SERVICE, "leader", Duration::from_secs(120)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let appender = tokio::spawn(append_until(store.clone(), lease.fence(), stop.clone()));
    // Each outage lasts longer than the pool's acquire timeout, so the
    // loop sees it fail however the restart lines up with its appends (a
    // shorter one can fall between two appends and only slow one down).
    let down = StoreOptions::default().acquire_timeout + Duration::from_millis(500);
    for mode in [StopMode::Fast, StopMode::Immediate] {
        tokio::time::sleep(Duration::from_millis(500)).await;
        pg.stop(mode).await;
        tokio::time::sleep(down).await;
        pg.start_again().await;
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, Ordering::Relaxed);
    let report = appender.await.expect("the appending loop");
    eprintln!("appends across a fast and an immediate restart: {report:?}");

    let in_log = keys_with(&store, "loop").await;
    let expected: BTreeSet<String> = (0..report.acked)
        .flat_map(|n| (0..5).map(move |i| format!("loop-{n}-{i}")))
        .collect();
    let present: BTreeSet<String> = in_log.keys().cloned().collect();
    let lost = expected.difference(&present).count();
    let extra = present.difference(&expected).count();
    let duplicated = in_log.values().filter(|&&c| c > 1).count();
    eprintln!(
        "acked {} events, present {}: lost {lost}, unacked extra {extra}, duplicated {duplicated}",
        expected.len(),
        present.len()
    );
    assert_eq!((lost, extra, duplicated), (0, 0, 0), "{}", pg.server_log());
    assert_eq!(assert_dense(&store).await, expected.len() as i64);
    assert!(
        report.failures.values().sum::<u64>() > 0,
        "the loop never saw the restarts"
    );
}

// ---------------------------------------------------------------------------
// A lock held by a session the idle timeout does not end.

#[tokio::test]
async fn a_writer_blocked_on_the_lease_row_gives_up_after_the_lock_timeout() {
    let db = gpusched_store::testing::TestDb::new().await;
    let options = StoreOptions {
        lock_timeout: Some(Duration::from_millis(300)),
        ..StoreOptions::default()
    };
    let store = EventStore::connect_with(&db.url, options)
        .await
        .expect("connect");
    let lease = take_lease(&store, SERVICE, "leader", Duration::from_secs(60)).await;
    // Another session (without the store's timeouts) holds the lease row.
    let mut holder = db.store.pool().begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM leases WHERE service = $1 FOR UPDATE")
        .bind(SERVICE)
        .execute(&mut *holder)
        .await
        .expect("lock the lease row");

    let started = Instant::now();
    let err = store
        .append(&keyed_batch("blocked", 0, 3), &lease.fence())
        .await
        .expect_err("the lease row is locked");
    let append_took = started.elapsed();
    assert_eq!(err.outage(), Some(Outage::LockTimedOut), "{err}");
    let err = store
        .renew_lease(&lease, TTL)
        .await
        .expect_err("the lease row is locked");
    assert_eq!(err.outage(), Some(Outage::LockTimedOut), "{err}");
    eprintln!("append behind a held lease row failed after {append_took:?}: {err}");
    assert!(append_took < Duration::from_secs(5), "took {append_took:?}");

    holder.rollback().await.expect("release the row");
    store
        .append(&keyed_batch("free", 0, 3), &lease.fence())
        .await
        .expect("append once the row is free");
    assert!(keys_with(&store, "blocked").await.is_empty());
    assert_eq!(assert_dense(&store).await, 3);
}
