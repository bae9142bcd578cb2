//! gpusched store: the durable event log in Postgres and the fencing leases
//! that make one instance per partition the only writer (docs/architecture.md,
//! "Services: one log, many writers").
//!
//! Owns: the `events`, `leases` and `snapshots` tables and their migrations
//! (`migrations/` at the workspace root, embedded), batched fenced appends,
//! reads in sequence order, and replay through `State::apply`.
//!
//! Must never: UPDATE or DELETE an event (the migration's triggers refuse
//! it as well), write anything when the fence's epoch is stale, decide
//! scheduling (that is `gpusched-core`), or let replay skip or reorder an
//! event.
//!
//! Ordering: appends take a transaction-scoped advisory lock before they
//! insert, so sequence numbers are assigned and committed in the same order.
//! A reader tailing with `read_from(last_seq, ..)` therefore never misses a
//! row that commits later with a smaller sequence. Under that lock the
//! append numbers its rows itself (`max(seq) + 1, …`), so the log is dense:
//! no gaps for rolled-back appends or skipped duplicates, and a follower
//! that has applied N knows the next event is N + 1. `recorded_at` is taken
//! after that lock (`clock_timestamp()`), so it does not decrease along the
//! sequence unless the database clock steps back.
//!
//! Waiting is bounded (`StoreOptions`). A call gets a connection within
//! the acquire timeout or fails as unavailable (so with the database down
//! every call fails in about a second, and the pool reconnects by itself
//! once it is back); the one wait left unbounded is a statement already
//! sent on a connection that then goes silent without a reset (a cut
//! network), which lasts until TCP gives up. The server ends a session that
//! sits idle inside a transaction (a writer paused mid-append: its
//! transaction aborts and its locks go), and a statement waiting on the
//! lease row or the append lock gives up after the lock timeout; so one
//! stalled writer stalls the others only briefly, never for as long as it
//! is paused, and never commits after a takeover.
//!
//! Replay folds every event with `State::apply`. An event `apply` refuses
//! (a decision another writer's earlier event made void, e.g. an admission
//! of a job cancelled just before) changes nothing and is counted as
//! superseded: every follower and every replay skips the same events, so
//! they all reach the same state.
//!
//! Sequences and epochs are `u64` in every signature; the columns are
//! `bigint`, and the store converts each value once, where it reads or
//! binds it (`error.rs`): a negative one read back is `StoreError::Corrupt`,
//! one above `SEQ_MAX` given to it is `StoreError::OutOfRange`, never a 0
//! or a clamp.

mod error;
mod lease;
mod lease_session;
mod meta;
mod read;
mod snapshots;
pub mod testing;

pub use error::{Outage, Result, StoreError};
pub use lease::{Fence, Lease};
pub use lease_session::LeaseSession;
pub use meta::{aggregate_of, producer_name, AggregateKind};
pub use read::{LogEntry, Pages};
pub use snapshots::{Found, SkipReason, Skipped, SnapshotInfo};

use chrono::{DateTime, Utc};
use error::{from_bigint, to_bigint};
use gpusched_core::State;
use gpusched_events::Event;
use gpusched_model::JobId;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::Row;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// The schema version written with every event; rows with a newer version
/// are refused on read rather than misread.
pub const SCHEMA_VERSION: i32 = 1;

/// The largest sequence (or epoch) the log can hold: `bigint`'s maximum.
/// A read bounded by it reads to the end of the log; a larger value given
/// to the store is refused (`StoreError::OutOfRange`).
pub const SEQ_MAX: u64 = i64::MAX.unsigned_abs();

/// Rows fetched per round trip during replay.
pub const REPLAY_PAGE: usize = 10_000;

/// Advisory-lock key serialising appends (so commit order is sequence
/// order). Any constant no other part of gpusched uses.
const APPEND_LOCK_KEY: i64 = 0x6770_7573_6368_6564; // "gpusched"

/// The SHA-384 of migration 1 as first released: only its first comment
/// line changed since, so a database that applied it is brought up to the
/// current checksum instead of refusing to start.
const MIGRATION_1_OLD_CHECKSUM: &str = "b81973fcb035131429bc2d101173561495bdcd32b4b45dd70d4513a3567d64673252984023578e013d45e459d62b96f6";

