//! The NATS bus under nats-server faults, against private servers (own
//! port, own store dir) that the tests SIGKILL and restart: a feed never
//! hangs, re-binds by itself (store kept or wiped), the bus starts without
//! a server, publishes and `last_published` fail within their bounds.
//!
//! Timing checks are the bound the bus promises (`timeout` + 250 ms per
//! `Feed::next`), counted over every call; everything else counts batches.
//! Tests run one at a time (they time calls on a small machine).
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Timings;
use gpusched_bus::testing::NatsServer;
use gpusched_bus::{BatchV1, BusError, Namespace, DEFAULT_PUBLISH_TIMEOUT};
use gpusched_events::Event;
use gpusched_model::JobId;
use gpusched_runtime::{Bus, Feed, Incoming};

/// What a `Feed::next` may take beyond its timeout.
const SLACK: Duration = Duration::from_millis(250);

/// One test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn namespace() -> Namespace {
    Namespace::new("faults").unwrap()
}

/// A one-event batch of producer `faults` at log sequence `seq`.
fn batch(seq: u64) -> Arc<BatchV1> {
    Arc::new(BatchV1 {
        producer: "faults".to_string(),
        epoch: 1,
        first_seq: seq,
        last_seq: seq,
        correlation_id: None,
        events: vec![Event::JobAccepted { job: JobId(seq) }],
    })
}

