//! A deciding service with no bus: NATS unreachable from the start, it
//! still takes its lease, keeps it, decides every submission from the log
//! alone (once each), and gives the lease back when it shuts down.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::stage::{submit, wait_decided, Admission};
use gpusched_runtime::{
    run_service, Bus, Leader, LeaseSpec, Log, MemLog, ServiceConfig, ServiceStats,
};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decides_from_the_log_while_the_bus_is_unreachable() {
    let log = Log::Memory(MemLog::new());
    let url = format!(
        "nats://127.0.0.1:{}",
        gpusched_testkit::free_port().unwrap()
    );
    let ns = gpusched_bus::Namespace::new("degraded").unwrap();
    let bus = Bus::connect_nats(&url, ns)
        .await
        .expect("connecting needs no server");
    let mut cfg = ServiceConfig::new("admission", "a-1");
    cfg.lease_ttl = Duration::from_millis(600);
    let shutdown = CancellationToken::new();
    let stats = Arc::new(ServiceStats::default());
    let service = tokio::spawn(run_service(
        log.clone(),
        bus,
        cfg,
        || Admission,
        shutdown.clone(),
        stats.clone(),
    ));

    submit(&log, 1, 50).await;
    let d = wait_decided(&log, 50).await;
    assert_eq!(d.len(), 50, "every job decided from the log");
    assert!(d.values().all(|&n| n == 1), "each once: {d:?}");
    assert_eq!(
        stats.bus_down.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "the service knows it decides without the bus"
    );

    // Past several lease lifetimes, still leading and deciding.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    submit(&log, 51, 10).await;
    let d = wait_decided(&log, 60).await;
    assert_eq!(d.len(), 60);
    assert!(d.values().all(|&n| n == 1), "each once after more: {d:?}");

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), service)
        .await
        .expect("shuts down promptly with no bus")
        .unwrap()
        .unwrap();
    // The lease was given back on the way out.
    let next = LeaseSpec {
        service: "admission".into(),
        partition: "default".into(),
        holder: "a-2".into(),
        ttl: Duration::from_secs(5),
    };
    assert!(Leader::try_take(&log, &next).await.unwrap().is_some());
}
