//! The services as separate processes over the real Postgres and NATS:
//! 1,000 jobs end to end, replay equal to the live state, a SIGKILLed
//! service (with and without a standby), a stale epoch refused, a repeated
//! idempotency key, and a malformed message.
#![allow(clippy::unwrap_used)]

mod stack;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use gpusched_bus::async_nats;
use gpusched_events::Event;
use gpusched_model::JobSpec;
use gpusched_sim::workload::{self, SyntheticOptions};
use gpusched_sim::Cluster;
use gpusched_store::{NewEvent, StoreError, Until};
use serde::Deserialize;
use stack::Stack;

#[derive(Debug, Deserialize)]
struct Status {
    seq: u64,
    state_hash: String,
    jobs: usize,
    phases: BTreeMap<String, u64>,
}

#[derive(Debug, Deserialize)]
struct Submitted {
    id: u64,
}

/// `n` jobs of the synthetic mix over the demo tenants, running 1–4 min of
/// simulated time (a few tens of ms at the agents' time scale).
fn jobs(n: usize, seed: u64) -> Vec<JobSpec> {
    let cluster = Cluster::demo();
    let w = workload::synthetic(&SyntheticOptions {
        jobs: n,
        tenants: cluster.tenants.clone(),
        seed,
        arrival_rate_per_s: 0.0,
        gpus_per_node: cluster.gpus_per_node,
    });
    w.into_submissions()
        .map(|(_, mut spec, duration_s)| {
            spec.max_runtime_s = Some(60 + duration_s % 180);
            spec
        })
        .collect()
}

async fn submit_all(http: &str, specs: &[JobSpec], key_prefix: &str) -> Vec<u64> {
    let client = stack::client();
    let mut ids = Vec::with_capacity(specs.len());
    for chunk in specs.chunks(50).enumerate() {
        let (c, chunk) = chunk;
        let futs = chunk.iter().enumerate().map(|(i, spec)| {
            let client = client.clone();
            let key = format!("{key_prefix}-{}", c * 50 + i);
            async move {
                let r = client
                    .post(format!("{http}/v1/jobs"))
                    .header("Idempotency-Key", key)
                    .json(spec)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
                r.json::<Submitted>().await.unwrap().id
            }
        });
        ids.extend(futures::future::join_all(futs).await);
    }
    ids
}

