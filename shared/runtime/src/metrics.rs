//! Prometheus metrics of a service's loop, read from its [`ServiceStats`]
//! at each scrape, in the Prometheus text format (0.0.4), named
//! `gpusched_…` with their units in their names.
//!
//! Owns: which counter or gauge each stat becomes, the cycle histogram's
//! buckets as Prometheus sees them (one per doubling from 128 µs to
//! 8.4 s, then `+Inf`), and the `/metrics` answer ([`metrics_text`]). What the state
//! holds (pending jobs, quotas) is the gateway's to export, from its view:
//! every service folds the same state, and one exporter of it keeps
//! Prometheus from summing it six times.
//!
//! Must never: take a lock the loop takes, or write anything: a scrape
//! only loads relaxed atomics.

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeMetric, NoLabelSet,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::clock::wall_clock;
use crate::stats::{cycle_bucket_upper_us, ServiceStats, CYCLE_BUCKETS};

/// The `Content-Type` of a `/metrics` answer.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Every fourth histogram bucket ends on a power of two of microseconds;
/// Prometheus gets those from 2^7 µs (128 µs) to 2^23 µs (8.4 s), then
/// `+Inf`.
const FIRST_EXPORTED_DOUBLING: usize = 7;

/// Writes `registry` in the Prometheus text format.
pub fn metrics_text(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, registry);
    out
}

/// `GET /metrics` over `registry`, in the Prometheus text format.
pub fn metrics_route<S: Clone + Send + Sync + 'static>(
    registry: Arc<Registry>,
) -> axum::routing::MethodRouter<S> {
    axum::routing::get(move || {
        let registry = registry.clone();
        async move {
            (
                [(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)],
                metrics_text(&registry),
            )
        }
    })
}

/// A registry of `service`'s loop metrics: every series is labelled
/// `service`.
pub fn service_registry(service: &str, stats: Arc<ServiceStats>) -> Registry {
    let mut r = Registry::with_prefix_and_labels(
        "gpusched",
        [(Cow::Borrowed("service"), Cow::Owned(service.to_string()))].into_iter(),
    );
    r.register_collector(Box::new(LoopCollector { stats }));
    r
}

/// Writes one unlabelled gauge.
pub fn gauge<N: EncodeGaugeValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: N,
) -> fmt::Result {
    single(enc, name, help, unit, ConstGauge::new(v))
}

/// Writes one unlabelled counter (`_total` is added to `name`).
pub fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> fmt::Result {
    single(enc, name, help, None, ConstCounter::new(v))
}

fn single(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    metric: impl EncodeMetric,
) -> fmt::Result {
    let m = enc.encode_descriptor(name, help, unit, metric.metric_type())?;
    metric.encode(m)
}

/// What the metrics of a [`family`] are.
#[derive(Clone, Copy, Debug)]
pub enum Values {
    /// Gauges.
    Gauges,
    /// Counters (`_total` is added to the family's name, after its unit).
    Counters,
}

