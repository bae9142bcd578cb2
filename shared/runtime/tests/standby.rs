//! A hot standby: while it waits for the lease it folds the log, so when
//! the leader goes it takes over folding only the last few events, and
//! decides on from where the leader stopped (nothing decided twice).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::stage::{decisions, submit, Admission};
use gpusched_runtime::{run_service, Bus, Log, MemLog, ServiceConfig, ServiceStats};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

async fn wait_until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

struct Instance {
    stats: Arc<ServiceStats>,
    shutdown: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
}

fn start(log: &Log, bus: &Bus, holder: &str) -> Instance {
    let mut cfg = ServiceConfig::new("admission", holder);
    cfg.lease_ttl = Duration::from_millis(1000);
    let (stats, shutdown) = (Arc::new(ServiceStats::default()), CancellationToken::new());
    let task = tokio::spawn(run_service(
        log.clone(),
        bus.clone(),
        cfg,
        || Admission,
        shutdown.clone(),
        stats.clone(),
    ));
    Instance {
        stats,
        shutdown,
        task,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_folds_while_it_waits_and_takes_over_from_there() {
    let log = Log::Memory(MemLog::new());
    let bus = Bus::memory();
    let a = start(&log, &bus, "a");
    wait_until("a leads", async || {
        a.stats.leading_epoch.load(Ordering::Relaxed) > 0
    })
    .await;
    let b = start(&log, &bus, "b");

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
    a.shutdown.cancel();
    a.task.await.unwrap().unwrap();
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

    b.shutdown.cancel();
    b.task.await.unwrap().unwrap();
}