/// Records the current checksum of migration 1 where the old one is stored.
async fn repair_first_migration_checksum(conn: &mut sqlx::PgConnection) -> Result<()> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    let current = MIGRATOR.iter().find(|m| m.version == 1);
    let old: Vec<u8> = (0..MIGRATION_1_OLD_CHECKSUM.len() / 2)
        .filter_map(|i| u8::from_str_radix(&MIGRATION_1_OLD_CHECKSUM[2 * i..2 * i + 2], 16).ok())
        .collect();
    if let (true, Some(m)) = (exists, current) {
        sqlx::query(
            "UPDATE _sqlx_migrations SET checksum = $1 WHERE version = 1 AND checksum = $2",
        )
        .bind(m.checksum.as_ref())
        .bind(old)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// The refusals `gpusched_append` raises (SQLSTATE GS001: no lease, GS002:
/// another epoch, its DETAIL the lease's epoch) as the store's errors;
/// anything else as it is.
fn fence_refusal(e: sqlx::Error, fence: &Fence) -> StoreError {
    let Some(db) = e.as_database_error() else {
        return e.into();
    };
    match db.code().as_deref() {
        Some("GS001") => StoreError::NoLease {
            service: fence.service.clone(),
            partition: fence.partition.clone(),
        },
        Some("GS002") => {
            let held = db
                .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                .and_then(|pg| pg.detail())
                .and_then(|d| d.parse::<u64>().ok());
            StoreError::StaleEpoch {
                service: fence.service.clone(),
                partition: fence.partition.clone(),
                held,
                given: fence.epoch,
            }
        }
        _ => e.into(),
    }
}

/// The embedded migrations (`migrations/` at the workspace root).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// An event to append, with its delivery metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct NewEvent {
    /// The event.
    pub event: Event,
    /// Unique key of this event: an append carrying a key already in the log
    /// skips the event (client submissions, redelivered messages).
    pub idempotency_key: Option<String>,
    /// The event (or command) that caused this one.
    pub causation_id: Option<Uuid>,
    /// The request or flow this event is part of.
    pub correlation_id: Option<Uuid>,
}

impl NewEvent {
    /// An event with no metadata.
    pub fn new(event: Event) -> Self {
        NewEvent {
            event,
            idempotency_key: None,
            causation_id: None,
            correlation_id: None,
        }
    }

    /// Sets the idempotency key.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Sets the causation id.
    pub fn caused_by(mut self, id: Uuid) -> Self {
        self.causation_id = Some(id);
        self
    }

    /// Sets the correlation id.
    pub fn correlated_with(mut self, id: Uuid) -> Self {
        self.correlation_id = Some(id);
        self
    }
}

impl From<Event> for NewEvent {
    fn from(event: Event) -> Self {
        NewEvent::new(event)
    }
}

/// What an append wrote.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct AppendOutcome {
    /// Sequence of the first event written (`None`: nothing written).
    pub first_seq: Option<u64>,
    /// Sequence of the last event written (`None`: nothing written).
    pub last_seq: Option<u64>,
    /// Events written.
    pub appended: u64,
    /// Events skipped because their idempotency key was already in the log
    /// (or earlier in the same batch).
    pub duplicates: u64,
    /// Per event of the batch, in order: its sequence, or `None` when it
    /// was skipped as a duplicate.
    pub seqs: Vec<Option<u64>>,
}

/// What a replay folded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ReplayOutcome {
    /// Sequence of the last event read (the starting point when none).
    pub last_seq: u64,
    /// Events applied.
    pub applied: u64,
    /// Events `State::apply` refused (decisions made void by an earlier
    /// event of another writer); they changed nothing.
    pub superseded: u64,
}

