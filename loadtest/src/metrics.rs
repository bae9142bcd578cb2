//! What a run measured, read back from the event log after the run and
//! from the samples taken during it.
//!
//! Owns: the SQL over the run's `events` table (counts per kind and
//! second, submit→bound latency per job, lost work of preemptions), the
//! fold of the whole log for goodput and reclaim latencies (`fold_log`),
//! the percentiles, and the per-second series the plots draw.
//!
//! Must never: write to the log, or read anything but the run's own
//! database.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use gpusched_core::GoodputSummary;
use gpusched_store::EventStore;
use serde::Serialize;
use sqlx::Row;

/// Ticks a second of log time is counted in.
const TICKS_PER_S: i64 = 100;
/// One tick of log time, seconds: rates are counted to it.
const TICK_S: f64 = 1.0 / TICKS_PER_S as f64;

/// The `q` quantile (0..=1) of sorted values (nearest rank); 0 when empty.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// p50, p99 and p99.9 of a sample, milliseconds.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Percentiles {
    /// Sample size.
    pub n: usize,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
}

impl Percentiles {
    /// Of an unsorted sample.
    pub fn of(mut v: Vec<f64>) -> Self {
        v.sort_by(f64::total_cmp);
        Percentiles {
            n: v.len(),
            p50: quantile(&v, 0.5),
            p99: quantile(&v, 0.99),
            p999: quantile(&v, 0.999),
            max: v.last().copied().unwrap_or(0.0),
        }
    }
}

/// One job's way from submission to binding.
#[derive(Clone, Debug)]
pub struct JobLatency {
    /// Tenant.
    pub tenant: String,
    /// When it was submitted (log time), seconds since the run's origin.
    pub submitted_s: f64,
    /// When it was first bound, seconds since the origin; `None`: never.
    pub bound_s: Option<f64>,
}

/// Everything read back from the log.
#[derive(Clone, Debug, Default)]
pub struct LogFacts {
    /// Events per kind and tick (`TICK_S`) since the origin: rates over a
    /// window are counted to a tick, not to the whole seconds it touches.
    /// Counts per kind and per second are folded from it.
    pub per_tick: BTreeMap<String, BTreeMap<i64, u64>>,
    /// Every job.
    pub jobs: Vec<JobLatency>,
    /// Sum of `lost_gpu_ms` of `JobPreempted`.
    pub lost_gpu_ms: u64,
    /// `JobPreempted` events.
    pub preempted: u64,
    /// Jobs with a `JobFinished`.
    pub finished: u64,
    /// Last sequence.
    pub max_seq: u64,
    /// The fold of the whole log: goodput and reclaim latencies.
    pub fold: LogFold,
    /// On-disk size of the events table with its indexes and TOAST
    /// (`pg_total_relation_size`), bytes: what the log costs Postgres.
    pub log_bytes: i64,
}

/// What only a fold of the whole log tells: where every allocated
/// GPU-hour went and how long each reclaim took.
#[derive(Clone, Debug, Default)]
pub struct LogFold {
    /// Reclaims, eligible → started, ms: from the moment the job was
    /// eligible to reclaim to its start, by the events' own times
    /// (`gpusched_core::ReclaimClock`, the rule the simulator and the
    /// gateway's metrics use).
    pub reclaim_eligible_to_start_ms: Vec<f64>,
    /// The goodput accounting overall (`gpusched_core::goodput`), GPU-hours
    /// of wall time.
    pub goodput: GoodputSummary,
    /// The same per tenant.
    pub goodput_by_tenant: BTreeMap<String, GoodputSummary>,
    /// Events the fold refused as superseded (counted by neither).
    pub superseded: u64,
}

/// Folds the whole log with `State::apply`, as a replay does, feeding each
/// event and whether the state accepted it to the goodput accounting and
/// the reclaim clock. Reads the log a page at a time.
pub async fn fold_log(store: &EventStore) -> Result<LogFold> {
    let mut state = gpusched_core::State::new();
    let mut clock = gpusched_core::ReclaimClock::default();
    let mut goodput = gpusched_core::Goodput::default();
    let mut out = LogFold::default();
    let mut after = 0;
    loop {
        let page = store
            .read_from(after, 10_000)
            .await
            .context("reading the log for goodput and reclaim latencies")?;
        let Some(last) = page.last() else {
            break;
        };
        after = last.seq;
        for e in &page {
            let applied = state.apply(&e.event).is_ok();
            out.superseded += u64::from(!applied);
            goodput.observe(&e.event, applied);
            if let Some((_, ms)) = clock.observe(&e.event) {
                out.reclaim_eligible_to_start_ms.push(ms as f64);
            }
        }
    }
    out.goodput = goodput.overall().summary();
    out.goodput_by_tenant = goodput
        .totals()
        .into_iter()
        .map(|(t, acc)| (t, acc.summary()))
        .collect();
    Ok(out)
}

