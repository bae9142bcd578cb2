//! Shared helpers for the core's integration tests: a small driver that
//! builds clusters and tenants through events, submits jobs, runs cycles
//! (checking invariants and scan bounds after each) and plays the node
//! agent, recording every event it applies so the log can be replayed.

#![allow(dead_code)] // each test binary uses a different subset

pub mod gen;

use gpusched_core::cycle::CycleOutput;
use gpusched_core::{run_cycle, ApplyError, CycleConfig, Job, Phase, ScanMemo, State};
use gpusched_events::{Assignment, Event, Outcome};
use std::collections::BTreeMap;

use gpusched_model::{
    FlavorQuota, Gpus, JobId, JobSpec, NodeId, NodeSpec, QueueingMode, TenantSpec, Timestamp,
};

/// The flavor most tests use.
pub const FLAVOR: &str = "h100";

/// A tenant specification under construction.
#[derive(Clone, Debug)]
pub struct TenantBuilder(pub TenantSpec);

/// A tenant named `name`: no cohort, weight 1, strict FIFO, no quotas yet.
pub fn tenant(name: &str) -> TenantBuilder {
    TenantBuilder(TenantSpec::new(name, Vec::new()))
}

impl TenantBuilder {
    /// Joins a cohort.
    pub fn cohort(mut self, c: &str) -> Self {
        self.0.cohort = Some(c.to_string());
        self
    }
    /// Sets the fair-share weight.
    pub fn weight(mut self, w: f64) -> Self {
        self.0.weight = w;
        self
    }
    /// Sets the queueing mode.
    pub fn queueing(mut self, m: QueueingMode) -> Self {
        self.0.queueing = m;
        self
    }
    /// Best-effort FIFO.
    pub fn best_effort(self) -> Self {
        self.queueing(QueueingMode::BestEffortFifo)
    }
    /// Adds a quota: unlimited borrowing, lends all of nominal.
    pub fn quota(mut self, flavor: &str, nominal: Gpus) -> Self {
        self.0.quotas.push(FlavorQuota::new(flavor, nominal));
        self
    }
    /// Sets the borrowing limit of the last quota added.
    pub fn borrowing(mut self, limit: Gpus) -> Self {
        self.0
            .quotas
            .last_mut()
            .expect("a quota first")
            .borrowing_limit = Some(limit);
        self
    }
    /// Sets the lending limit of the last quota added.
    pub fn lending(mut self, limit: Gpus) -> Self {
        self.0
            .quotas
            .last_mut()
            .expect("a quota first")
            .lending_limit = Some(limit);
        self
    }
    /// The finished specification.
    pub fn spec(self) -> TenantSpec {
        self.0
    }
}

