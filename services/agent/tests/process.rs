//! The process supervisor with real child processes and real signals
//! (`tests/fixtures/trainer.sh`), each test in its own temp dirs. Waits are
//! bounded polls; nothing asserts a duration.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpusched_agent::process::{
    log_paths, Supervisor, SupervisorConfig, WorkerFact, WorkerKey, WorkerRecord, WorkerReport,
    WorkerSpec, DEFAULT_CHECKPOINT_SIGNAL,
};
use tempfile::TempDir;
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(30);

fn trainer() -> String {
    format!("{}/tests/fixtures/trainer.sh", env!("CARGO_MANIFEST_DIR"))
}

struct Rig {
    dir: TempDir,
    cfg: SupervisorConfig,
    sup: Supervisor,
    rx: mpsc::Receiver<WorkerReport>,
}

impl Rig {
    fn new() -> Self {
        Self::with(|_| {})
    }

    fn with(tune: impl FnOnce(&mut SupervisorConfig)) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut cfg = SupervisorConfig::new(dir.path().join("state"), dir.path().join("logs"));
        cfg.kill_grace = Duration::from_secs(2);
        cfg.checkpoint_poll = Duration::from_millis(50);
        tune(&mut cfg);
        let (tx, rx) = mpsc::channel(1024);
        let sup = Supervisor::new(cfg.clone(), tx);
        Self { dir, cfg, sup, rx }
    }

    fn checkpoint_dir(&self, job: u64) -> PathBuf {
        self.dir.path().join("ck").join(job.to_string())
    }

    /// A trainer worker: rank 0 of 1 with the given trainer knobs.
    fn spec(&self, job: u64, run: u32, knobs: &[(&str, &str)]) -> WorkerSpec {
        WorkerSpec {
            job,
            run,
            rank: 0,
            world_size: 1,
            local_rank: 0,
            gpus: vec![0],
            command: vec!["sh".into(), trainer()],
            env: knobs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            working_dir: None,
            checkpoint_signal: DEFAULT_CHECKPOINT_SIGNAL,
            checkpoint_dir: self.checkpoint_dir(job),
            resume_from: None,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
        }
    }

    fn out_log(&self, key: WorkerKey) -> PathBuf {
        log_paths(&self.cfg.log_dir, key.job, key.run, key.rank).out
    }

    fn record(&self, key: WorkerKey) -> PathBuf {
        self.cfg
            .state_dir
            .join("workers")
            .join(format!("{}-{}-{}.json", key.job, key.run, key.rank))
    }

    async fn next(&mut self) -> WorkerReport {
        tokio::time::timeout(WAIT, self.rx.recv())
            .await
            .expect("a report in time")
            .expect("report channel open")
    }

    /// The pid from the worker's `Started`, which must be its next report.
    async fn started(&mut self, key: WorkerKey) -> u32 {
        let r = self.next().await;
        assert_eq!(r.worker, key);
        match r.fact {
            WorkerFact::Started { pid } => pid,
            other => panic!("expected Started, got {other:?}"),
        }
    }

    /// Every fact about `key` up to and including its `Exited`.
    async fn until_exited(&mut self, key: WorkerKey) -> Vec<WorkerFact> {
        let mut facts = Vec::new();
        loop {
            let r = self.next().await;
            if r.worker != key {
                continue;
            }
            let done = matches!(r.fact, WorkerFact::Exited { .. });
            facts.push(r.fact);
            if done {
                return facts;
            }
        }
    }
}

fn key(job: u64, run: u32) -> WorkerKey {
    WorkerKey { job, run, rank: 0 }
}

fn exited(facts: &[WorkerFact]) -> (Option<i32>, Option<i32>) {
    match facts.last() {
        Some(WorkerFact::Exited { code, signal }) => (*code, *signal),
        other => panic!("expected Exited last, got {other:?}"),
    }
}