/// Reads the run's facts; times are seconds since `origin_unix_ms`.
pub async fn read_log(store: &EventStore, origin_unix_ms: u64) -> Result<LogFacts> {
    let pool = store.pool();
    let origin = origin_unix_ms as f64 / 1000.0;
    let mut facts = LogFacts::default();
    let rows = sqlx::query(
        "SELECT kind, floor((extract(epoch FROM recorded_at)::float8 - $1) / $2)::bigint AS tick,
                count(*) AS n
         FROM events GROUP BY 1, 2",
    )
    .bind(origin)
    .bind(TICK_S)
    .fetch_all(pool)
    .await
    .context("counting events per kind and tick")?;
    for r in rows {
        let kind: String = r.try_get("kind")?;
        let tick: i64 = r.try_get("tick")?;
        let n: i64 = r.try_get("n")?;
        facts.record(&kind, tick, u64::try_from(n).context("a negative count")?);
    }
    let rows = sqlx::query(
        "WITH s AS (SELECT aggregate_id, min(recorded_at) AS t, min(payload->'spec'->>'tenant') AS tenant
                    FROM events WHERE kind = 'job_submitted' GROUP BY 1),
              b AS (SELECT aggregate_id, min(recorded_at) AS t
                    FROM events WHERE kind = 'job_bound' GROUP BY 1)
         SELECT s.tenant,
                extract(epoch FROM s.t)::float8 - $1 AS submitted_s,
                extract(epoch FROM b.t)::float8 - $1 AS bound_s
         FROM s LEFT JOIN b USING (aggregate_id)",
    )
    .bind(origin)
    .fetch_all(pool)
    .await
    .context("reading submit and bind times")?;
    for r in rows {
        facts.jobs.push(JobLatency {
            tenant: r
                .try_get::<Option<String>, _>("tenant")?
                .unwrap_or_default(),
            submitted_s: r.try_get("submitted_s")?,
            bound_s: r.try_get("bound_s")?,
        });
    }
    let r = sqlx::query(
        "SELECT coalesce(sum((payload->>'lost_gpu_ms')::bigint), 0)::bigint AS lost, count(*) AS n
         FROM events WHERE kind = 'job_preempted'",
    )
    .fetch_one(pool)
    .await
    .context("summing lost work")?;
    facts.lost_gpu_ms = u64::try_from(r.try_get::<i64, _>("lost")?).unwrap_or(0);
    facts.preempted = u64::try_from(r.try_get::<i64, _>("n")?).unwrap_or(0);
    let n: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT aggregate_id) FROM events WHERE kind = 'job_finished'",
    )
    .fetch_one(pool)
    .await
    .context("counting finished jobs")?;
    facts.finished = u64::try_from(n).unwrap_or(0);
    facts.max_seq = store.max_seq().await.context("reading the last sequence")?;
    facts.log_bytes = sqlx::query_scalar("SELECT pg_total_relation_size('events')")
        .fetch_one(pool)
        .await
        .context("reading the log's size")?;
    Ok(facts)
}

impl LogFacts {
    /// Submit→bound latencies (ms) of the jobs `keep` selects.
    pub fn latencies(&self, keep: impl Fn(&JobLatency) -> bool) -> Vec<f64> {
        self.jobs
            .iter()
            .filter(|j| keep(j))
            .filter_map(|j| j.bound_s.map(|b| (b - j.submitted_s) * 1000.0))
            .collect()
    }

    /// Counts `n` events of `kind` recorded in `tick`.
    pub fn record(&mut self, kind: &str, tick: i64, n: u64) {
        *self
            .per_tick
            .entry(kind.to_owned())
            .or_default()
            .entry(tick)
            .or_default() += n;
    }

    /// Events of `kind` in the whole log.
    pub fn count(&self, kind: &str) -> u64 {
        self.per_tick.get(kind).map_or(0, |m| m.values().sum())
    }

    /// Events per kind in the whole log.
    pub fn kinds(&self) -> BTreeMap<String, u64> {
        self.per_tick
            .keys()
            .map(|k| (k.clone(), self.count(k)))
            .collect()
    }