/// A job of `workers` × `gpw` GPUs for `tenant` inside one `topology` domain.
pub fn job(tenant: &str, workers: u32, gpw: Gpus, topology: &str) -> JobSpec {
    JobSpec {
        tenant: tenant.to_string(),
        priority: 0,
        workers,
        gpus_per_worker: gpw,
        flavors: vec![],
        topology: topology.to_string(),
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

/// Drives a `State` through events and cycles the way the services and the
/// simulator do, recording every applied event.
pub struct Driver {
    /// The live state.
    pub state: State,
    /// The cycle's scan memo.
    pub memo: ScanMemo,
    /// The cycle's limits.
    pub cfg: CycleConfig,
    /// Every event applied, in order.
    pub log: Vec<Event>,
    /// Current time.
    pub now: Timestamp,
    /// Jobs submitted, in order.
    pub jobs: Vec<JobId>,
    next_job: u64,
}

impl Default for Driver {
    fn default() -> Self {
        Self::new(CycleConfig::default())
    }
}

impl Driver {
    /// An empty state with the given cycle limits.
    pub fn new(cfg: CycleConfig) -> Self {
        Driver {
            state: State::new(),
            memo: ScanMemo::default(),
            cfg,
            log: Vec::new(),
            now: Timestamp::from_secs(1),
            jobs: Vec::new(),
            next_job: 1,
        }
    }

    /// Applies an event; records it only if the state accepted it. A refused
    /// event must leave the state (hash and applied count) untouched.
    pub fn try_apply(&mut self, ev: Event) -> Result<(), ApplyError> {
        let before = (self.state.state_hash(), self.state.applied());
        let over = over_quota(&self.state);
        match self.state.apply(&ev) {
            Ok(()) => {
                check_over_quota(&over, &self.state, std::slice::from_ref(&ev));
                self.log.push(ev);
                Ok(())
            }
            Err(e) => {
                let after = (self.state.state_hash(), self.state.applied());
                assert_eq!(before, after, "refused {ev:?} ({e}) changed the state");
                Err(e)
            }
        }
    }

    /// Sets `tenant`'s queue to `state`, now.
    pub fn set_queue(&mut self, tenant: &str, state: gpusched_events::QueueState) {
        let at = self.now;
        self.apply(Event::QueueStateSet {
            tenant: tenant.into(),
            state,
            at,
        });
    }

    /// Applies an event that must be accepted.
    pub fn apply(&mut self, ev: Event) {
        let shown = format!("{ev:?}");
        if let Err(e) = self.try_apply(ev) {
            panic!("event refused: {shown}: {e}");
        }
    }

    /// Moves time on.
    pub fn advance(&mut self, secs: u64) {
        self.now = self.now.plus_secs(secs);
    }

    /// Adds one node of `gpus` GPUs of `flavor` at `rack`/`block`.
    pub fn add_node(&mut self, rack: &str, block: &str, gpus: Gpus, flavor: &str) -> NodeId {
        let id = NodeId(self.state.nodes().len() as u32);
        self.apply(Event::NodeAdded {
            node: id,
            spec: NodeSpec::new(format!("node-{}", id.0), flavor, gpus, &[rack, block]),
            at: self.now,
        });
        id
    }

    /// Builds `racks` × `blocks` × `nodes` nodes of `gpus` GPUs of `flavor`,
    /// configuring the `rack`/`block` topology first when no node exists.
    /// Node ids are rack-major: `((r * blocks) + b) * nodes + n` from the
    /// first id added. Racks are named `r{r}`, blocks `b{b}`.
    pub fn cluster(
        &mut self,
        racks: u32,
        blocks: u32,
        nodes: u32,
        gpus: Gpus,
        flavor: &str,
    ) -> Vec<NodeId> {
        if self.state.nodes().is_empty() {
            self.apply(Event::TopologyConfigured {
                levels: vec!["rack".into(), "block".into()],
            });
        }
        let mut out = Vec::new();
        for r in 0..racks {
            for b in 0..blocks {
                for _ in 0..nodes {
                    out.push(self.add_node(&format!("r{r}"), &format!("b{b}"), gpus, flavor));
                }
            }
        }
        out
    }

    /// Configures a tenant.
    pub fn tenant(&mut self, t: TenantBuilder) {
        self.apply(Event::TenantConfigured { spec: t.spec() });
    }

    /// Submits a job (JobSubmitted) and returns its id.
    pub fn submit(&mut self, spec: JobSpec) -> JobId {
        let id = JobId(self.next_job);
        self.next_job += 1;
        self.apply(Event::JobSubmitted {
            job: id,
            spec,
            at: self.now,
        });
        self.jobs.push(id);
        id
    }

    /// Runs one cycle; checks invariants 1–3 and the scan bounds (invariant 8)
    /// and records the decisions.
    pub fn cycle(&mut self) -> CycleOutput {
        let over = over_quota(&self.state);
        let out = run_cycle(&mut self.state, &mut self.memo, &self.cfg, self.now)
            .unwrap_or_else(|e| panic!("cycle decided something apply refuses: {e}"));
        check_over_quota(&over, &self.state, &out.events);
        self.log.extend(out.events.iter().cloned());
        if let Err(e) = self.state.check_invariants() {
            panic!("invariant broken after a cycle: {e}");
        }
        let s = out.stats;
        assert!(
            s.quota.heads_examined <= self.cfg.max_heads as u64,
            "quota heads {} > K {}",
            s.quota.heads_examined,
            self.cfg.max_heads
        );
        assert!(
            s.placement.heads_examined <= self.cfg.max_heads as u64,
            "placement heads {} > K {}",
            s.placement.heads_examined,
            self.cfg.max_heads
        );
        assert!(s.validated <= self.cfg.max_validations as u64);
        assert_eq!(s.decisions, out.events.len() as u64);
        out
    }

    /// Runs cycles until one decides nothing; returns every decision.
    pub fn run_until_quiet(&mut self) -> Vec<Event> {
        let mut all = Vec::new();
        for _ in 0..10_000 {
            let out = self.cycle();
            if out.events.is_empty() {
                return all;
            }
            all.extend(out.events);
        }
        panic!("cycles never went quiet");
    }

    /// A job.
    pub fn job(&self, id: JobId) -> &Job {
        self.state.job(id).expect("known job")
    }

    /// A job's phase.
    pub fn phase(&self, id: JobId) -> Phase {
        self.job(id).phase
    }

    /// Jobs in a phase, in submit order.
    pub fn in_phase(&self, p: Phase) -> Vec<JobId> {
        self.jobs
            .iter()
            .copied()
            .filter(|&j| self.phase(j) == p)
            .collect()
    }

    /// The agent starts every bound job.
    pub fn start_bound(&mut self) {
        for j in self.in_phase(Phase::Bound) {
            self.apply(Event::JobStarted {
                job: j,
                at: self.now,
            });
        }
    }

    /// The agent finishes a job holding GPUs: starts it first if only bound.
    pub fn finish(&mut self, id: JobId) {
        if self.phase(id) == Phase::Bound {
            self.apply(Event::JobStarted {
                job: id,
                at: self.now,
            });
        }
        self.apply(Event::JobFinished {
            job: id,
            outcome: Outcome::Succeeded,
            at: self.now,
            exits: Vec::new(),
            reason: None,
        });
    }

    /// The agent finishes every job holding GPUs.
    pub fn finish_all(&mut self) {
        for j in self.jobs.clone() {
            if self.phase(j).holds_gpus() {
                self.finish(j);
            }
        }
    }

    /// Puts a job on chosen nodes by applying the legal sequence of events a
    /// gateway, admission, quota, placement and agent would write; used to
    /// lay out a cluster precisely. Returns the running job.
    pub fn place_manually(&mut self, spec: JobSpec, assignments: &[(NodeId, Gpus)]) -> JobId {
        let flavor = {
            let n = assignments.first().expect("at least one node").0;
            self.state.nodes()[n.index()].spec.flavor.clone()
        };
        let id = self.submit(spec);
        self.apply(Event::JobAccepted { job: id });
        self.apply(Event::JobAdmitted {
            job: id,
            flavor,
            borrowed: 0,
            at: self.now,
        });
        self.apply(Event::JobBound {
            job: id,
            assignments: assignments
                .iter()
                .map(|&(node, gpus)| Assignment { node, gpus })
                .collect(),
            backfill_for: None,
            at: self.now,
        });
        self.apply(Event::JobStarted {
            job: id,
            at: self.now,
        });
        id
    }

    /// The `block` domain path (`r0/b1`) of a node.
    pub fn block_of(&self, n: NodeId) -> String {
        self.state.nodes()[n.index()].spec.path.join("/")
    }

    /// A fresh state rebuilt from the recorded log.
    pub fn replay(&self) -> State {
        let mut s = State::new();
        for (i, e) in self.log.iter().enumerate() {
            if let Err(err) = s.apply(e) {
                panic!("replay refused event {i} {e:?}: {err}");
            }
        }
        s
    }
}

/// The JobPending reason given for a job in a batch of events, if any.
pub fn pending_reason(events: &[Event], id: JobId) -> Option<&gpusched_events::PendingReason> {
    events.iter().rev().find_map(|e| match e {
        Event::JobPending { job, reason, .. } if *job == id => Some(reason),
        _ => None,
    })
}

/// The assignments a job was bound with in a batch of events, if any.
pub fn binding(events: &[Event], id: JobId) -> Option<&[Assignment]> {
    events.iter().rev().find_map(|e| match e {
        Event::JobBound {
            job, assignments, ..
        } if *job == id => Some(assignments.as_slice()),
        _ => None,
    })
}

impl Driver {
    /// The agent reports a complete checkpoint of `id` capturing
    /// `progress_ms` of work, now (uri `ckpt://job-{id}/{progress_ms}`).
    pub fn checkpoint(&mut self, id: JobId, progress_ms: u64) {
        self.apply(Event::JobCheckpointed {
            job: id,
            progress_ms,
            uri: format!("ckpt://job-{}/{progress_ms}", id.0),
            at: self.now,
        });
    }

    /// Moves time on by milliseconds.
    pub fn advance_ms(&mut self, ms: u64) {
        self.now = Timestamp(self.now.0 + ms);
    }

    /// Moves time on to `t` (never back).
    pub fn advance_to(&mut self, t: Timestamp) {
        self.now = self.now.max(t);
    }

    /// Runs cycles until quiet, then the agent starts what was bound;
    /// returns every decision.
    pub fn settle(&mut self) -> Vec<Event> {
        let ev = self.run_until_quiet();
        self.start_bound();
        ev
    }
}

/// Where usage past quota is: a tenant (past its limit) or a cohort
/// (lending past what its members lend), by index, and the flavor.
pub type OverAt = (&'static str, usize, gpusched_core::FlavorIdx);

/// Usage past quota: tenants past their limit (`Tenant::over_limit`) and
/// cohorts lending past what their members lend (`Cohort::over_lent`), per
/// flavor; zeros left out.
pub fn over_quota(s: &State) -> BTreeMap<OverAt, Gpus> {
    let mut out = BTreeMap::new();
    for f in 0..s.flavors().len() {
        let f = f as gpusched_core::FlavorIdx;
        for (i, t) in s.tenants().iter().enumerate() {
            out.insert(("tenant", i, f), t.over_limit(f).get());
        }
        for (i, c) in s.cohorts().iter().enumerate() {
            out.insert(("cohort", i, f), c.over_lent(f).get());
        }
    }
    out.retain(|_, g| *g > 0);
    out
}

/// Invariant 3 across events: usage past quota appears or grows only with
/// an event that takes quota back (a tenant reconfigured, a budget spent
/// or renewed); admissions and everything else never add to it.
pub fn check_over_quota(before: &BTreeMap<OverAt, Gpus>, s: &State, events: &[Event]) {
    let takes_back = events.iter().any(|e| {
        matches!(
            e,
            Event::TenantConfigured { .. }
                | Event::BudgetSpent { .. }
                | Event::BudgetRenewed { .. }
        )
    });
    if takes_back {
        return;
    }
    for (at, &g) in &over_quota(s) {
        let was = before.get(at).copied().unwrap_or(0);
        assert!(
            g <= was,
            "{at:?}: {g} GPUs past quota, {was} before {events:?}"
        );
    }
}