/// Publishes `seq` until the bus takes it (each try is bounded by the
/// publisher), failing the test after `within`.
async fn publish_until_ok(bus: &Bus, seq: u64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        match bus.publish(batch(seq)).await {
            Ok(()) => return,
            Err(e) => assert!(Instant::now() < deadline, "publish {seq}: still {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Publishes batches 1, 2, … every 1–20 ms until `stop` is set; yields
/// the sequences the bus took.
fn spawn_publisher(bus: &Bus, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<u64>> {
    let bus = bus.clone();
    tokio::spawn(async move {
        let mut published = Vec::new();
        let mut seq = 0u64;
        while !stop.load(Ordering::Relaxed) {
            seq += 1;
            if bus.publish(batch(seq)).await.is_ok() {
                published.push(seq);
            }
            tokio::time::sleep(Duration::from_millis(1 + seq % 20)).await;
        }
        published
    })
}

/// One timed `Feed::next`; counts the batches it got by first sequence.
async fn timed_next(
    feed: &mut Feed,
    timeout: Duration,
    timings: &mut Timings,
    got: &mut BTreeMap<u64, u32>,
) -> Result<usize, BusError> {
    let t = Instant::now();
    let r = feed.next(64, timeout).await;
    timings.record(timeout, t.elapsed(), SLACK);
    let items = r?;
    let n = items.len();
    for item in items {
        match item {
            Incoming::Batch(b, _) => *got.entry(b.first_seq).or_default() += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    Ok(n)
}

/// Reads until every sequence in `want` arrived or `within` passed.
async fn read_until(
    feed: &mut Feed,
    want: &[u64],
    within: Duration,
    timings: &mut Timings,
    got: &mut BTreeMap<u64, u32>,
) {
    let deadline = Instant::now() + within;
    let waits = [5u64, 50, 200];
    let mut i = 0;
    while Instant::now() < deadline && !want.iter().all(|s| got.contains_key(s)) {
        let wait = Duration::from_millis(waits[i % waits.len()]);
        i += 1;
        let _ = timed_next(feed, wait, timings, got).await;
    }
}

fn assert_bounded(what: &str, timings: &Timings) {
    eprintln!(
        "{what}: {} calls, max {} ms beyond the timeout",
        timings.calls,
        timings.max_excess.as_millis()
    );
    assert!(
        timings.overruns.is_empty(),
        "{what}: calls over timeout + {SLACK:?}: {:?}",
        timings.overruns
    );
}

/// Each of `seqs` arrived exactly once.
fn assert_exactly_once(what: &str, seqs: &[u64], got: &BTreeMap<u64, u32>) {
    let wrong: Vec<(u64, u32)> = seqs
        .iter()
        .map(|s| (*s, got.get(s).copied().unwrap_or(0)))
        .filter(|(_, n)| *n != 1)
        .collect();
    assert!(wrong.is_empty(), "{what}: (seq, times received) {wrong:?}");
}

/// A durable feed through a SIGKILL and restart: every `next` returns in
/// time throughout, and every batch published after the restart arrives
/// exactly once. Batches in flight at the kill may be lost (the log has
/// them); they are not counted.
async fn feed_survives_restart(wipe: bool) {
    let _serial = SERIAL.lock().await;
    let mut server = NatsServer::started();
    let bus = Bus::connect_nats(&server.url(), namespace()).await.unwrap();
    let mut feed = bus.feed("faults").await.unwrap();
    let (mut timings, mut got) = (Timings::default(), BTreeMap::new());

    let before: Vec<u64> = (1..=10).collect();
    for &s in &before {
        publish_until_ok(&bus, s, Duration::from_secs(10)).await;
    }
    read_until(
        &mut feed,
        &before,
        Duration::from_secs(10),
        &mut timings,
        &mut got,
    )
    .await;
    assert_exactly_once("before the kill", &before, &got);

    server.kill();
    let mut errors = 0;
    let outage = Instant::now();
    let mut i = 0u64;
    while outage.elapsed() < Duration::from_secs(3) {
        let wait = Duration::from_millis([1, 20, 100, 300][(i % 4) as usize]);
        i += 1;
        if timed_next(&mut feed, wait, &mut timings, &mut got)
            .await
            .is_err()
        {
            errors += 1;
        }
    }
    assert!(errors > 0, "the feed never reported the dead server");

    server.restart(wipe);
    let restarted = Instant::now();
    while timed_next(&mut feed, Duration::from_millis(50), &mut timings, &mut got)
        .await
        .is_err()
    {
        assert!(
            restarted.elapsed() < Duration::from_secs(10),
            "never re-bound"
        );
    }
    eprintln!(
        "re-bound {} ms after the restart",
        restarted.elapsed().as_millis()
    );
    let after: Vec<u64> = (11..=40).collect();
    for &s in &after {
        publish_until_ok(&bus, s, Duration::from_secs(15)).await;
        // Keep reading meanwhile, as a service does.
        let _ = timed_next(&mut feed, Duration::from_millis(5), &mut timings, &mut got).await;
    }
    read_until(
        &mut feed,
        &after,
        Duration::from_secs(20),
        &mut timings,
        &mut got,
    )
    .await;
    assert_exactly_once("after the restart", &after, &got);
    assert_bounded(if wipe { "store wiped" } else { "store kept" }, &timings);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feed_rebinds_after_sigkill_with_store_kept() {
    feed_survives_restart(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feed_rebinds_after_sigkill_with_store_wiped() {
    feed_survives_restart(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bus_starts_without_server_and_uses_it_once_up() {
    let _serial = SERIAL.lock().await;
    let mut server = NatsServer::new();
    let bus = Bus::connect_nats(&server.url(), namespace()).await.unwrap();
    let mut feed = bus.feed("late").await.unwrap();
    let mut ephemeral = bus.feed_ephemeral().await.unwrap();
    let (mut timings, mut got) = (Timings::default(), BTreeMap::new());
    let r = timed_next(
        &mut feed,
        Duration::from_millis(100),
        &mut timings,
        &mut got,
    )
    .await;
    assert!(r.is_err(), "no server, yet the feed said {r:?}");
    assert!(bus.publish(batch(1)).await.is_err());

    server.start();
    // The ephemeral feed takes what is published once it is bound.
    let deadline = Instant::now() + Duration::from_secs(10);
    while ephemeral.next(64, Duration::from_millis(50)).await.is_err() {
        assert!(Instant::now() < deadline, "ephemeral feed never bound");
    }
    let seqs: Vec<u64> = (1..=20).collect();
    for &s in &seqs {
        publish_until_ok(&bus, s, Duration::from_secs(10)).await;
    }
    read_until(
        &mut feed,
        &seqs,
        Duration::from_secs(10),
        &mut timings,
        &mut got,
    )
    .await;
    assert_exactly_once("durable feed", &seqs, &got);
    let mut eph_got = BTreeMap::new();
    read_until(
        &mut ephemeral,
        &seqs,
        Duration::from_secs(10),
        &mut timings,
        &mut eph_got,
    )
    .await;
    assert_exactly_once("ephemeral feed", &seqs, &eph_got);
    assert_bounded("started without server", &timings);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_fails_within_bound_while_down_and_recovers() {
    let _serial = SERIAL.lock().await;
    let mut server = NatsServer::started();
    let bus = Bus::connect_nats(&server.url(), namespace()).await.unwrap();
    bus.publish(batch(1)).await.unwrap();

    for (round, wipe) in [(1u64, false), (2, true)] {
        server.kill();
        let t = Instant::now();
        let r = bus.publish(batch(round * 10)).await;
        let took = t.elapsed();
        assert!(r.is_err(), "published to a dead server: {r:?}");
        assert!(
            took <= DEFAULT_PUBLISH_TIMEOUT + Duration::from_secs(1),
            "publish took {took:?}"
        );
        eprintln!("round {round}: publish failed in {took:?}: {r:?}");
        server.restart(wipe);
        publish_until_ok(&bus, round * 10 + 1, Duration::from_secs(15)).await;
    }
    // The wiped server got its stream back, holding the last publish only.
    let Bus::Nats(n) = &bus else { unreachable!() };
    let mut stream = n.js.get_stream(namespace().evt_stream()).await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 1);
    assert_eq!(bus.last_published("faults").await.unwrap(), 21);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_published_is_zero_only_when_nothing_was() {
    let _serial = SERIAL.lock().await;
    let mut server = NatsServer::started();
    let bus = Bus::connect_nats(&server.url(), namespace()).await.unwrap();
    assert_eq!(bus.last_published("faults").await.unwrap(), 0);
    bus.publish(batch(7)).await.unwrap();
    assert_eq!(bus.last_published("faults").await.unwrap(), 7);
    assert_eq!(bus.last_published("other").await.unwrap(), 0);

    server.kill();
    let t = Instant::now();
    let r = bus.last_published("faults").await;
    assert!(r.is_err(), "server down, yet {r:?}");
    assert!(
        t.elapsed() <= Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );

    // A server that lost its store has no stream: nothing was published.
    server.restart(true);
    let deadline = Instant::now() + Duration::from_secs(10);
    let last = loop {
        match bus.last_published("faults").await {
            Ok(n) => break n,
            Err(e) => assert!(Instant::now() < deadline, "still {e}"),
        }
    };
    assert_eq!(last, 0);
}

/// An idle feed stays bound: the server's idle heartbeats keep it from
/// being taken for dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_feed_stays_bound() {
    let _serial = SERIAL.lock().await;
    let server = NatsServer::started();
    let bus = Bus::connect_nats(&server.url(), namespace()).await.unwrap();
    let mut feed = bus.feed("idle").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while feed.next(64, Duration::from_millis(50)).await.is_err() {
        assert!(Instant::now() < deadline, "feed never bound");
    }
    let (mut errors, idle) = (0, Instant::now());
    while idle.elapsed() < gpusched_bus::PULL_EXPIRES * 2 {
        match feed.next(64, Duration::from_millis(300)).await {
            Ok(items) => assert!(items.is_empty()),
            Err(_) => errors += 1,
        }
    }
    assert_eq!(errors, 0, "an idle feed lost its binding");
    bus.publish(batch(1)).await.unwrap();
    let (mut timings, mut got) = (Timings::default(), BTreeMap::new());
    read_until(
        &mut feed,
        &[1],
        Duration::from_secs(5),
        &mut timings,
        &mut got,
    )
    .await;
    assert_exactly_once("after idling", &[1], &got);
}

/// Many short waits against a live server with a publisher running: none
/// takes longer than its timeout + 250 ms, and every batch arrives once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_waits_stay_within_their_timeout() {
    let _serial = SERIAL.lock().await;
    let server = NatsServer::started();
    let bus = Bus::connect_nats(&server.url(), namespace()).await.unwrap();
    let mut feed = bus.feed("short").await.unwrap();
    let (mut timings, mut got) = (Timings::default(), BTreeMap::new());
    let deadline = Instant::now() + Duration::from_secs(10);
    while feed.next(64, Duration::from_millis(50)).await.is_err() {
        assert!(Instant::now() < deadline, "feed never bound");
    }

    let stop = Arc::new(AtomicBool::new(false));
    let publisher = spawn_publisher(&bus, stop.clone());
    for i in 0..2_000u64 {
        let wait = Duration::from_millis(1 + i % 50);
        timed_next(&mut feed, wait, &mut timings, &mut got)
            .await
            .unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let published = publisher.await.unwrap();
    assert!(published.len() > 500, "the live server refused publishes");
    read_until(
        &mut feed,
        &published,
        Duration::from_secs(10),
        &mut timings,
        &mut got,
    )
    .await;
    assert_exactly_once("short waits", &published, &got);
    assert_bounded("short waits", &timings);
}

/// A way of reading the events stream, for [`short_wait_modes_compared`].
enum Reader {
    /// `Feed` over a long-lived pull stream (what the bus uses).
    Feed(Feed),
    /// `gpusched_bus::Subscriber`: one pull request per call, bounded.
    PerCall(gpusched_bus::Subscriber),
    /// The code before this change: one pull request per call, unbounded.
    Unbounded(gpusched_bus::async_nats::jetstream::consumer::PullConsumer),
}

impl Reader {
    /// A reader of `ns`'s events as durable consumer `name`, bound.
    async fn new(mode: &str, bus: &Bus, ns: &Namespace, name: &str) -> Reader {
        use gpusched_bus::async_nats::jetstream::consumer::{pull, AckPolicy};
        let Bus::Nats(n) = bus else { unreachable!() };
        let (stream, filter) = (ns.evt_stream(), ns.evt_wildcard());
        let mut reader = match mode {
            "feed" => Reader::Feed(bus.feed(name).await.unwrap()),
            "per-call" => Reader::PerCall(
                gpusched_bus::Subscriber::durable(&n.js, &stream, name, &filter)
                    .await
                    .unwrap(),
            ),
            _ => {
                let config = pull::Config {
                    durable_name: Some(name.to_string()),
                    filter_subject: filter,
                    ack_policy: AckPolicy::Explicit,
                    ..Default::default()
                };
                let s = n.js.get_stream(&stream).await.unwrap();
                Reader::Unbounded(s.get_or_create_consumer(name, config).await.unwrap())
            }
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while reader.next(Duration::from_millis(50)).await.is_err() {
            assert!(Instant::now() < deadline, "{mode} reader never bound");
        }
        reader
    }

    /// First sequences of the batches one call took.
    async fn next(&mut self, timeout: Duration) -> Result<Vec<u64>, String> {
        match self {
            Reader::Feed(feed) => {
                let items = feed.next(64, timeout).await.map_err(|e| e.to_string())?;
                Ok(items.iter().map(first_seq).collect())
            }
            Reader::PerCall(sub) => {
                let ds = sub
                    .next_batch(64, timeout)
                    .await
                    .map_err(|e| e.to_string())?;
                let mut out = Vec::new();
                for d in ds {
                    d.ack_nowait().await.map_err(|e| e.to_string())?;
                    out.extend(
                        d.envelope
                            .iter()
                            .map(|gpusched_bus::Envelope::V1(b)| b.first_seq),
                    );
                }
                Ok(out)
            }
            Reader::Unbounded(consumer) => unbounded_next(consumer, timeout).await,
        }
    }
}

fn first_seq(item: &Incoming) -> u64 {
    match item {
        Incoming::Batch(b, _) => b.first_seq,
        _ => 0,
    }
}

/// The pull logic this change replaced, kept here to measure against.
async fn unbounded_next(
    consumer: &gpusched_bus::async_nats::jetstream::consumer::PullConsumer,
    timeout: Duration,
) -> Result<Vec<u64>, String> {
    use futures::StreamExt;
    async fn take(
        mut batch: gpusched_bus::async_nats::jetstream::consumer::pull::Batch,
    ) -> Vec<u64> {
        let mut out = Vec::new();
        while let Some(Ok(m)) = batch.next().await {
            let _ = m.ack().await;
            if let Ok(gpusched_bus::Envelope::V1(b)) = gpusched_bus::decode(&m.payload) {
                out.push(b.first_seq);
            }
        }
        out
    }
    let e = |e: gpusched_bus::async_nats::jetstream::consumer::pull::BatchError| e.to_string();
    let mut out = take(
        consumer
            .fetch()
            .max_messages(64)
            .messages()
            .await
            .map_err(e)?,
    )
    .await;
    if out.is_empty() && timeout < Duration::from_millis(20) {
        tokio::time::sleep(timeout).await;
    } else if out.is_empty() {
        let one = consumer.batch().max_messages(1).expires(timeout);
        out = take(one.messages().await.map_err(e)?).await;
        if !out.is_empty() {
            out.extend(
                take(
                    consumer
                        .fetch()
                        .max_messages(63)
                        .messages()
                        .await
                        .map_err(e)?,
                )
                .await,
            );
        }
    }
    Ok(out)
}

/// Bench, not a check (run with `--ignored --nocapture`): short waits
/// (1–50 ms) with a publisher running, by six readers at once (separate
/// durable consumers), read three ways; prints the calls over timeout +
/// 90 ms (the server left a pull request unanswered) and over timeout +
/// 250 ms, the worst excess, errors and what did not arrive.
/// `BUS_BENCH_CALLS` sets the calls per reader (default 1,500).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn short_wait_modes_compared() {
    let _serial = SERIAL.lock().await;
    let server = NatsServer::started();
    let calls: u64 = std::env::var("BUS_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_500);
    for mode in ["feed", "per-call", "unbounded"] {
        let ns = Namespace::new(&format!("cmp_{}", mode.replace('-', "_"))).unwrap();
        let bus = Bus::connect_nats(&server.url(), ns.clone()).await.unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let publisher = spawn_publisher(&bus, stop.clone());
        let mut readers = Vec::new();
        for k in 0..6u64 {
            let mut reader = Reader::new(mode, &bus, &ns, &format!("r{k}")).await;
            readers.push(tokio::spawn(async move {
                let mut outcome = BenchOutcome::default();
                for i in 0..calls {
                    let wait = Duration::from_millis(1 + (i * 7 + k) % 50);
                    let t = Instant::now();
                    let r = reader.next(wait).await;
                    outcome.record(wait, t.elapsed(), r);
                }
                outcome
            }));
        }
        let mut all = BenchOutcome::default();
        for r in readers {
            all.merge(r.await.unwrap());
        }
        stop.store(true, Ordering::Relaxed);
        let published = publisher.await.unwrap();
        eprintln!(
            "{mode:>9}: {} calls, {} over timeout + 90 ms, {} over timeout + 250 ms, \
             worst +{} ms, {} errors; {} batches published, {} received (6 readers)",
            all.timings.calls,
            all.late,
            all.timings.overruns.len(),
            all.timings.max_excess.as_millis(),
            all.errors,
            published.len(),
            all.received,
        );
    }
}

/// What the readers of one bench mode saw.
#[derive(Default)]
struct BenchOutcome {
    timings: Timings,
    late: usize,
    errors: usize,
    received: usize,
}

impl BenchOutcome {
    fn record(&mut self, wait: Duration, took: Duration, r: Result<Vec<u64>, String>) {
        self.timings.record(wait, took, SLACK);
        self.late += usize::from(took > wait + Duration::from_millis(90));
        match r {
            Ok(seqs) => self.received += seqs.len(),
            Err(_) => self.errors += 1,
        }
    }

    fn merge(&mut self, other: BenchOutcome) {
        self.timings.calls += other.timings.calls;
        self.timings.overruns.extend(other.timings.overruns);
        self.timings.max_excess = self.timings.max_excess.max(other.timings.max_excess);
        self.late += other.late;
        self.errors += other.errors;
        self.received += other.received;
    }
}
