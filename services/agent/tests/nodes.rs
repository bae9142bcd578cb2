//! Real jobs through the whole scheduler, each worker a real process: see
//! `common` for the harness.

mod common;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use gpusched_agent::net::NodeNet;
use gpusched_agent::protocol::{status_subject, NodeStatus, WorkerKey, WorkerState, WorkerStatus};
use gpusched_core::Phase;
use gpusched_events::{Event, Outcome};
use gpusched_model::{CheckpointPolicy, JobId};
use gpusched_runtime::read_view;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exit_zero_succeeds_and_exit_three_fails_with_its_code() {
    let c = Cluster::start(vec![tenant("a", 2)], &["n1", "n2"]).await;
    let ok = c
        .submit(job(
            "a",
            1,
            &[("TRAINER_STEPS", "3"), ("TRAINER_STEP_S", "0.05")],
        ))
        .await;
    let bad = c
        .submit(job(
            "a",
            1,
            &[
                ("TRAINER_STEPS", "2"),
                ("TRAINER_STEP_S", "0.05"),
                ("TRAINER_EXIT", "3"),
            ],
        ))
        .await;
    c.wait_phase(ok, Phase::Succeeded).await;
    c.wait_phase(bad, Phase::Failed).await;
    let events = c.events().await;
    match finished(&events, bad) {
        Some(Event::JobFinished { outcome, exits, .. }) => {
            assert_eq!(*outcome, Outcome::Failed);
            assert_eq!(exits.len(), 1);
            assert_eq!(exits[0].code, Some(3));
        }
        other => panic!("no JobFinished for the failing job: {other:?}"),
    }
    assert!(
        c.explain(bad).await.contains("worker 0 exited with code 3"),
        "{}",
        c.explain(bad).await
    );
    // The worker really ran: its output is on its node.
    let out = c.stdout(&c.node_of_finished(ok).await, ok, 1, 0);
    assert!(out.contains("step 3"), "{out}");
    assert!(out.contains("CUDA_VISIBLE_DEVICES=0"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_task_of_an_array_runs_with_its_index_in_its_environment() {
    let c = Cluster::start(vec![tenant("a", 2)], &["n1", "n2"]).await;
    let knobs = [("TRAINER_STEPS", "1"), ("TRAINER_STEP_S", "0.05")];
    let first =
        c.gw.submitter
            .try_submit_array(
                job("a", 1, &knobs),
                gpusched_model::ArraySet {
                    indices: vec![4, 0, 9],
                    max_running: None,
                },
                None,
            )
            .await
            .expect("submitted")
            .job;
    let tasks: Vec<(JobId, u32)> = {
        c.wait_for("the array in the view", |c| {
            read_view(&c.gw.view)
                .state()
                .jobs()
                .filter(|j| j.spec.array.is_some())
                .count()
                == 3
        })
        .await;
        let view = read_view(&c.gw.view);
        view.state()
            .jobs()
            .filter_map(|j| j.spec.array.map(|a| (j.id, a.index, a.array)))
            .inspect(|t| assert_eq!(t.2, first.0, "every task names the first"))
            .map(|(id, index, _)| (id, index))
            .collect()
    };
    let mut indices: Vec<u32> = tasks.iter().map(|t| t.1).collect();
    indices.sort_unstable();
    assert_eq!(indices, [0, 4, 9]);
    for &(id, _) in &tasks {
        c.wait_phase(id, Phase::Succeeded).await;
    }
    for &(id, index) in &tasks {
        let out = c.stdout(&c.node_of_finished(id).await, id, 1, 0);
        assert!(
            out.contains(&format!("GPUSCHED_ARRAY_INDEX={index}\n")),
            "{out}"
        );
        assert!(
            out.contains(&format!("GPUSCHED_ARRAY_ID={}\n", first.0)),
            "{out}"
        );
        assert!(
            out.contains(&format!("GPUSCHED_JOB_ID={}\n", id.0)),
            "{out}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_command_that_cannot_start_fails_the_job_with_the_reason() {
    let c = Cluster::start(vec![tenant("a", 1)], &["n1"]).await;
    let mut spec = job("a", 1, &[]);
    spec.command = vec!["no-such-trainer-binary".into()];
    let id = c.submit(spec).await;
    c.wait_phase(id, Phase::Failed).await;
    let text = c.explain(id).await;
    assert!(text.contains("no-such-trainer-binary"), "{text}");
    assert!(text.contains("not found"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gang_on_two_nodes_shares_fate() {
    let c = Cluster::start(vec![tenant("a", 2)], &["n1", "n2"]).await;
    let id = c
        .submit(job(
            "a",
            2,
            &[("TRAINER_STEPS", "100000"), ("TRAINER_STEP_S", "0.1")],
        ))
        .await;
    c.wait_phase(id, Phase::Running).await;
    let (n0, n1) = (c.node_of(id, 0), c.node_of(id, 1));
    assert_ne!(n0, n1, "one worker per node");
    c.wait_for("both workers printed their env", |c| {
        c.stdout(&n0, id, 1, 0).contains("step 1") && c.stdout(&n1, id, 1, 1).contains("step 1")
    })
    .await;
    let (o0, o1) = (c.stdout(&n0, id, 1, 0), c.stdout(&n1, id, 1, 1));
    assert!(o0.contains("RANK=0") && o1.contains("RANK=1"), "{o0}\n{o1}");
    for o in [&o0, &o1] {
        assert!(o.contains("WORLD_SIZE=2"), "{o}");
        assert!(o.contains(&format!("MASTER_ADDR={n0}")), "{o}");
        assert!(o.contains("CUDA_VISIBLE_DEVICES=0"), "{o}");
    }
    let port = |o: &str| {
        o.lines()
            .find(|l| l.starts_with("MASTER_PORT="))
            .map(str::to_string)
    };
    assert_eq!(port(&o0), port(&o1));

    // Kill rank 1: the job fails and rank 0 is stopped too.
    let record = |node: &str, rank: u32| -> u32 {
        let p = c
            .dir
            .path()
            .join(node)
            .join("state/workers")
            .join(format!("{}-1-{rank}.json", id.0));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(p).expect("worker record"))
                .expect("record json");
        v["pid"].as_u64().expect("pid") as u32
    };
    let (pid0, pid1) = (record(&n0, 0), record(&n1, 1));
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid1.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    c.wait_phase(id, Phase::Failed).await;
    let events = c.events().await;
    match finished(&events, id) {
        Some(Event::JobFinished { exits, .. }) => {
            assert!(
                exits.iter().any(|e| e.rank == 1 && e.signal == Some(9)),
                "{exits:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    c.wait_for("rank 0 stopped", |_| {
        !Path::new(&format!("/proc/{pid0}")).exists()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_reports_are_refused_counted_and_never_appended() {
    let c = Cluster::start(vec![tenant("a", 2)], &["n1", "n2"]).await;
    let id = c
        .submit(job(
            "a",
            1,
            &[("TRAINER_STEPS", "2"), ("TRAINER_STEP_S", "0.05")],
        ))
        .await;
    c.wait_phase(id, Phase::Succeeded).await;
    // Settle: nothing else happens now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = c.events().await.len();
    let refused = c.relay.refused.load(Ordering::Relaxed);
    let other = if c.node_of_finished(id).await == "n1" {
        "n2"
    } else {
        "n1"
    };
    let spec = read_view(&c.gw.view).state().nodes()[read_view(&c.gw.view)
        .state()
        .node_id(other)
        .expect("node")
        .index()]
    .spec
    .clone();
    let forged = |boot: u64, job: u64, run: u32| NodeStatus {
        version: gpusched_agent::protocol::PROTOCOL_VERSION,
        boot,
        spec: spec.clone(),
        workers: vec![WorkerStatus {
            key: WorkerKey { job, run, rank: 0 },
            state: WorkerState::Running {
                pid: 4242,
                started_ms: 0,
            },
            checkpoint: None,
        }],
    };
    let boot = c.boot_of(other);
    for s in [
        forged(boot, 999, 1),      // a job that does not exist
        forged(boot, id.0, 1),     // a job that ran elsewhere and ended
        forged(boot - 1, id.0, 1), // an older registration
    ] {
        c.net
            .publish(
                status_subject(&c.root),
                serde_json::to_vec(&s).expect("json"),
            )
            .await
            .expect("publish");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    c.wait_for("three refusals", |c| {
        c.relay.refused.load(Ordering::Relaxed) >= refused + 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(c.events().await.len(), before, "nothing appended");
    assert_eq!(c.phase(id), Some(Phase::Succeeded));
    assert_eq!(c.nodes_ready(), 2, "no node lost or re-added");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_its_max_runtime_a_job_checkpoints_stops_and_times_out() {
    let c = Cluster::start(vec![tenant("a", 1)], &["n1"]).await;
    let mut spec = job(
        "a",
        1,
        &[("TRAINER_STEPS", "100000"), ("TRAINER_STEP_S", "0.1")],
    );
    spec.max_runtime_s = Some(2);
    spec.checkpoint = Some(CheckpointPolicy {
        interval_s: 3600,
        duration_s: 1,
    });
    let id = c.submit(spec).await;
    c.wait_phase(id, Phase::Failed).await;
    let events = c.events().await;
    match finished(&events, id) {
        Some(Event::JobFinished { outcome, .. }) => assert_eq!(*outcome, Outcome::TimedOut),
        other => panic!("{other:?}"),
    }
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::JobCheckpointed { job, .. } if *job == id)),
        "the job checkpointed before it was stopped"
    );
    assert!(c.explain(id).await.contains("timed out"));
    // The checkpoint the agent asked for before stopping it was timed.
    assert!(c.health["n1"].checkpoints_done() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reclaimed_victim_checkpoints_frees_its_gpus_early_and_resumes_where_it_stopped() {
    let (c, b1, b2, owner) = reclaim(
        &[
            ("TRAINER_STEPS", "80"),
            ("TRAINER_STEP_S", "0.05"),
            ("TRAINER_EXIT_ON_CHECKPOINT", "1"),
        ],
        false,
    )
    .await;
    c.wait_phase(owner, Phase::Succeeded).await;
    let events = c.events().await;
    let (victim, deadline) = victim_of(&events).expect("a preemption was planned");
    assert!(victim == b1 || victim == b2);
    let preempted_at = events
        .iter()
        .find_map(|e| match e {
            Event::JobPreempted { job, at, .. } if *job == victim => Some(*at),
            _ => None,
        })
        .unwrap_or_else(|| panic!("the victim was not preempted:\n{}", dump(&events)));
    assert!(
        preempted_at < deadline,
        "GPUs freed at {preempted_at:?}, before the deadline {deadline:?}"
    );
    // Its checkpoint, written on the signal, is what it resumes from.
    let first_node = events
        .iter()
        .find_map(|e| match e {
            Event::JobBound {
                job, assignments, ..
            } if *job == victim => Some(assignments[0].node),
            _ => None,
        })
        .expect("bound");
    let first_node = read_view(&c.gw.view).state().nodes()[first_node.index()]
        .spec
        .name
        .clone();
    let run1 = c.stdout(&first_node, victim, 1, 0);
    let k: u64 = run1
        .lines()
        .find_map(|l| l.strip_prefix("checkpoint step-"))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no checkpoint in run 1:\n{run1}"));
    c.wait_phase(victim, Phase::Succeeded).await;
    assert_eq!(c.run_of(victim), 2);
    let node2 = c.node_of_finished_run(victim, 2).await;
    let run2 = c.stdout(&node2, victim, 2, 0);
    assert_eq!(resumed_at(&run2), Some(k), "{run2}");
    assert!(run2.contains(&format!("step {}", k + 1)), "{run2}");
    assert!(!run2.contains("step 1\n") || k == 0, "{run2}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_victim_that_ignores_the_signal_is_killed_at_the_deadline_and_resumes_from_its_last_complete_checkpoint(
) {
    let (c, b1, b2, owner) = reclaim(
        &[
            ("TRAINER_STEPS", "200"),
            ("TRAINER_STEP_S", "0.05"),
            ("TRAINER_CHECKPOINT_EVERY", "10"),
            ("TRAINER_CHECKPOINT_UNTIL", "10"),
            ("TRAINER_IGNORE_SIGNAL", "1"),
            ("TRAINER_IGNORE_TERM", "1"),
        ],
        true,
    )
    .await;
    // A half-written checkpoint (no marker) of each borrower, from a crash.
    for j in [b1, b2] {
        let d = c
            .dir
            .path()
            .join(format!("checkpoints/job-{}/step-999", j.0));
        std::fs::create_dir_all(&d).expect("half checkpoint");
        std::fs::write(d.join("state"), "999").expect("half checkpoint");
    }
    c.wait_phase(owner, Phase::Succeeded).await;
    let events = c.events().await;
    let (victim, deadline) = victim_of(&events).expect("a preemption was planned");
    let preempted_at = events
        .iter()
        .find_map(|e| match e {
            Event::JobPreempted { job, at, .. } if *job == victim => Some(*at),
            _ => None,
        })
        .unwrap_or_else(|| panic!("the victim was not preempted:\n{}", dump(&events)));
    assert!(
        preempted_at >= deadline,
        "stopped only at its deadline:\n{}",
        dump(&events)
    );
    c.wait_for("the victim's second run", |c| c.run_of(victim) == 2)
        .await;
    let node2 = c.node_of_finished_run(victim, 2).await;
    c.wait_for("the second run resumed", |c| {
        resumed_at(&c.stdout(&node2, victim, 2, 0)).is_some()
    })
    .await;
    let run2 = c.stdout(&node2, victim, 2, 0);
    let k = resumed_at(&run2).unwrap_or_else(|| panic!("did not resume:\n{run2}"));
    assert_eq!(k, 10, "resumed from its last marked checkpoint: {run2}");
    assert!(!run2.contains("step-999"), "{run2}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_agent_loses_its_node_the_job_resumes_elsewhere_and_the_restarted_agent_kills_the_orphan(
) {
    let mut c = Cluster::start(vec![tenant("a", 2)], &["n1", "n2"]).await;
    let id = c
        .submit(checkpointing(job(
            "a",
            1,
            &[
                ("TRAINER_STEPS", "100000"),
                ("TRAINER_STEP_S", "0.05"),
                ("TRAINER_CHECKPOINT_EVERY", "10"),
            ],
        )))
        .await;
    c.wait_phase(id, Phase::Running).await;
    let first = c.node_of(id, 0);
    c.wait_for("a complete checkpoint", |c| {
        read_view(&c.gw.view)
            .state()
            .job(id)
            .is_some_and(|j| j.last_checkpoint.is_some())
    })
    .await;
    let orphan = c.pid_of(&first, id, 1, 0).expect("worker record");
    c.stop_agent(&first);
    c.wait_for("the node lost", |c| {
        read_view(&c.gw.view)
            .state()
            .node_id(&first)
            .is_some_and(|n| {
                read_view(&c.gw.view).state().nodes()[n.index()].status
                    == gpusched_core::NodeStatus::Lost
            })
    })
    .await;
    c.wait_for("the job running again elsewhere", |c| {
        c.phase(id) == Some(Phase::Running) && c.run_of(id) == 2
    })
    .await;
    let second = c.node_of(id, 0);
    assert_ne!(second, first);
    c.wait_for("run 2 resumed", |c| {
        resumed_at(&c.stdout(&second, id, 2, 0)).is_some()
    })
    .await;
    assert!(
        Path::new(&format!("/proc/{orphan}")).exists(),
        "the orphan runs until its agent is back"
    );
    c.start_agent(&first);
    c.wait_for("the orphan killed", |_| {
        !Path::new(&format!("/proc/{orphan}")).exists()
    })
    .await;
    c.wait_for("the node back", |c| c.nodes_ready() == 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sigkilled_agent_process_loses_its_node_and_its_restart_kills_the_orphan() {
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let client = gpusched_bus::async_nats::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("NATS at {url} is needed for this test: {e}"));
    let root = format!("nodes{}", std::process::id());
    let mut c = Cluster::start_on(vec![tenant("a", 2)], &[], NodeNet::Nats(client), &root).await;
    let mut agent = agent_process(&c, "p1", &url);
    c.wait_for("the process agent registered", |c| c.nodes_ready() == 1)
        .await;
    let id = c
        .submit(checkpointing(job(
            "a",
            1,
            &[
                ("TRAINER_STEPS", "100000"),
                ("TRAINER_STEP_S", "0.05"),
                ("TRAINER_CHECKPOINT_EVERY", "10"),
            ],
        )))
        .await;
    c.wait_for("a complete checkpoint", |c| {
        read_view(&c.gw.view)
            .state()
            .job(id)
            .is_some_and(|j| j.last_checkpoint.is_some())
    })
    .await;
    c.start_agent("n2");
    let orphan = c.pid_of("p1", id, 1, 0).expect("worker record");
    agent.kill().expect("SIGKILL the agent");
    let _ = agent.wait();
    c.wait_for("the job resumed on n2", |c| {
        c.run_of(id) == 2 && resumed_at(&c.stdout("n2", id, 2, 0)).is_some()
    })
    .await;
    assert!(
        Path::new(&format!("/proc/{orphan}")).exists(),
        "the orphan outlives its agent"
    );
    let mut again = agent_process(&c, "p1", &url);
    c.wait_for("the orphan killed by the restarted agent", |_| {
        !Path::new(&format!("/proc/{orphan}")).exists()
    })
    .await;
    c.wait_for("p1 back", |c| c.nodes_ready() == 2).await;
    let _ = again.kill();
    let _ = again.wait();
}

/// A real `gpusched-agent node` process over NATS.
fn agent_process(c: &Cluster, name: &str, nats: &str) -> std::process::Child {
    let d = c.dir.path().join(name);
    std::process::Command::new(env!("CARGO_BIN_EXE_gpusched-agent"))
        .args(["node", "--name", name, "--flavor", FLAVOR, "--gpus", "0"])
        .arg("--state-dir")
        .arg(d.join("state"))
        .arg("--log-dir")
        .arg(d.join("logs"))
        .arg("--checkpoint-dir")
        .arg(c.dir.path().join("checkpoints"))
        .args(["--heartbeat-s", "0.3", "--kill-grace-s", "0.5"])
        .args(["--nats-url", nats, "--namespace", &c.root])
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("start gpusched-agent node")
}