/// An event as stored in the log.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredEvent {
    /// Global sequence: the order of the log.
    pub seq: u64,
    /// When it was recorded (database clock).
    pub recorded_at: DateTime<Utc>,
    /// The aggregate kind, e.g. `job`.
    pub aggregate_kind: String,
    /// The aggregate id, e.g. the job's number.
    pub aggregate_id: String,
    /// `Event::kind()`.
    pub kind: String,
    /// Schema version of the payload.
    pub schema_version: i32,
    /// `Event::producer()` by name.
    pub producer: String,
    /// Fencing epoch the writer held.
    pub epoch: u64,
    /// The cause, if recorded.
    pub causation_id: Option<Uuid>,
    /// The correlation, if recorded.
    pub correlation_id: Option<Uuid>,
    /// The idempotency key, if any.
    pub idempotency_key: Option<String>,
    /// The event.
    pub event: Event,
}

/// How far a replay goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    /// The whole log as committed now.
    All,
    /// Events with sequence ≤ n (at most `SEQ_MAX`).
    Seq(u64),
    /// The prefix of the log recorded at or before this time: replay stops
    /// at the first event recorded after it.
    Time(DateTime<Utc>),
}

/// How the store connects and how long it lets anything wait
/// (`EventStore::connect_with`). `StoreOptions::default()` is what
/// `EventStore::connect` uses, with its pool size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreOptions {
    /// Connections in the pool.
    pub max_connections: u32,
    /// Longest a call waits for a connection, connecting included; then it
    /// fails with `Outage::PoolTimedOut`. With the database down or
    /// unreachable every call fails within about this long.
    pub acquire_timeout: Duration,
    /// How long `connect_with` keeps trying to reach the database (a
    /// service started together with its database waits for it); zero:
    /// one attempt. Calls after that never wait for it.
    pub startup_timeout: Duration,
    /// The server ends a session whose transaction sits idle this long
    /// (`idle_in_transaction_session_timeout`): a writer paused inside an
    /// append loses its transaction and its locks, so it holds up other
    /// writers and a lease takeover at most this long. Keep it well under
    /// the lease TTL. `None`: the server's setting.
    pub idle_in_transaction_timeout: Option<Duration>,
    /// Longest a statement waits for a lock (`lock_timeout`): the lease row
    /// or the append lock, held by a writer that has not finished. Longer
    /// than `idle_in_transaction_timeout`, so a writer queued behind a
    /// paused one gets through once the server ends the paused one's
    /// transaction; shorter than the lease TTL. `None`: the server's
    /// setting.
    pub lock_timeout: Option<Duration>,
    /// Longest a statement runs (`statement_timeout`); migrations are
    /// exempt. `None`: the server's setting.
    pub statement_timeout: Option<Duration>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_connections: 4,
            acquire_timeout: Duration::from_secs(1),
            startup_timeout: Duration::from_secs(30),
            idle_in_transaction_timeout: Some(Duration::from_secs(1)),
            lock_timeout: Some(Duration::from_secs(2)),
            statement_timeout: Some(Duration::from_secs(30)),
        }
    }
}

impl StoreOptions {
    /// The settings every connection of the store starts with. Server
    /// notices below warnings (such as "relation … already exists,
    /// skipping" from an idempotent migration) are not sent to the client.
    fn session_settings(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![("client_min_messages", "warning".to_string())];
        let timeouts = [
            (
                "idle_in_transaction_session_timeout",
                self.idle_in_transaction_timeout,
            ),
            ("lock_timeout", self.lock_timeout),
            ("statement_timeout", self.statement_timeout),
        ];
        for (name, value) in timeouts {
            if let Some(d) = value {
                out.push((name, pg_millis(d).to_string()));
            }
        }
        out
    }
}

/// A duration as a Postgres timeout setting in milliseconds: rounded up
/// (0 would turn the timeout off) and capped at what the setting holds.
fn pg_millis(d: Duration) -> u128 {
    d.as_nanos().div_ceil(1_000_000).clamp(1, i32::MAX as u128)
}

/// Pause between attempts to reach the database in `connect_with`.
const STARTUP_RETRY: Duration = Duration::from_millis(250);

/// The event log: a handle on a Postgres pool.
#[derive(Clone, Debug)]
pub struct EventStore {
    pool: PgPool,
}

const SELECT_COLUMNS: &str = "seq, recorded_at, aggregate_kind, aggregate_id, kind, \
     schema_version, producer, epoch, causation_id, correlation_id, idempotency_key, \
     payload::text AS payload";

