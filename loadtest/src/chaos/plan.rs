//! The chaos run's plan: the faults in the order they are injected, each
//! phase's timing jittered by the seed, and the run's sizes (long form,
//! or the short form the test suite runs).
//!
//! Owns: the fault list of each form, the sizes (nodes, rate, lease TTL,
//! time scale), and drawing the timing from the seed.
//!
//! Must never: do I/O or read the clock (the same seed and form always
//! give the same plan).

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// The deciding services a SIGKILL may hit (the gateway is its own fault).
pub const DECIDERS: [&str; 5] = ["admission", "quota", "placement", "preemption", "agent"];

/// One fault.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// SIGKILL the service's active instance, then start a new one.
    Kill {
        /// The service.
        service: String,
    },
    /// `pg_ctl restart -m fast`.
    PgRestart,
    /// Postgres stopped (fast), started again after `secs`.
    PgStop {
        /// Seconds down.
        secs: f64,
    },
    /// nats-server SIGKILLed and started again, its store kept or wiped.
    NatsKill {
        /// Whether the store (streams, consumers) is removed first.
        wipe: bool,
    },
    /// nats-server stopped (SIGTERM), started again after `secs` with its store.
    NatsStop {
        /// Seconds down.
        secs: f64,
    },
    /// The service's leader SIGSTOPped for `secs` (past its lease, a
    /// standby running), then SIGCONT.
    PauseLeader {
        /// The service.
        service: String,
        /// Seconds paused.
        secs: f64,
    },
    /// Duplicates of real batches, out-of-order copies and malformed
    /// messages published on every event subject.
    BusGarbage,
}

impl Fault {
    /// A short name for tables.
    pub fn label(&self) -> String {
        match self {
            Fault::Kill { service } => format!("SIGKILL {service}"),
            Fault::PgRestart => "postgres restart".into(),
            Fault::PgStop { secs } => format!("postgres down {secs:.0} s"),
            Fault::NatsKill { wipe: false } => "nats SIGKILL, store kept".into(),
            Fault::NatsKill { wipe: true } => "nats SIGKILL, store wiped".into(),
            Fault::NatsStop { secs } => format!("nats down {secs:.0} s"),
            Fault::PauseLeader { service, secs } => format!("{service} leader paused {secs:.0} s"),
            Fault::BusGarbage => "bus: dup/reordered/malformed".into(),
        }
    }

    /// The stages whose first append after the fault shows they decide
    /// again (besides a job submitted after the fault being bound).
    /// `preemption` has nothing to decide in this workload: its new
    /// instance's readiness stands in for it.
    pub fn must_decide(&self) -> Vec<&'static str> {
        let all = vec!["gateway", "admission", "quota", "placement", "agent"];
        let named = |s: &str| all.iter().copied().filter(|a| *a == s).collect::<Vec<_>>();
        match self {
            Fault::Kill { service } | Fault::PauseLeader { service, .. } => named(service),
            _ => all,
        }
    }
}

/// One phase: steady load for `lead`, the fault, then `observe` of load
/// while the system recovers.
#[derive(Clone, Debug, Serialize)]
pub struct PhasePlan {
    /// The fault.
    pub fault: Fault,
    /// Load before the fault.
    pub lead: Duration,
    /// Load after the fault, before the next phase.
    pub observe: Duration,
}

/// The whole run.
#[derive(Clone, Debug, Serialize)]
pub struct ChaosPlan {
    /// The short form (test suite)?
    pub short: bool,
    /// Seed of the timing and the workload.
    pub seed: u64,
    /// Simulated nodes.
    pub nodes: usize,
    /// Nodes per topology block.
    pub nodes_per_block: usize,
    /// Tenants.
    pub tenants: usize,
    /// Lease time to live of every service, seconds.
    pub lease_ttl_s: f64,
    /// Submissions per second (open loop).
    pub rate: f64,
    /// The simulated agent's time scale (a 4 h job runs 1 s).
    pub time_scale: f64,
    /// A submission is retried (same key) for this long, then given up.
    pub give_up: Duration,
    /// After the last phase, every accepted job must end within this.
    pub drain: Duration,
    /// The phases, in order.
    pub phases: Vec<PhasePlan>,
    /// What recovery and stalls must meet.
    pub goals: Goals,
}

/// What a run must meet besides its counts.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Goals {
    /// Fault end → deciding again, at most.
    pub recovery: Duration,
    /// The longest stall outside a fault window, at most.
    pub stall: Duration,
}

impl Default for Goals {
    /// The goals: recovery within 5 s, no stall over 1 s.
    fn default() -> Self {
        Goals {
            recovery: Duration::from_secs(5),
            stall: Duration::from_secs(1),
        }
    }
}

fn long_faults(ttl: f64) -> Vec<Fault> {
    let mut f: Vec<Fault> = ["admission", "quota", "placement", "preemption", "agent"]
        .iter()
        .map(|s| Fault::Kill {
            service: s.to_string(),
        })
        .collect();
    f.extend([
        Fault::Kill {
            service: "gateway".into(),
        },
        Fault::PauseLeader {
            service: "quota".into(),
            secs: ttl + 3.0,
        },
        Fault::BusGarbage,
        Fault::PgRestart,
        Fault::PgStop { secs: 15.0 },
        Fault::NatsKill { wipe: false },
        Fault::NatsStop { secs: 20.0 },
        // Last: a wiped store takes every stream and consumer with it.
        Fault::NatsKill { wipe: true },
    ]);
    f
}

