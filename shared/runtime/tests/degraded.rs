//! A deciding service with no bus: NATS unreachable from the start, it
//! still takes its lease, keeps it, decides every submission from the log
//! alone (once each), and gives the lease back when it shuts down.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpusched_core::{admission, State};
use gpusched_events::{Event, Producer};
use gpusched_model::{JobId, JobSpec, Timestamp};
use gpusched_runtime::{
    run_service, Bus, Decider, Leader, LeaseSpec, Log, MemLog, ServiceConfig, ServiceStats,
};
use gpusched_store::NewEvent;
use tokio_util::sync::CancellationToken;

/// The admission stage, as the admission service runs it.
struct Admission;

impl Decider for Admission {
    fn producer(&self) -> Producer {
        Producer::Admission
    }
    fn decide(&mut self, state: &State, now: Timestamp) -> Vec<Event> {
        admission::decide(state, 1000, now)
    }
}

fn spec() -> JobSpec {
    JobSpec {
        tenant: "nobody".into(),
        priority: 0,
        workers: 1,
        gpus_per_worker: 1,
        flavors: vec![],
        topology: "node".into(),
        preemptible: true,
        checkpoint: None,
        max_runtime_s: None,
        command: Vec::new(),
        env: Default::default(),
        working_dir: None,
        checkpoint_signal: None,
    }
}

/// A port nothing listens on.
fn dead_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Submits `n` jobs straight to the log (nothing on any bus).
async fn submit(log: &Log, from: u64, n: u64) {
    let spec_ = LeaseSpec {
        service: "gateway".into(),
        partition: "test".into(),
        holder: "test".into(),
        ttl: Duration::from_secs(30),
    };
    let w = Leader::try_take(log, &spec_).await.unwrap().unwrap();
    let batch: Vec<NewEvent> = (from..from + n)
        .map(|i| {
            NewEvent::new(Event::JobSubmitted {
                job: JobId(i),
                spec: spec(),
                at: Timestamp(1),
            })
        })
        .collect();
    log.append(&batch, &w.fence()).await.unwrap();
    w.release().await;
}

/// Decisions (accepted or rejected) per job in the log.
async fn decisions(log: &Log) -> HashMap<u64, u32> {
    let mut out = HashMap::new();
    for le in log.read_from(0, 100_000).await.unwrap() {
        if le.event.producer() == Producer::Admission {
            if let Some(j) = le.event.job() {
                *out.entry(j.0).or_default() += 1;
            }
        }
    }
    out
}

async fn wait_decided(log: &Log, n: usize) -> HashMap<u64, u32> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let d = decisions(log).await;
        if d.len() >= n || Instant::now() > deadline {
            return d;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decides_from_the_log_while_the_bus_is_unreachable() {
    let log = Log::Memory(MemLog::new());
    let url = format!("nats://127.0.0.1:{}", dead_port());
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
