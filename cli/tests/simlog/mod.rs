//! A simulated run's log in a real Postgres database of its own, for the
//! tests of the commands that read the log alone (`replay`, `timeline`,
//! `diff`, `why-preempted`).

use gpusched_events::Event;
use gpusched_sim::workload::Workload;
use gpusched_sim::{Cluster, SimOptions, Simulator};
use gpusched_store::testing::TestDb;
use gpusched_store::NewEvent;
use std::time::Duration;

/// Runs the cluster's workload to the end; its live state hash and log.
pub fn simulate(cluster: &Cluster, workload: Workload) -> (String, Vec<Event>) {
    let opts = SimOptions {
        cycle: cluster.cycle,
        until: None,
        record_events: true,
        restore_ms: 0,
    };
    let mut sim = Simulator::new(cluster, workload, opts).expect("a valid simulation");
    sim.run(&mut |_| {}).expect("the simulation runs");
    (sim.state().state_hash(), sim.log().to_vec())
}

/// A new database holding `log`, appended under a lease as a service would.
pub async fn logged(log: &[Event]) -> TestDb {
    let db = TestDb::new().await;
    let lease = db
        .store
        .acquire_lease("simulator", "0", "test", Duration::from_secs(60))
        .await
        .expect("lease query")
        .expect("a free lease");
    for batch in log.chunks(2000) {
        let batch: Vec<NewEvent> = batch.iter().cloned().map(NewEvent::new).collect();
        db.store
            .append(&batch, &lease.fence())
            .await
            .expect("append");
    }
    db
}