async fn status(http: &str) -> Status {
    stack::client()
        .get(format!("{http}/v1/status?hash=true"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Waits until `n` jobs have ended; returns the final status.
async fn wait_ended(stack: &Stack, n: usize) -> Status {
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let s = status(&stack.http).await;
        let ended: u64 = ["succeeded", "failed", "cancelled", "rejected"]
            .iter()
            .filter_map(|p| s.phases.get(*p))
            .sum();
        if s.jobs >= n && ended as usize >= n {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "jobs did not all end: {s:?}; logs in {}",
            stack.opts.logs.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The log holds each job's submission once; each job ends exactly once in
/// the state folded from it; and a replay to the live view's sequence gives
/// the live hash.
///
/// The agent and the preemption service write concurrently, so a run can
/// end twice in the log: the agent reports it finished while the
/// preemption service, not having seen that yet, preempts it. The later
/// of the two is superseded (the fold refuses it). That is the only way a
/// second `JobFinished` may appear: one the fold refuses must follow an
/// event of another writer that ended the same run.
async fn assert_log_consistent(stack: &Stack, live: &Status, ids: &[u64]) {
    let events = stack.store.read_from(0, 10_000_000).await.unwrap();
    let mut submitted: HashMap<u64, u32> = HashMap::new();
    let mut finished: HashMap<u64, u32> = HashMap::new();
    // The event that last ended or restarted each job's run.
    let mut last_turn: HashMap<u64, (u64, &'static str)> = HashMap::new();
    let mut state = gpusched_core::State::new();
    let mut superseded_finishes = 0;
    for e in &events {
        let applied = state.apply(&e.event).is_ok();
        let job = e.event.job().map(|j| j.0);
        match &e.event {
            Event::JobSubmitted { job, .. } => *submitted.entry(job.0).or_default() += 1,
            Event::JobFinished { job, .. } if applied => *finished.entry(job.0).or_default() += 1,
            Event::JobFinished { job, .. } => {
                superseded_finishes += 1;
                let turn = last_turn.get(&job.0);
                assert!(
                    matches!(turn, Some((_, "job_preempted" | "job_cancelled"))),
                    "job {} finished again at seq {} after {turn:?}, not after another \
                     writer ended its run",
                    job.0,
                    e.seq
                );
            }
            Event::JobStarted { .. } | Event::JobPreempted { .. } | Event::JobCancelled { .. }
                if applied =>
            {
                if let Some(j) = job {
                    last_turn.insert(j, (e.seq, e.event.kind()));
                }
            }
            _ => {}
        }
    }
    assert_eq!(submitted.len(), ids.len(), "one job per submission");
    assert!(submitted.values().all(|&n| n == 1));
    for id in ids {
        assert_eq!(finished.get(id), Some(&1), "job {id} finished exactly once");
    }
    eprintln!("{superseded_finishes} finish reports lost a race to a preemption");
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "dense log");
    let replayed = stack.store.replay(Until::Seq(live.seq)).await.unwrap();
    assert_eq!(replayed.state_hash(), live.state_hash, "replay == live");
}

/// Every process answers `/metrics` in the Prometheus text format, and
/// the figures are those of the run: a thousand jobs succeeded, every
/// deciding service leads and went round, and admission appended a
/// decision for each job. Every series the Grafana dashboard queries is
/// among those exported.
async fn assert_every_service_exports_metrics(stack: &Stack) {
    let mut exported = std::collections::BTreeSet::new();
    let value = |samples: &[stack::Sample], name: &str, label: Option<(&str, &str)>| {
        samples
            .iter()
            .find(|s| s.name == name && label.is_none_or(|(k, v)| s.label(k) == Some(v)))
            .map(|s| s.value)
    };
    for p in &stack.procs {
        let (families, samples) = stack::scrape(&p.health).await;
        exported.extend(families);
        exported.extend(samples.iter().map(|s| s.name.clone()));
        assert!(
            samples.iter().all(|s| s.name.starts_with("gpusched_")),
            "{}: {samples:?}",
            p.service
        );
        if p.service == "gateway" {
            assert_eq!(
                value(&samples, "gpusched_jobs", Some(("state", "succeeded"))),
                Some(1000.0)
            );
            assert_eq!(value(&samples, "gpusched_view_caught_up", None), Some(1.0));
            assert!(value(&samples, "gpusched_quota_nominal_gpus", None).is_some_and(|g| g > 0.0));
            // Every job was admitted and bound at least once (more when
            // preempted and resumed), counted from the log as it folded.
            let sum = |name: &str| -> f64 {
                samples
                    .iter()
                    .filter(|s| s.name == name)
                    .map(|s| s.value)
                    .sum()
            };
            assert!(sum("gpusched_admissions_total") >= 1000.0, "{samples:?}");
            assert!(sum("gpusched_bindings_total") >= 1000.0, "{samples:?}");
            assert!(value(&samples, "gpusched_reclaim_latency_seconds_count", None).is_some());
            continue;
        }
        let this = Some(("service", p.service.as_str()));
        assert_eq!(
            value(&samples, "gpusched_leader", this),
            Some(1.0),
            "{}",
            p.service
        );
        assert!(
            value(&samples, "gpusched_cycles_total", this).is_some_and(|c| c > 0.0),
            "{}",
            p.service
        );
        assert!(
            value(&samples, "gpusched_bus_backlog_messages", this).is_some(),
            "{}: no bus backlog",
            p.service
        );
        assert!(
            value(&samples, "gpusched_cycle_duration_seconds_count", this).is_some(),
            "{}: no cycle histogram",
            p.service
        );
        let work = |name: &str| value(&samples, name, this).unwrap_or(-1.0);
        match p.service.as_str() {
            "quota" | "placement" => assert!(
                work("gpusched_heads_examined_total") >= 1000.0
                    && work("gpusched_cycle_heads_examined_max") >= 1.0,
                "{}: every job was a head at least once",
                p.service
            ),
            _ => {}
        }
        if p.service == "placement" {
            assert!(work("gpusched_domains_probed_total") > 0.0);
        }
        if p.service == "admission" {
            let appended = value(&samples, "gpusched_events_appended_total", this);
            assert!(
                appended.is_some_and(|n| n >= 1000.0),
                "admission appended {appended:?}"
            );
        }
    }
    for name in dashboard_series() {
        assert!(
            exported.contains(&name),
            "the dashboard queries {name}, which no process exports"
        );
    }
}

/// The `gpusched_…` series named in the Grafana dashboard's queries.
fn dashboard_series() -> Vec<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/grafana/gpusched.json"
    );
    let text = std::fs::read_to_string(path).expect("deploy/grafana/gpusched.json");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut names = Vec::new();
    for panel in doc["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            let mut rest = expr;
            while let Some(at) = rest.find("gpusched_") {
                let tail = &rest[at..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(tail.len());
                names.push(tail[..end].to_string());
                rest = &tail[end..];
            }
        }
    }
    assert!(names.len() >= 10, "{names:?}");
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_jobs_through_every_service() {
    let mut stack = stack::new().await;
    stack::start_all(&mut stack).await;
    let specs = jobs(1000, 11);
    let started = Instant::now();
    let ids = submit_all(&stack.http, &specs, "clean").await;
    let live = wait_ended(&stack, 1000).await;
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(live.phases.get("succeeded"), Some(&1000), "{live:?}");
    assert_log_consistent(&stack, &live, &ids).await;
    assert_every_service_exports_metrics(&stack).await;
    eprintln!(
        "1000 jobs end to end in {secs:.1} s ({:.0} jobs/s, {} events, {:.0} events/s)",
        1000.0 / secs,
        live.seq,
        live.seq as f64 / secs
    );
    // Graceful shutdown: every service exits 0 on SIGTERM.
    let instances: Vec<String> = stack.procs.iter().map(|p| p.instance.clone()).collect();
    for i in instances {
        assert!(
            stack.terminate(&i).expect("SIGTERM"),
            "{i} exited non-zero on SIGTERM"
        );
    }
    stack::teardown(stack).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_services_lose_and_duplicate_nothing() {
    let mut stack = stack::new().await;
    stack::start_all(&mut stack).await;
    // A standby for quota: it waits until the active instance's lease lapses.
    let standby = stack.start("quota").expect("quota");
    let specs = jobs(1000, 12);
    let mut ids = submit_all(&stack.http, &specs[..300], "kill-a").await;

    // SIGKILL the active quota instance; the standby takes over.
    let (active, epoch) = stack.lease_holder("quota").await.unwrap();
    assert_ne!(active, standby, "the first instance leads");
    stack.kill_instance(&active).expect("SIGKILL");
    // SIGKILL placement (no standby) and start it again.
    let placement = stack.lease_holder("placement").await.unwrap().0;
    stack.kill_instance(&placement).expect("SIGKILL");
    stack.start("placement").expect("placement");

    // A malformed message on an event subject does not stop any consumer.
    let client = async_nats::connect(stack::nats_url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    js.publish(
        format!("{}.evt.agent", stack.namespace),
        "not an envelope".into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();

    ids.extend(submit_all(&stack.http, &specs[300..], "kill-b").await);

    // The same key again: the same job, nothing new in the log.
    let client = stack::client();
    let again = client
        .post(format!("{}/v1/jobs", stack.http))
        .header("Idempotency-Key", "kill-a-7")
        .json(&specs[7])
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(again.json::<Submitted>().await.unwrap().id, ids[7]);

    let live = wait_ended(&stack, 1000).await;
    assert_eq!(live.jobs, 1000, "{live:?}");
    assert_eq!(live.phases.get("succeeded"), Some(&1000), "{live:?}");
    assert_log_consistent(&stack, &live, &ids).await;

    // The standby took the lease with a new epoch; the old epoch is fenced.
    let (holder, new_epoch) = stack.lease_holder("quota").await.unwrap();
    assert_eq!(holder, standby);
    assert!(new_epoch > epoch);
    let stale = gpusched_store::Fence {
        service: "quota".into(),
        partition: "default".into(),
        epoch,
    };
    let refused = stack
        .store
        .append(
            &[NewEvent::new(Event::JobAccepted {
                job: gpusched_model::JobId(ids[0]),
            })],
            &stale,
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::StaleEpoch { .. })),
        "{refused:?}"
    );
    stack::teardown(stack).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_relays_what_it_committed_but_never_published() {
    let mut stack = stack::new().await;
    // A decision the admission service committed before it crashed, never
    // published: appended under its lease, nothing on the bus.
    let lease = stack
        .store
        .acquire_lease(
            "admission",
            "default",
            "crashed",
            Duration::from_millis(200),
        )
        .await
        .unwrap()
        .unwrap();
    let out = stack
        .store
        .append(
            &[NewEvent::new(Event::JobAccepted {
                job: gpusched_model::JobId(42),
            })],
            &lease.fence(),
        )
        .await
        .unwrap();
    assert_eq!(out.last_seq, Some(1));
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The next admission instance takes the lease over and relays it.
    stack.start("admission").expect("admission");
    let client = async_nats::connect(stack::nats_url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let ns = gpusched_bus::Namespace::new(&stack.namespace).unwrap();
    let subject = ns.evt_subject("admission").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let batch = loop {
        if let Ok(stream) = js.get_stream(ns.evt_stream()).await {
            if let Ok(msg) = stream.get_last_raw_message_by_subject(&subject).await {
                match gpusched_bus::decode(&msg.payload).unwrap() {
                    gpusched_bus::Envelope::V1(b) => break b,
                }
            }
        }
        assert!(Instant::now() < deadline, "nothing relayed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((batch.first_seq, batch.last_seq), (1, 1));
    assert!(matches!(batch.events[..], [Event::JobAccepted { .. }]));
    stack::teardown(stack).await;
}

#[test]
fn the_exposition_parser_refuses_what_prometheus_would() {
    let good = "# TYPE a_total counter\na_total{x=\"1\"} 2\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 3\nh_sum 4.5\nh_count 3\n";
    assert_eq!(stack::parse_exposition(good).map(|s| s.len()), Ok(5));
    for bad in [
        "a_total 1\n",                           // no TYPE before it
        "# TYPE a counter\na{x=1} 1\n",          // unquoted label value
        "# TYPE a counter\na one\n",             // no number
        "# TYPE a gauge\n# TYPE a gauge\na 1\n", // two TYPEs
        "# TYPE 1a gauge\n1a 1\n",               // bad name
        "# TYPE h histogram\nh_bucket{le=\"1\"} 3\nh_bucket{le=\"+Inf\"} 2\nh_count 2\n", // not cumulative
        "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_count 3\n", // +Inf != count
    ] {
        assert!(stack::parse_exposition(bad).is_err(), "accepted {bad:?}");
    }
}