    /// Count of `kind` per second.
    pub fn series(&self, kind: &str) -> BTreeMap<i64, u64> {
        self.per_tick
            .get(kind)
            .map_or_else(BTreeMap::new, per_second)
    }

    /// All events per second.
    pub fn events_series(&self) -> BTreeMap<i64, u64> {
        let mut out = BTreeMap::new();
        for m in self.per_tick.values() {
            for (s, n) in per_second(m) {
                *out.entry(s).or_default() += n;
            }
        }
        out
    }

    /// Events of `kinds` recorded from `from_s` to `to_s` (seconds since
    /// origin), to a tick: the ticks that hold the two ends count whole.
    pub fn count_between(&self, kinds: Option<&str>, from_s: f64, to_s: f64) -> u64 {
        let lo = (from_s / TICK_S).floor() as i64;
        let hi = (to_s / TICK_S).floor() as i64;
        let sum = |m: &BTreeMap<i64, u64>| m.range(lo..=hi).map(|(_, n)| *n).sum::<u64>();
        match kinds {
            Some(k) => self.per_tick.get(k).map_or(0, sum),
            None => self.per_tick.values().map(sum).sum(),
        }
    }

    /// p99 of submit→bound latency (ms) of the jobs bound in each second.
    pub fn p99_by_bound_second(&self) -> BTreeMap<i64, f64> {
        let mut by: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
        for j in &self.jobs {
            if let Some(b) = j.bound_s {
                by.entry(b.floor() as i64)
                    .or_default()
                    .push((b - j.submitted_s) * 1000.0);
            }
        }
        by.into_iter()
            .map(|(s, v)| (s, Percentiles::of(v).p99))
            .collect()
    }

    /// Jobs submitted but not yet bound at the end of each second.
    pub fn queue_depth(&self) -> BTreeMap<i64, i64> {
        let sub = self.series("job_submitted");
        let bound = self.series("job_bound");
        let (Some(first), Some(last)) = (
            sub.keys().next().copied(),
            sub.keys().chain(bound.keys()).max().copied(),
        ) else {
            return BTreeMap::new();
        };
        let mut depth = 0i64;
        let mut out = BTreeMap::new();
        for s in first..=last {
            depth += sub.get(&s).copied().unwrap_or(0) as i64;
            depth -= bound.get(&s).copied().unwrap_or(0) as i64;
            out.insert(s, depth);
        }
        out
    }
}

/// Per-tick counts folded into whole seconds since the origin.
fn per_second(ticks: &BTreeMap<i64, u64>) -> BTreeMap<i64, u64> {
    let mut out = BTreeMap::new();
    for (t, n) in ticks {
        *out.entry(t.div_euclid(TICKS_PER_S)).or_default() += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let v: Vec<f64> = (1..=1000).map(f64::from).collect();
        let p = Percentiles::of(v);
        assert_eq!((p.p50, p.p99, p.p999, p.max), (500.0, 990.0, 999.0, 1000.0));
        assert_eq!(Percentiles::of(vec![]).p99, 0.0);
    }

    #[test]
    fn queue_depth_follows_submissions_and_bindings() {
        let mut f = LogFacts::default();
        f.record("job_submitted", 0, 10);
        f.record("job_submitted", 150, 5);
        f.record("job_bound", 120, 8);
        f.record("job_bound", 290, 7);
        let d: Vec<i64> = f.queue_depth().into_values().collect();
        assert_eq!(d, vec![10, 7, 0]);
        // To a tick: 1.2 s to 1.5 s holds the bound 8 and the submitted 5,
        // not the 10 of second 0 nor the 7 of 2.9 s.
        assert_eq!(f.count_between(None, 1.2, 1.5), 13);
        assert_eq!(f.count_between(Some("job_bound"), 0.0, 2.89), 8);
        assert_eq!(f.count_between(None, 0.0, 2.9), 30);
        // Per kind and per second, folded from the ticks.
        assert_eq!(
            (f.count("job_submitted"), f.count("job_bound"), f.count("x")),
            (15, 15, 0)
        );
        assert_eq!(f.kinds().into_values().collect::<Vec<_>>(), [15, 15]);
        assert_eq!(
            f.series("job_bound").into_iter().collect::<Vec<_>>(),
            [(1, 8), (2, 7)]
        );
        assert_eq!(
            f.events_series().into_iter().collect::<Vec<_>>(),
            [(0, 10), (1, 13), (2, 7)]
        );
    }
}