/// Writes a family of gauges or of counters, one per label set.
pub fn family<'a, N: EncodeGaugeValue + EncodeCounterValue + 'a>(
    enc: &mut DescriptorEncoder,
    values: Values,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    rows: impl IntoIterator<Item = (Vec<(&'a str, String)>, N)>,
) -> fmt::Result {
    let kind = match values {
        Values::Gauges => MetricType::Gauge,
        Values::Counters => MetricType::Counter,
    };
    let mut m = enc.encode_descriptor(name, help, unit, kind)?;
    for (labels, v) in rows {
        let fm = m.encode_family(&labels)?;
        match values {
            Values::Gauges => ConstGauge::new(v).encode(fm)?,
            Values::Counters => ConstCounter::new(v).encode(fm)?,
        }
    }
    Ok(())
}

/// Writes one unlabelled histogram in seconds: `buckets` are (upper bound,
/// count in that bucket alone), `count` every observation (`+Inf`).
pub fn histogram_seconds(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    sum_s: f64,
    count: u64,
    buckets: &[(f64, u64)],
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
    m.encode_histogram::<NoLabelSet>(sum_s, count, buckets, None)
}

#[derive(Debug)]
struct LoopCollector {
    stats: Arc<ServiceStats>,
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

fn seconds(us: u64) -> f64 {
    us as f64 / 1e6
}

/// The loop's counters: name, help, and the stat it reads.
fn counters(s: &ServiceStats) -> [(&'static str, &'static str, &AtomicU64); 11] {
    [
        ("cycles", "Times the decider ran.", &s.cycles),
        ("events_appended", "Events this instance appended to the log.", &s.appended),
        ("appends", "Appends (batches) this instance made; events_appended / appends is the mean batch size.", &s.batches),
        ("events_folded", "Events folded into this instance's state.", &s.folded),
        ("events_superseded", "Events the state refused as superseded by an earlier one.", &s.superseded),
        ("bus_malformed_messages", "Bus messages that could not be read, skipped.", &s.malformed),
        ("bus_errors", "Reads from the bus that failed (the log was read instead).", &s.bus_errors),
        ("log_reads", "Reads of the log to close a gap or follow its tail.", &s.gap_reads),
        ("relayed_batches", "Batches the outbox relay published again.", &s.relayed),
        ("takeovers", "Times this instance took its lease.", &s.takeovers),
        ("snapshots_written", "Snapshots this instance wrote.", &s.snapshots_written),
    ]
}

/// What the decider looked at, in `ServiceStats::work`'s order: name and
/// help. Each is a counter (per cycle: its rate over `cycles_total`'s) and
/// a gauge of the most in one cycle (`cycle_<name>_max`).
const WORK: [(&str, &str); 4] = [
    ("heads_examined", "Queue heads examined by the decider."),
    (
        "domains_probed",
        "Topology domains probed for room by the decider.",
    ),
    ("victim_sets_costed", "Victim sets costed by the decider."),
    (
        "victim_candidates",
        "Victim candidates looked at by the decider.",
    ),
];

/// The loop's gauges read straight from a stat: name, help, the stat.
fn gauges(s: &ServiceStats) -> [(&'static str, &'static str, &AtomicU64); 5] {
    [
        (
            "bus_backlog_messages",
            "Messages still waiting on the bus for this service after its last receive (its consumer's pending count): how far its bus feed trails the log.",
            &s.bus_backlog,
        ),
        (
            "folded_sequence",
            "Sequence of the last event folded.",
            &s.seq,
        ),
        (
            "lease_epoch",
            "The lease epoch this instance leads at (0: standing by).",
            &s.leading_epoch,
        ),
        (
            "bus_down",
            "1 while the bus fails and the loop follows the log alone.",
            &s.bus_down,
        ),
        (
            "log_down",
            "1 while the event log is unreachable.",
            &s.log_down,
        ),
    ]
}

impl Collector for LoopCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let s = &self.stats;
        let e = &mut enc;
        for (name, help, stat) in counters(s) {
            single(e, name, help, None, ConstCounter::new(load(stat)))?;
        }
        let steps = [
            ("receive", &s.receive_us),
            ("fold", &s.fold_us),
            ("decide", &s.decide_us),
            ("append", &s.append_us),
        ];
        let mut m = e.encode_descriptor(
            "loop_step",
            "Where the loop's time went: waiting on the bus, folding, deciding, appending.",
            Some(&Unit::Seconds),
            MetricType::Counter,
        )?;
        for (step, us) in steps {
            let labels = [("step", step)];
            let fm = m.encode_family(&labels)?;
            ConstCounter::new(seconds(load(us))).encode(fm)?;
        }
        for (name, help, stat) in gauges(s) {
            gauge(e, name, help, None, load(stat))?;
        }
        let work = WORK.iter().zip(&s.work).zip(&s.work_max);
        for ((&(name, help), sum), max) in work {
            counter(e, name, help, load(sum))?;
            gauge(
                e,
                &format!("cycle_{name}_max"),
                &format!("The most in one cycle since this instance started: {help}"),
                None,
                load(max),
            )?;
        }
        let leads = load(&s.leading_epoch) > 0;
        gauge(
            e,
            "leader",
            "1 while this instance holds its lease and decides.",
            None,
            u64::from(leads),
        )?;
        let beat = load(&s.loop_unix_ms);
        let age_ms = if beat == 0 {
            0
        } else {
            wall_clock().0.saturating_sub(beat)
        };
        gauge(
            e,
            "loop_age",
            "Time since the loop last went round.",
            Some(&Unit::Seconds),
            age_ms as f64 / 1e3,
        )?;
        cycle_histogram(e, &s.cycle_hist.counts(), seconds(load(&s.cycle_us)))
    }
}

/// The cycle histogram with one bucket per doubling (see the module docs).
fn cycle_histogram(enc: &mut DescriptorEncoder, counts: &[u64], sum_s: f64) -> fmt::Result {
    let (buckets, total) = doubling_buckets(counts);
    let mut m = enc.encode_descriptor(
        "cycle_duration",
        "Cycles that appended: decide, append and fold, per cycle.",
        Some(&Unit::Seconds),
        MetricType::Histogram,
    )?;
    m.encode_histogram::<NoLabelSet>(sum_s, total, &buckets, None)
}

/// Per-bucket counts (not cumulative) ending on each exported power of
/// two, in seconds, and the total count (the `+Inf` bucket).
fn doubling_buckets(counts: &[u64]) -> (Vec<(f64, u64)>, u64) {
    let mut buckets = Vec::new();
    let mut pending = 0u64;
    for (i, c) in counts.iter().enumerate().take(CYCLE_BUCKETS) {
        pending += c;
        let ends_a_doubling = (i + 1) % 4 == 0 && (i + 1) / 4 >= FIRST_EXPORTED_DOUBLING;
        // The last bucket also takes every longer cycle: it goes to +Inf.
        if ends_a_doubling && i + 1 < CYCLE_BUCKETS {
            buckets.push((cycle_bucket_upper_us(i) / 1e6, pending));
            pending = 0;
        }
    }
    (buckets, counts.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::cycle_bucket;

    #[test]
    fn the_loop_metrics_read_the_stats_with_units_in_their_names() {
        let stats = Arc::new(ServiceStats::default());
        stats.cycles.store(3, Ordering::Relaxed);
        stats.appended.store(2_000, Ordering::Relaxed);
        stats.batches.store(2, Ordering::Relaxed);
        stats.append_us.store(1_500_000, Ordering::Relaxed);
        stats.leading_epoch.store(4, Ordering::Relaxed);
        stats.cycle_hist.record(1_000); // 1 ms
        stats.cycle_hist.record(3_000_000); // 3 s
        stats.cycle_us.store(3_001_000, Ordering::Relaxed);
        let text = metrics_text(&service_registry("quota", stats));
        for line in [
            "gpusched_cycles_total{service=\"quota\"} 3",
            "gpusched_events_appended_total{service=\"quota\"} 2000",
            "gpusched_appends_total{service=\"quota\"} 2",
            "gpusched_lease_epoch{service=\"quota\"} 4",
            "gpusched_leader{service=\"quota\"} 1",
            "gpusched_loop_step_seconds_total{service=\"quota\",step=\"append\"} 1.5",
            "gpusched_cycle_duration_seconds_count{service=\"quota\"} 2",
            "gpusched_cycle_duration_seconds_sum{service=\"quota\"} 3.001",
            "gpusched_cycle_duration_seconds_bucket{service=\"quota\",le=\"+Inf\"} 2",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        // 1 ms falls at or below 1.024 ms, 3 s above 2.097 s and at or below 4.194 s.
        let bucket = |le: &str| {
            let key =
                format!("gpusched_cycle_duration_seconds_bucket{{service=\"quota\",le=\"{le}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&key))
                .unwrap_or_else(|| panic!("no bucket {le} in\n{text}"))
                .parse::<u64>()
                .expect("a count")
        };
        assert_eq!(bucket("0.000512"), 0);
        assert_eq!(bucket("0.001024"), 1);
        assert_eq!(bucket("2.097152"), 1);
        assert_eq!(bucket("4.194304"), 2);
    }

    #[test]
    fn exported_buckets_are_the_doublings_and_lose_no_cycle() {
        let mut counts = vec![0u64; CYCLE_BUCKETS];
        for us in [1, 100, 128, 129, 10_000, 20_000_000, u64::MAX / 2] {
            counts[cycle_bucket(us)] += 1;
        }
        let (buckets, total) = doubling_buckets(&counts);
        assert_eq!(total, 7);
        assert_eq!(buckets.len(), 23 - FIRST_EXPORTED_DOUBLING + 1);
        assert!((buckets[0].0 - 128e-6).abs() < 1e-12, "{buckets:?}");
        // 1 and 100 µs are below 128 µs (128 itself counts above, in the
        // next doubling); the two past 8.4 s are in +Inf only.
        assert_eq!(buckets[0].1, 2);
        assert_eq!(buckets[1].1, 2);
        assert_eq!(buckets.iter().map(|b| b.1).sum::<u64>(), 5);
    }
}