fn checkpoints(facts: &[WorkerFact]) -> Vec<(String, PathBuf, u64)> {
    facts
        .iter()
        .filter_map(|f| match f {
            WorkerFact::CheckpointComplete {
                name,
                path,
                progress,
            } => Some((name.clone(), path.clone(), *progress)),
            _ => None,
        })
        .collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Waits until the file holds `needle`; returns its content.
async fn wait_for_text(path: &Path, needle: &str) -> String {
    let until = Instant::now() + WAIT;
    loop {
        let text = read(path);
        if text.contains(needle) {
            return text;
        }
        assert!(
            Instant::now() < until,
            "{} never held {needle:?}; it holds:\n{text}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `pid` runs (a zombie does not count).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rfind(')')
            .and_then(|i| s[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z"),
        Err(_) => false,
    }
}

async fn wait_gone(pid: u32) {
    let until = Instant::now() + WAIT;
    while alive(pid) {
        assert!(Instant::now() < until, "pid {pid} still runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn start_time(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let rest = &s[s.rfind(')').expect("comm") + 1..];
    rest.split_whitespace()
        .nth(19)
        .expect("field 22")
        .parse()
        .expect("number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_are_reported_and_records_removed() {
    let mut rig = Rig::new();
    for (job, code) in [(1u64, "0"), (2, "3")] {
        let spec = rig.spec(
            job,
            1,
            &[
                ("TRAINER_STEPS", "2"),
                ("TRAINER_STEP_S", "0.01"),
                ("TRAINER_EXIT", code),
            ],
        );
        rig.sup.start(spec).await;
        let pid = rig.started(key(job, 1)).await;
        assert!(pid > 1);
        let facts = rig.until_exited(key(job, 1)).await;
        assert_eq!(exited(&facts), (Some(code.parse().expect("code")), None));
        assert!(
            !rig.record(key(job, 1)).exists(),
            "record removed once reaped"
        );
        wait_gone(pid).await;
    }
    assert!(rig.sup.running().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_start_is_ignored() {
    let mut rig = Rig::new();
    let spec = rig.spec(1, 1, &[("TRAINER_STEPS", "3"), ("TRAINER_STEP_S", "0.05")]);
    rig.sup.start(spec.clone()).await;
    rig.sup.start(spec.clone()).await;
    let k = key(1, 1);
    let _ = rig.started(k).await;
    let facts = rig.until_exited(k).await;
    assert!(
        !facts
            .iter()
            .any(|f| matches!(f, WorkerFact::Started { .. })),
        "one Started: {facts:?}"
    );
    rig.sup.start(spec).await;
    assert!(
        rig.rx.try_recv().is_err(),
        "a start after exit is ignored too"
    );
    assert!(rig.sup.running().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_sees_its_environment() {
    let mut rig = Rig::new();
    let mut spec = rig.spec(
        42,
        3,
        &[
            ("TRAINER_STEPS", "1"),
            ("TRAINER_STEP_S", "0.01"),
            ("TRAINER_TAG", "hello"),
        ],
    );
    spec.rank = 1;
    spec.world_size = 4;
    spec.local_rank = 1;
    spec.gpus = vec![2, 3];
    spec.master_addr = "10.0.0.1".into();
    spec.master_port = 29501;
    // The supervisor's variables win over the spec's.
    for (k, v) in [
        ("RANK", "99"),
        ("CUDA_VISIBLE_DEVICES", "7"),
        ("GPUSCHED_JOB_ID", "1"),
        ("GPUSCHED_RESUME_FROM", "/nope"),
    ] {
        spec.env.insert(k.into(), v.into());
    }
    let k = WorkerKey {
        job: 42,
        run: 3,
        rank: 1,
    };
    rig.sup.start(spec).await;
    let _ = rig.started(k).await;
    let facts = rig.until_exited(k).await;
    assert_eq!(exited(&facts), (Some(0), None));
    let log = read(&rig.out_log(k));
    assert!(rig.out_log(k).ends_with("logs/42/3-1.out"));
    let lines: Vec<&str> = log.lines().collect();
    let ck = format!(
        "GPUSCHED_CHECKPOINT_DIR={}",
        rig.checkpoint_dir(42).display()
    );
    for want in [
        "RANK=1",
        "WORLD_SIZE=4",
        "LOCAL_RANK=1",
        "CUDA_VISIBLE_DEVICES=2,3",
        "MASTER_ADDR=10.0.0.1",
        "MASTER_PORT=29501",
        "GPUSCHED_JOB_ID=42",
        "GPUSCHED_RUN=3",
        ck.as_str(),
        "TRAINER_TAG=hello",
    ] {
        assert!(lines.contains(&want), "log lacks {want:?}:\n{log}");
    }
    assert!(
        !lines.iter().any(|l| l.starts_with("GPUSCHED_RESUME_FROM=")),
        "no resume variable when not resuming:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requested_checkpoint_is_reported_once_with_its_progress() {
    let mut rig = Rig::new();
    let k = key(7, 1);
    rig.sup
        .start(rig.spec(
            7,
            1,
            &[("TRAINER_STEP_S", "0.05"), ("TRAINER_STEPS", "100000")],
        ))
        .await;
    let _ = rig.started(k).await;
    wait_for_text(&rig.out_log(k), "step 2\n").await;
    assert_eq!(rig.sup.request_checkpoint(7, 1), 1);
    let r = rig.next().await;
    let WorkerFact::CheckpointComplete {
        name,
        path,
        progress,
    } = r.fact
    else {
        panic!("expected a checkpoint, got {r:?}");
    };
    assert!(progress >= 2);
    assert_eq!(name, format!("step-{progress}"));
    assert_eq!(path, rig.checkpoint_dir(7).join(&name));
    assert_eq!(read(&path.join("COMPLETE")).trim(), progress.to_string());
    // Several polls later, and after the exit's last look: still once.
    let later = format!("step {}\n", progress + 5);
    wait_for_text(&rig.out_log(k), &later).await;
    rig.sup.kill(7, 1);
    let facts = rig.until_exited(k).await;
    assert_eq!(checkpoints(&facts), vec![], "reported again: {facts:?}");
    assert_eq!(exited(&facts), (None, Some(15)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_without_marker_is_never_reported() {
    let mut rig = Rig::new();
    let k = key(8, 1);
    let knobs = [
        ("TRAINER_HALF_CHECKPOINT", "1"),
        ("TRAINER_EXIT_ON_CHECKPOINT", "1"),
        ("TRAINER_STEP_S", "0.05"),
    ];
    rig.sup.start(rig.spec(8, 1, &knobs)).await;
    let _ = rig.started(k).await;
    wait_for_text(&rig.out_log(k), "step 1\n").await;
    assert_eq!(rig.sup.request_checkpoint(8, 1), 1);
    let facts = rig.until_exited(k).await;
    assert_eq!(exited(&facts), (Some(0), None));
    assert_eq!(checkpoints(&facts), vec![]);
    let dirs: Vec<_> = std::fs::read_dir(rig.checkpoint_dir(8))
        .expect("checkpoint dir")
        .filter_map(|e| e.ok())
        .collect();
    assert_eq!(dirs.len(), 1, "the half checkpoint was written");
    assert!(dirs[0].path().join("state").exists());
    assert!(!dirs[0].path().join("COMPLETE").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_run_continues_from_the_checkpoint() {
    let mut rig = Rig::new();
    let first = key(9, 1);
    let knobs = [
        ("TRAINER_EXIT_ON_CHECKPOINT", "1"),
        ("TRAINER_STEP_S", "0.05"),
    ];
    rig.sup.start(rig.spec(9, 1, &knobs)).await;
    let _ = rig.started(first).await;
    wait_for_text(&rig.out_log(first), "step 2\n").await;
    rig.sup.request_checkpoint(9, 1);
    let facts = rig.until_exited(first).await;
    assert_eq!(exited(&facts), (Some(0), None));
    let made = checkpoints(&facts);
    let [(_, path, k)] = &made[..] else {
        panic!("one checkpoint expected: {facts:?}");
    };
    let (path, k) = (path.clone(), *k);

    let second = key(9, 2);
    let total = (k + 3).to_string();
    let mut spec = rig.spec(
        9,
        2,
        &[
            ("TRAINER_STEPS", total.as_str()),
            ("TRAINER_STEP_S", "0.01"),
        ],
    );
    spec.resume_from = Some(path.clone());
    rig.sup.start(spec).await;
    let _ = rig.started(second).await;
    let facts = rig.until_exited(second).await;
    assert_eq!(exited(&facts), (Some(0), None));
    assert_eq!(
        checkpoints(&facts),
        vec![],
        "the resumed-from checkpoint is not reported again"
    );
    let log = read(&rig.out_log(second));
    assert!(log
        .lines()
        .any(|l| l == format!("GPUSCHED_RESUME_FROM={}", path.display())));
    let first_step = log
        .lines()
        .find(|l| l.starts_with("step "))
        .expect("a step");
    assert_eq!(first_step, format!("step {}", k + 1), "log:\n{log}");
    assert!(log.contains(&format!("done after step {}", k + 3)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_ignoring_signals_is_killed_after_the_deadline() {
    let mut rig = Rig::new();
    let k = key(10, 1);
    let knobs = [
        ("TRAINER_IGNORE_SIGNAL", "1"),
        ("TRAINER_IGNORE_TERM", "1"),
        ("TRAINER_STEP_S", "0.05"),
    ];
    rig.sup.start(rig.spec(10, 1, &knobs)).await;
    let pid = rig.started(k).await;
    wait_for_text(&rig.out_log(k), "step 1\n").await;
    assert_eq!(
        rig.sup.request_checkpoint(10, 1),
        1,
        "the signal is delivered, and ignored"
    );
    rig.sup
        .stop_by(10, 1, Instant::now() + Duration::from_millis(100));
    let facts = rig.until_exited(k).await;
    assert_eq!(exited(&facts), (None, Some(9)), "SIGKILL ended it");
    assert_eq!(checkpoints(&facts), vec![]);
    assert!(
        read(&rig.out_log(k)).contains("sigterm ignored"),
        "SIGTERM came first"
    );
    wait_gone(pid).await;
    let made = std::fs::read_dir(rig.checkpoint_dir(10))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(made, 0);
    assert!(rig.sup.running().is_empty());
}

fn child_pid(log: &str) -> u32 {
    log.lines()
        .find_map(|l| l.strip_prefix("child_pid="))
        .expect("child_pid line")
        .trim()
        .parse()
        .expect("pid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_worker_kills_its_whole_process_group() {
    let mut rig = Rig::new();
    let k = key(11, 1);
    rig.sup
        .start(rig.spec(11, 1, &[("TRAINER_FORK_CHILD", "1")]))
        .await;
    let pid = rig.started(k).await;
    let log = wait_for_text(&rig.out_log(k), "step 1\n").await;
    let child = child_pid(&log);
    assert!(alive(child));
    assert_eq!(rig.sup.running(), vec![k]);
    rig.sup.kill(11, 1);
    let facts = rig.until_exited(k).await;
    assert_eq!(exited(&facts), (None, Some(15)));
    wait_gone(pid).await;
    wait_gone(child).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_worker_forked_dies_when_it_exits() {
    let mut rig = Rig::new();
    let k = key(12, 1);
    let knobs = [
        ("TRAINER_FORK_CHILD", "1"),
        ("TRAINER_STEPS", "3"),
        ("TRAINER_STEP_S", "0.05"),
    ];
    rig.sup.start(rig.spec(12, 1, &knobs)).await;
    let _ = rig.started(k).await;
    let facts = rig.until_exited(k).await;
    assert_eq!(exited(&facts), (Some(0), None));
    wait_gone(child_pid(&read(&rig.out_log(k)))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chatty_worker_keeps_its_log_under_twice_the_cap() {
    let cap = 4096;
    let mut rig = Rig::with(|c| {
        c.log_cap_bytes = cap;
        c.checkpoint_poll = Duration::from_millis(20);
    });
    let k = key(13, 1);
    let knobs = [
        ("TRAINER_CHATTY", "50"),
        ("TRAINER_STEPS", "40"),
        ("TRAINER_STEP_S", "0.01"),
    ];
    rig.sup.start(rig.spec(13, 1, &knobs)).await;
    let _ = rig.started(k).await;
    let facts = rig.until_exited(k).await;
    assert_eq!(exited(&facts), (Some(0), None));
    let paths = log_paths(&rig.cfg.log_dir, 13, 1, 0);
    let live = std::fs::metadata(&paths.out).expect("out log").len();
    let old = std::fs::metadata(&paths.out_rotated)
        .expect("rotated log")
        .len();
    assert!(live <= cap, "live log {live} bytes");
    assert!(old <= cap, "rotated log {old} bytes");
    // The trainer wrote ~200 KB; the tail is what is kept.
    let kept = read(&paths.out_rotated) + &read(&paths.out);
    assert!(kept.contains("done after step 40"), "the tail is kept");
    assert!(!kept.contains("step 1\n"), "the head is gone");
}

/// A change to a spec.
type Edit = dyn Fn(&mut WorkerSpec);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_cannot_start_is_reported_in_words() {
    let mut rig = Rig::new();
    let plain = rig.dir.path().join("plain.txt");
    std::fs::write(&plain, "echo hi\n").expect("write");
    let cases: Vec<(u64, Box<Edit>, &str)> = vec![
        (
            1,
            Box::new(|s| s.command = vec!["trainr-not-installed".into()]),
            "command \"trainr-not-installed\" not found on PATH",
        ),
        (
            2,
            Box::new(|s| s.working_dir = Some(PathBuf::from("/nonexistent/gpusched/dir"))),
            "working_dir /nonexistent/gpusched/dir does not exist",
        ),
        (
            3,
            Box::new(move |s| s.command = vec![plain.display().to_string()]),
            "is not executable",
        ),
        (4, Box::new(|s| s.command = vec![]), "command is empty"),
    ];
    for (job, edit, want) in cases {
        let mut spec = rig.spec(job, 1, &[]);
        edit(&mut spec);
        rig.sup.start(spec).await;
        let r = rig.next().await;
        assert_eq!(r.worker, key(job, 1));
        match r.fact {
            WorkerFact::StartFailed { reason } => {
                assert!(reason.contains(want), "{reason:?} lacks {want:?}")
            }
            other => panic!("expected StartFailed, got {other:?}"),
        }
        assert!(!rig.record(key(job, 1)).exists());
    }
    assert!(rig.sup.running().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_kills_only_unwanted_orphans() {
    let mut rig = Rig::with(|c| c.kill_grace = Duration::from_millis(500));
    let k = key(14, 2);
    rig.sup.start(rig.spec(14, 2, &[])).await;
    let pid = rig.started(k).await;
    wait_for_text(&rig.out_log(k), "step 1\n").await;
    let record: WorkerRecord =
        serde_json::from_str(&read(&rig.record(k))).expect("a worker record");
    assert_eq!(
        (record.job, record.run, record.rank, record.pid, record.pgid),
        (14, 2, 0, pid, pid)
    );
    assert_eq!(record.start_time, start_time(pid));

    // The agent dies without stopping its worker; a new one starts.
    let Rig { dir, cfg, sup, rx } = rig;
    drop(sup);
    let (tx, _rx2) = mpsc::channel(16);
    let mut reborn = Supervisor::new(cfg.clone(), tx);

    let killed = reborn.kill_orphans(&|job, run| (job, run) == (14, 2)).await;
    assert_eq!(killed, Vec::<u32>::new());
    assert!(alive(pid), "a wanted worker is left alone");
    assert!(cfg.state_dir.join("workers/14-2-0.json").exists());

    let killed = reborn.kill_orphans(&|_, _| false).await;
    assert_eq!(killed, vec![pid]);
    wait_gone(pid).await;
    assert!(!cfg.state_dir.join("workers/14-2-0.json").exists());
    drop((dir, rx));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_record_whose_pid_was_reused_is_not_killed() {
    let rig = Rig::new();
    let mut stranger = std::process::Command::new("sleep");
    std::os::unix::process::CommandExt::process_group(&mut stranger, 0);
    let mut stranger = stranger.arg("60").spawn().expect("spawn sleep");
    let pid = stranger.id();
    // A record of pid with another start time: an earlier process that had it.
    let rec = WorkerRecord {
        job: 15,
        run: 1,
        rank: 0,
        pid,
        pgid: pid,
        start_time: start_time(pid) + 1,
        command: vec!["old".into()],
    };
    let file = rig.cfg.state_dir.join("workers/15-1-0.json");
    std::fs::create_dir_all(file.parent().expect("dir")).expect("mkdir");
    std::fs::write(&file, serde_json::to_vec(&rec).expect("json")).expect("write");
    let (tx, _rx) = mpsc::channel(16);
    let mut sup = Supervisor::new(rig.cfg.clone(), tx);
    let killed = sup.kill_orphans(&|_, _| false).await;
    assert_eq!(killed, Vec::<u32>::new());
    assert!(alive(pid), "the stranger is untouched");
    assert!(!file.exists(), "the dead worker's record is removed");
    stranger.kill().expect("kill sleep");
    stranger.wait().expect("reap sleep");
}