impl EventStore {
    /// A store on an existing pool, with that pool's settings: the
    /// timeouts of `StoreOptions` are set by `connect`/`connect_with` only.
    pub fn new(pool: PgPool) -> Self {
        EventStore { pool }
    }

    /// Connects to `url` with a pool of up to `max_connections` and the
    /// other `StoreOptions` defaults.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self> {
        let options = StoreOptions {
            max_connections,
            ..StoreOptions::default()
        };
        Self::connect_with(url, options).await
    }

    /// Connects to `url` with these options, waiting up to
    /// `options.startup_timeout` for the database to accept a connection.
    /// A failure retrying cannot cure (a wrong password, a missing
    /// database) returns at once.
    pub async fn connect_with(url: &str, options: StoreOptions) -> Result<Self> {
        let connect: PgConnectOptions = url.parse()?;
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .connect_lazy_with(connect.options(options.session_settings()));
        let store = EventStore { pool };
        store.wait_for_database(options.startup_timeout).await?;
        Ok(store)
    }

    /// Tries to get a connection until one comes, a failure retrying cannot
    /// cure, or `within` has passed.
    async fn wait_for_database(&self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let err = match self.pool.acquire().await {
                Ok(_) => return Ok(()),
                Err(e) => StoreError::from(e),
            };
            if !err.is_unavailable() || Instant::now() >= deadline {
                return Err(err);
            }
            tokio::time::sleep(STARTUP_RETRY).await;
        }
    }

    /// Creates the database `url` names when it does not exist yet; true if
    /// this call created it. Safe to race: several services started together
    /// with `--create-database` all succeed.
    pub async fn create_database_if_missing(url: &str) -> Result<bool> {
        use sqlx::migrate::MigrateDatabase;
        if sqlx::Postgres::database_exists(url).await? {
            return Ok(false);
        }
        match sqlx::Postgres::create_database(url).await {
            Ok(()) => Ok(true),
            // Another process created it between the check and the create.
            Err(_) if sqlx::Postgres::database_exists(url).await? => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// The underlying pool (for SQL incident review and tests).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies the embedded migrations that have not run yet. They run
    /// without the lock and statement timeouts (they may wait for another
    /// instance migrating, and rewrite a large table), on a connection that
    /// is closed afterwards rather than returned to the pool.
    pub async fn migrate(&self) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        conn.close_on_drop();
        sqlx::raw_sql("SET lock_timeout = 0; SET statement_timeout = 0")
            .execute(&mut *conn)
            .await?;
        repair_first_migration_checksum(&mut conn).await?;
        MIGRATOR.run(&mut *conn).await?;
        Ok(())
    }

    /// Appends `batch` in one transaction, in order, under `fence`.
    ///
    /// The transaction is one statement, `gpusched_append` (migration
    /// 0005), committed on the server: it share-locks the lease row and
    /// checks the epoch (`StoreError::StaleEpoch` or `StoreError::NoLease`:
    /// nothing is written), takes the append lock, then inserts every event
    /// with one `INSERT … SELECT FROM UNNEST`. Events whose idempotency key
    /// is already in the log are skipped and counted in `duplicates`. A
    /// lease takeover waits for in-flight appends under the old epoch and
    /// every later append under it is refused. No round trip to the caller
    /// happens while the append lock is held, so a slow or paused caller
    /// never holds up the other writers.
    ///
    /// Waiting is bounded (module docs): behind a stalled writer this fails
    /// with `Outage::LockTimedOut` after the lock timeout. An `Unavailable`
    /// error while the statement ran leaves it unknown whether the batch
    /// committed: retrying it with the same idempotency keys writes each
    /// event at most once.
    pub async fn append(&self, batch: &[NewEvent], fence: &Fence) -> Result<AppendOutcome> {
        let n = batch.len();
        let mut agg_kinds: Vec<&'static str> = Vec::with_capacity(n);
        let mut agg_ids: Vec<String> = Vec::with_capacity(n);
        let mut kinds: Vec<&'static str> = Vec::with_capacity(n);
        let mut payloads: Vec<String> = Vec::with_capacity(n);
        let mut producers: Vec<&'static str> = Vec::with_capacity(n);
        let mut causations: Vec<Option<Uuid>> = Vec::with_capacity(n);
        let mut correlations: Vec<Option<Uuid>> = Vec::with_capacity(n);
        let mut keys: Vec<Option<&str>> = Vec::with_capacity(n);
        // A key repeated inside the batch: only its first event is written.
        let mut keep: Vec<bool> = Vec::with_capacity(n);
        let mut seen_keys = std::collections::HashSet::new();
        for ne in batch {
            keep.push(
                ne.idempotency_key
                    .as_deref()
                    .is_none_or(|k| seen_keys.insert(k)),
            );
            let ev = &ne.event;
            let (ak, ai) = aggregate_of(ev);
            agg_kinds.push(ak.as_str());
            agg_ids.push(ai);
            kinds.push(ev.kind());
            payloads.push(
                serde_json::to_string(ev).map_err(|source| StoreError::Encode {
                    kind: ev.kind(),
                    source,
                })?,
            );
            producers.push(producer_name(ev.producer()));
            causations.push(ne.causation_id);
            correlations.push(ne.correlation_id);
            keys.push(ne.idempotency_key.as_deref());
        }

        // One statement, its own transaction: the append lock is taken,
        // the rows written and the transaction committed on the server,
        // so no client pause ever holds the lock (migration 0005).
        let rows = sqlx::query(
            "SELECT out_ord AS ord, out_seq AS seq FROM gpusched_append(
                 $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
        )
        .bind(&fence.service)
        .bind(&fence.partition)
        .bind(to_bigint("leases.epoch", fence.epoch)?)
        .bind(APPEND_LOCK_KEY)
        .bind(SCHEMA_VERSION)
        .bind(&agg_kinds)
        .bind(&agg_ids)
        .bind(&kinds)
        .bind(&payloads)
        .bind(&producers)
        .bind(&causations)
        .bind(&correlations)
        .bind(&keys)
        .bind(&keep)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| fence_refusal(e, fence))?;
        let mut seqs: Vec<Option<u64>> = vec![None; n];
        for row in &rows {
            let ord: i64 = row.try_get("ord")?;
            let seq = from_bigint("events.seq", row.try_get("seq")?)?;
            if let Some(slot) = usize::try_from(ord - 1).ok().and_then(|i| seqs.get_mut(i)) {
                *slot = Some(seq);
            }
        }
        let appended = rows.len() as u64;
        Ok(AppendOutcome {
            first_seq: seqs.iter().flatten().min().copied(),
            last_seq: seqs.iter().flatten().max().copied(),
            appended,
            duplicates: (n as u64).saturating_sub(appended),
            seqs,
        })
    }

    /// Up to `limit` events with sequence > `after_seq`, in sequence order.
    pub async fn read_from(&self, after_seq: u64, limit: usize) -> Result<Vec<StoredEvent>> {
        self.read_range(after_seq, SEQ_MAX, limit).await
    }

    /// Up to `limit` events with `after_seq` < sequence ≤ `upto_seq`, in order.
    async fn read_range(
        &self,
        after_seq: u64,
        upto_seq: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>> {
        let (after, upto) = (
            to_bigint("events.seq", after_seq)?,
            to_bigint("events.seq", upto_seq)?,
        );
        let sql = format!(
            "SELECT {SELECT_COLUMNS} FROM events WHERE seq > $1 AND seq <= $2 ORDER BY seq LIMIT $3"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(after)
            .bind(upto)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(stored_from_row).collect()
    }

    /// The highest sequence in the log; 0 when it is empty (so
    /// `read_from(0, ..)` reads from the start).
    pub async fn max_seq(&self) -> Result<u64> {
        let max: Option<i64> = sqlx::query_scalar("SELECT max(seq) FROM events")
            .fetch_one(&self.pool)
            .await?;
        max.map_or(Ok(0), |m| from_bigint("events.seq", m))
    }

    /// The sequence of the last event of `producer` at or before `upto`
    /// (0: none). Walks the log backwards by sequence, so it is quick when
    /// the producer wrote recently.
    pub async fn last_seq_of(&self, producer: &str, upto: u64) -> Result<u64> {
        let seq: Option<i64> = sqlx::query_scalar(
            "SELECT seq FROM events WHERE producer = $1 AND seq <= $2 ORDER BY seq DESC LIMIT 1",
        )
        .bind(producer)
        .bind(to_bigint("events.seq", upto)?)
        .fetch_optional(&self.pool)
        .await?;
        seq.map_or(Ok(0), |s| from_bigint("events.seq", s))
    }

    /// Every event of one job, in sequence order.
    pub async fn job_events(&self, job: JobId) -> Result<Vec<StoredEvent>> {
        let sql = format!(
            "SELECT {SELECT_COLUMNS} FROM events
              WHERE aggregate_kind = 'job' AND aggregate_id = $1 ORDER BY seq"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(job.0.to_string())
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(stored_from_row).collect()
    }

    /// The preemption plans that chose `job` as a victim, in order.
    pub async fn plans_naming_victim(&self, job: JobId) -> Result<Vec<StoredEvent>> {
        let sql = format!(
            "SELECT {SELECT_COLUMNS} FROM events
              WHERE kind = 'preemption_planned' AND payload -> 'victims' @> $1::jsonb
              ORDER BY seq"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(serde_json::json!([{ "job": job.0 }]))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(stored_from_row).collect()
    }

    /// Rebuilds the state from an empty one by folding the log with
    /// `State::apply`, up to `until`.
    pub async fn replay(&self, until: Until) -> Result<State> {
        let mut state = State::new();
        self.replay_onto(&mut state, 0, until).await?;
        Ok(state)
    }

    /// Folds the events after `after_seq` up to `until` onto `state` (a
    /// state that has applied exactly the log up to `after_seq`), reading
    /// `REPLAY_PAGE` rows at a time, a page ahead. Events `apply` refuses are skipped and
    /// counted as superseded (module docs).
    pub async fn replay_onto(
        &self,
        state: &mut State,
        after_seq: u64,
        until: Until,
    ) -> Result<ReplayOutcome> {
        let upto = match until {
            Until::Seq(n) => n,
            Until::All | Until::Time(_) => SEQ_MAX,
        };
        let mut out = ReplayOutcome {
            last_seq: after_seq,
            ..ReplayOutcome::default()
        };
        let mut pages = self.pages(after_seq, upto, REPLAY_PAGE);
        while let Some(page) = pages.next().await {
            for entry in page? {
                if let Until::Time(t) = until {
                    if entry.recorded_at > t {
                        return Ok(out);
                    }
                }
                match state.apply(&entry.event) {
                    Ok(()) => out.applied += 1,
                    Err(_) => out.superseded += 1,
                }
                out.last_seq = entry.seq;
            }
        }
        Ok(out)
    }

    /// The events carrying these idempotency keys, by key (keys not in the
    /// log are absent).
    pub async fn events_by_keys(
        &self,
        keys: &[String],
    ) -> Result<std::collections::HashMap<String, StoredEvent>> {
        let sql =
            format!("SELECT {SELECT_COLUMNS} FROM events WHERE idempotency_key = ANY($1::text[])");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(keys)
            .fetch_all(&self.pool)
            .await?;
        let mut out = std::collections::HashMap::with_capacity(rows.len());
        for row in &rows {
            let se = stored_from_row(row)?;
            if let Some(k) = se.idempotency_key.clone() {
                out.insert(k, se);
            }
        }
        Ok(out)
    }

    /// Measures the raw batched-append ceiling of this database: `rows`
    /// rows of a typical event (≈ 230 B of JSON) inserted with UNNEST,
    /// `batch` rows per transaction, into a scratch table (logged, like the
    /// log; dropped afterwards). Returns rows per second.
    pub async fn raw_append_ceiling(&self, rows: usize, batch: usize) -> Result<f64> {
        let batch = batch.max(1);
        let mut conn = self.pool.acquire().await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS scratch_append_ceiling (
                seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(),
                kind text NOT NULL, payload jsonb NOT NULL, producer text NOT NULL)",
        )
        .execute(&mut *conn)
        .await?;
        let payload = r#"{"type":"job_submitted","job":1,"spec":{"tenant":"tenant-17","priority":0,"workers":4,"gpus_per_worker":8,"flavors":["h100"],"topology":"block","preemptible":true,"checkpoint":null,"max_runtime_s":86400},"at":1000}"#;
        let kinds = vec!["job_submitted"; batch];
        let payloads = vec![payload; batch];
        let producers = vec!["gateway"; batch];
        let started = std::time::Instant::now();
        let mut done = 0usize;
        while done < rows {
            sqlx::query(
                "INSERT INTO scratch_append_ceiling (kind, payload, producer)
                 SELECT k, p::jsonb, pr FROM UNNEST($1::text[], $2::text[], $3::text[]) AS t(k, p, pr)",
            )
            .bind(&kinds)
            .bind(&payloads)
            .bind(&producers)
            .execute(&mut *conn)
            .await?;
            done += batch;
        }
        let secs = started.elapsed().as_secs_f64();
        sqlx::query("DROP TABLE IF EXISTS scratch_append_ceiling")
            .execute(&mut *conn)
            .await?;
        Ok(done as f64 / secs.max(1e-9))
    }

    /// Draws `n` fresh job ids, never handed out before by any instance.
    pub async fn allocate_job_ids(&self, n: u32) -> Result<Vec<u64>> {
        let ids: Vec<i64> =
            sqlx::query_scalar("SELECT nextval('job_ids') FROM generate_series(1, $1)")
                .bind(i64::from(n))
                .fetch_all(&self.pool)
                .await?;
        Ok(ids
            .into_iter()
            .filter_map(|i| u64::try_from(i).ok())
            .collect())
    }
}

/// Decodes a row of `SELECT_COLUMNS`, by position: the indices follow that
/// list's order, so a column added there is added here at its place.
fn stored_from_row(row: &PgRow) -> Result<StoredEvent> {
    let seq = from_bigint("events.seq", row.try_get(0)?)?;
    let schema_version: i32 = row.try_get(5)?;
    let payload: &str = row.try_get(11)?;
    let event = decode_payload(seq, schema_version, payload)?;
    Ok(StoredEvent {
        seq,
        recorded_at: row.try_get(1)?,
        aggregate_kind: row.try_get(2)?,
        aggregate_id: row.try_get(3)?,
        kind: row.try_get(4)?,
        schema_version,
        producer: row.try_get(6)?,
        epoch: from_bigint("events.epoch", row.try_get(7)?)?,
        causation_id: row.try_get(8)?,
        correlation_id: row.try_get(9)?,
        idempotency_key: row.try_get(10)?,
        event,
    })
}

/// The event in a row's payload; a newer schema than this build knows is
/// refused rather than misread.
fn decode_payload(seq: u64, schema_version: i32, payload: &str) -> Result<Event> {
    if schema_version > SCHEMA_VERSION {
        return Err(StoreError::UnknownSchema {
            seq,
            version: schema_version,
        });
    }
    serde_json::from_str(payload).map_err(|source| StoreError::Decode { seq, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_become_session_settings_in_whole_milliseconds() {
        let options = StoreOptions {
            idle_in_transaction_timeout: Some(Duration::from_micros(1_500)),
            lock_timeout: Some(Duration::from_secs(2)),
            statement_timeout: None,
            ..StoreOptions::default()
        };
        let settings = options.session_settings();
        let get = |name: &str| {
            settings
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("client_min_messages"), Some("warning"));
        assert_eq!(get("idle_in_transaction_session_timeout"), Some("2"));
        assert_eq!(get("lock_timeout"), Some("2000"));
        assert_eq!(get("statement_timeout"), None);
    }

    #[test]
    fn tiny_and_huge_timeouts_stay_on_and_in_range() {
        assert_eq!(pg_millis(Duration::from_nanos(1)), 1);
        assert_eq!(pg_millis(Duration::ZERO), 1);
        assert_eq!(pg_millis(Duration::from_secs(u64::MAX)), i32::MAX as u128);
    }

    #[test]
    fn defaults_clear_a_paused_writer_before_waiters_give_up() {
        let o = StoreOptions::default();
        let idle = o.idle_in_transaction_timeout.unwrap();
        let lock = o.lock_timeout.unwrap();
        assert!(idle < lock, "waiters must outlast the idle timeout");
        assert!(lock < Duration::from_secs(5), "under the default lease TTL");
        assert!(o.acquire_timeout <= Duration::from_secs(1));
    }
}
