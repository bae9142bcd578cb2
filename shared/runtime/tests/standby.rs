//! A hot standby: while it waits for the lease it folds the log, so when
//! the leader goes it takes over folding only the last few events, and
//! decides on from where the leader stopped (nothing decided twice).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::stage::{decisions, submit, Instance};
use gpusched_runtime::{Bus, Log, MemLog};

async fn wait_until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_folds_while_it_waits_and_takes_over_from_there() {
    let log = Log::Memory(MemLog::new());
    let bus = Bus::memory();
    let a = Instance::start(&log, &bus, "a", |_| {});
    wait_until("a leads", async || {
        a.stats.leading_epoch.load(Ordering::Relaxed) > 0
    })
    .await;
    let b = Instance::start(&log, &bus, "b", |_| {});

    for round in 0..10 {
        submit(&log, 1 + round * 200, 200).await;
    }
    wait_until("a decided all", async || {
        decisions(&log).await.len() == 2000
    })
    .await;
    let end = log.max_seq().await.unwrap();
    assert!(end >= 4000, "submissions and decisions: {end}");
    // The standby has folded all of it while standing by.
    wait_until("b folded the log", async || {
        b.stats.seq.load(Ordering::Relaxed) == end
    })
    .await;
    assert_eq!(b.stats.leading_epoch.load(Ordering::Relaxed), 0);

    // The leader goes; more work arrives as the standby takes over.
    a.stop().await;
    submit(&log, 2001, 10).await;
    wait_until("b decided the new jobs", async || {
        decisions(&log).await.len() == 2010
    })
    .await;
    assert!(b.stats.leading_epoch.load(Ordering::Relaxed) > 0);
    let folded = b.stats.takeover_folded.load(Ordering::Relaxed);
    assert!(
        folded <= 20,
        "the takeover folded {folded} events of a log of {end}: the standby was not hot"
    );
    let d = decisions(&log).await;
    assert!(d.values().all(|&n| n == 1), "each job decided once");

    b.stop().await;
}