fn short_faults(ttl: f64, rng: &mut ChaCha8Rng) -> Vec<Fault> {
    let victim = DECIDERS[rng.gen_range(0..DECIDERS.len())];
    vec![
        Fault::Kill {
            service: victim.to_string(),
        },
        Fault::Kill {
            service: "gateway".into(),
        },
        Fault::PauseLeader {
            service: "quota".into(),
            secs: ttl + 2.0,
        },
        Fault::BusGarbage,
        Fault::PgRestart,
        Fault::NatsKill { wipe: false },
    ]
}

fn secs(rng: &mut ChaCha8Rng, lo: f64, hi: f64) -> Duration {
    Duration::from_secs_f64(rng.gen_range(lo..hi))
}

/// The plan for `seed`: the long form, or the short one.
pub fn plan(seed: u64, short: bool) -> ChaosPlan {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let ttl = if short { 2.0 } else { 5.0 };
    let faults = if short {
        short_faults(ttl, &mut rng)
    } else {
        long_faults(ttl)
    };
    let ((lead_lo, lead_hi), (obs_lo, obs_hi)) = if short {
        ((1.0, 2.0), (5.0, 6.0))
    } else {
        ((2.0, 4.0), (8.0, 10.0))
    };
    let phases = faults
        .into_iter()
        .map(|fault| PhasePlan {
            fault,
            lead: secs(&mut rng, lead_lo, lead_hi),
            observe: secs(&mut rng, obs_lo, obs_hi),
        })
        .collect();
    ChaosPlan {
        short,
        seed,
        nodes: if short { 16 } else { 32 },
        nodes_per_block: 8,
        tenants: 4,
        lease_ttl_s: ttl,
        rate: if short { 5.0 } else { 20.0 },
        time_scale: 14_400.0,
        give_up: Duration::from_secs(if short { 60 } else { 120 }),
        drain: Duration::from_secs(if short { 60 } else { 120 }),
        phases,
        goals: Goals::default(),
    }
}

impl ChaosPlan {
    /// Seconds the phases take as planned (fault durations included).
    pub fn planned_s(&self) -> f64 {
        self.phases
            .iter()
            .map(|p| {
                let fault = match &p.fault {
                    Fault::PgStop { secs }
                    | Fault::NatsStop { secs }
                    | Fault::PauseLeader { secs, .. } => *secs,
                    _ => 0.5,
                };
                p.lead.as_secs_f64() + fault + p.observe.as_secs_f64()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_plan() {
        let (a, b) = (plan(3, false), plan(3, false));
        assert_eq!(a.phases.len(), b.phases.len());
        for (x, y) in a.phases.iter().zip(&b.phases) {
            assert_eq!((&x.fault, x.lead, x.observe), (&y.fault, y.lead, y.observe));
        }
        let c = plan(4, false);
        assert!(a
            .phases
            .iter()
            .zip(&c.phases)
            .any(|(x, y)| x.lead != y.lead));
    }

    #[test]
    fn the_long_form_covers_every_fault() {
        let p = plan(1, false);
        let labels: Vec<String> = p.phases.iter().map(|p| p.fault.label()).collect();
        for s in gpusched_stack::SERVICES {
            assert!(labels.contains(&format!("SIGKILL {s}")), "{labels:?}");
        }
        for f in [
            Fault::PgRestart,
            Fault::PgStop { secs: 15.0 },
            Fault::NatsKill { wipe: false },
            Fault::NatsKill { wipe: true },
            Fault::NatsStop { secs: 20.0 },
            Fault::BusGarbage,
        ] {
            assert!(p.phases.iter().any(|p| p.fault == f), "{f:?}");
        }
        let ttl = p.lease_ttl_s;
        assert!(p
            .phases
            .iter()
            .any(|x| matches!(&x.fault, Fault::PauseLeader { secs, .. } if *secs > ttl)));
    }

    #[test]
    fn the_short_form_is_short_and_covers_each_kind() {
        for seed in 0..20 {
            let p = plan(seed, true);
            assert!(p.planned_s() < 90.0, "{}", p.planned_s());
            let jobs = p.planned_s() * p.rate;
            assert!((150.0..400.0).contains(&jobs), "{jobs}");
            let has = |f: &dyn Fn(&Fault) -> bool| p.phases.iter().any(|x| f(&x.fault));
            assert!(has(
                &|f| matches!(f, Fault::Kill { service } if service != "gateway")
            ));
            assert!(has(
                &|f| matches!(f, Fault::Kill { service } if service == "gateway")
            ));
            assert!(has(&|f| *f == Fault::PgRestart));
            assert!(has(&|f| *f == Fault::NatsKill { wipe: false }));
            assert!(has(&|f| *f == Fault::BusGarbage));
            assert!(has(
                &|f| matches!(f, Fault::PauseLeader { secs, .. } if *secs > p.lease_ttl_s)
            ));
        }
    }
}
