//! Test helpers: a throwaway database per test, dropped even when the test
//! fails, and a tiny scheduling run built with `gpusched-core`.

#![allow(dead_code)] // each test binary uses a different subset

use gpusched_core::{run_cycle, CycleConfig, Phase, ScanMemo, State};
use gpusched_events::{Event, Outcome};
use gpusched_model::{
    FlavorQuota, JobId, JobSpec, NodeId, NodeSpec, QueueingMode, TenantSpec, Timestamp,
};

pub use gpusched_store::testing::TestDb;

/// The flavor of the test cluster.
pub const FLAVOR: &str = "h100";

/// A job of `workers` × `gpw` GPUs for tenant `t`.
pub fn job_spec(t: &str, workers: u32, gpw: u32, priority: i32) -> JobSpec {
    JobSpec {
        tenant: t.to_string(),
        priority,
        workers,
        gpus_per_worker: gpw,
        flavors: vec![],
        topology: "block".to_string(),
        preemptible: true,
        checkpoint: None,
        max_runtime_s: Some(3600),
        command: Vec::new(),
        env: Default::default(),
        working_dir: None,
        checkpoint_signal: None,
        array: None,
        after_ok: Vec::new(),
        after: Vec::new(),
    }
}

/// A tenant with a nominal quota of `nominal` GPUs of `FLAVOR`.
pub fn tenant_spec(name: &str, nominal: u32) -> TenantSpec {
    TenantSpec {
        cohort: Some("all".to_string()),
        weight: 1.5,
        queueing: QueueingMode::BestEffortFifo,
        ..TenantSpec::new(name, vec![FlavorQuota::new(FLAVOR, nominal)])
    }
}

/// A small scheduling run: every event applied to the live state, grouped
/// in the batches a service would append.
pub struct Run {
    /// The live state after every batch.
    pub state: State,
    /// The batches, in order.
    pub batches: Vec<Vec<Event>>,
}

impl Run {
    /// All events, in order.
    pub fn events(&self) -> Vec<Event> {
        self.batches.iter().flatten().cloned().collect()
    }
}

fn apply_batch(state: &mut State, batch: &[Event]) {
    for ev in batch {
        if let Err(e) = state.apply(ev) {
            panic!("generated event refused: {ev:?}: {e}");
        }
    }
}

/// Topology, 8 nodes of 8 GPUs in 2 racks × 2 blocks, two tenants, a few
/// jobs, cycles with the agent starting and finishing jobs in between.
pub fn scheduling_run() -> Run {
    let mut state = State::new();
    let mut batches: Vec<Vec<Event>> = Vec::new();
    let mut now = Timestamp::from_secs(1);

    let mut setup = vec![Event::TopologyConfigured {
        levels: vec!["rack".into(), "block".into()],
    }];
    let mut id = 0;
    for r in 0..2 {
        for b in 0..2 {
            for _ in 0..2 {
                setup.push(Event::NodeAdded {
                    node: NodeId(id),
                    spec: NodeSpec::new(
                        format!("node-{id}"),
                        FLAVOR.to_string(),
                        8,
                        &[&format!("r{r}"), &format!("b{b}")],
                    ),
                    at: now,
                });
                id += 1;
            }
        }
    }
    setup.push(Event::TenantConfigured {
        spec: tenant_spec("alpha", 32),
    });
    setup.push(Event::TenantConfigured {
        spec: tenant_spec("beta", 32),
    });
    apply_batch(&mut state, &setup);
    batches.push(setup);

    let shapes = [
        (2, 8, 0),
        (1, 4, 1),
        (1, 8, 0),
        (2, 4, 2),
        (4, 8, 0),
        (1, 2, 0),
        (2, 8, 1),
    ];
    let mut submits = Vec::new();
    for (i, (w, g, p)) in shapes.iter().enumerate() {
        let t = if i % 2 == 0 { "alpha" } else { "beta" };
        submits.push(Event::JobSubmitted {
            job: JobId(i as u64 + 1),
            spec: job_spec(t, *w, *g, *p),
            at: now,
        });
    }
    apply_batch(&mut state, &submits);
    batches.push(submits);

    let cfg = CycleConfig::default();
    let mut memo = ScanMemo::default();
    for round in 0..5 {
        now = now.plus_secs(10);
        let out = run_cycle(&mut state, &mut memo, &cfg, now)
            .unwrap_or_else(|e| panic!("cycle refused its own decision: {e}"));
        if !out.events.is_empty() {
            batches.push(out.events);
        }
        // The agent: start what is bound; finish the oldest running job.
        now = now.plus_secs(5);
        let mut agent = Vec::new();
        let jobs: Vec<(JobId, Phase)> = (1..=shapes.len() as u64)
            .filter_map(|i| state.job(JobId(i)).map(|j| (j.id, j.phase)))
            .collect();
        for (j, phase) in &jobs {
            if *phase == Phase::Bound {
                agent.push(Event::JobStarted { job: *j, at: now });
            }
        }
        if round % 2 == 1 {
            if let Some((j, _)) = jobs.iter().find(|(_, p)| *p == Phase::Running) {
                agent.push(Event::JobFinished {
                    job: *j,
                    outcome: Outcome::Succeeded,
                    at: now,
                    exits: Vec::new(),
                    reason: None,
                });
            }
        }
        apply_batch(&mut state, &agent);
        if !agent.is_empty() {
            batches.push(agent);
        }
    }
    Run { state, batches }
}
