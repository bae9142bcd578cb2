//! Helpers for tests that run a deciding service over the embedded log:
//! the admission stage as the admission service runs it, submissions
//! written straight to the log, and the decisions the log holds.
#![allow(dead_code, clippy::unwrap_used, missing_docs)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use gpusched_core::{admission, State};
use gpusched_events::{Event, Producer};
use gpusched_model::{JobId, JobSpec, Timestamp};
use std::sync::Arc;

use gpusched_runtime::{
    run_service, Bus, Decider, Leader, LeaseSpec, Log, ServiceConfig, ServiceStats,
};
use gpusched_store::NewEvent;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The admission stage, as the admission service runs it.
pub struct Admission;

impl Decider for Admission {
    fn producer(&self) -> Producer {
        Producer::Admission
    }
    fn decide(&mut self, state: &State, now: Timestamp) -> Vec<Event> {
        admission::decide(state, 1000, now)
    }
}

/// A one-GPU job of a tenant nobody configured (admission rejects it:
/// a decision all the same).
pub fn spec() -> JobSpec {
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
        array: None,
        after_ok: Vec::new(),
        after: Vec::new(),
    }
}

/// Submits jobs `from..from + n` straight to the log (nothing on any bus).
pub async fn submit(log: &Log, from: u64, n: u64) {
    let lease = LeaseSpec {
        service: "gateway".into(),
        partition: "test".into(),
        holder: "test".into(),
        ttl: Duration::from_secs(30),
    };
    let w = Leader::try_take(log, &lease).await.unwrap().unwrap();
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

/// Admission decisions (accepted or rejected) per job in the log.
pub async fn decisions(log: &Log) -> HashMap<u64, u32> {
    let mut out = HashMap::new();
    for le in log.read_from(0, 1_000_000).await.unwrap() {
        if le.event.producer() == Producer::Admission {
            if let Some(j) = le.event.job() {
                *out.entry(j.0).or_default() += 1;
            }
        }
    }
    out
}

/// Waits (up to 20 s) until the log holds decisions for `n` jobs.
pub async fn wait_decided(log: &Log, n: usize) -> HashMap<u64, u32> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let d = decisions(log).await;
        if d.len() >= n || Instant::now() > deadline {
            return d;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An admission service instance running in this process.
pub struct Instance {
    pub stats: Arc<ServiceStats>,
    pub shutdown: CancellationToken,
    pub task: JoinHandle<anyhow::Result<()>>,
}

impl Instance {
    /// Starts one as `holder` (lease TTL 1 s), with `tune` applied to its
    /// configuration.
    pub fn start(
        log: &Log,
        bus: &Bus,
        holder: &str,
        tune: impl FnOnce(&mut ServiceConfig),
    ) -> Self {
        let mut cfg = ServiceConfig::new("admission", holder);
        cfg.lease_ttl = Duration::from_millis(1000);
        tune(&mut cfg);
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

    /// Shuts it down; it must end cleanly.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
    }
}
