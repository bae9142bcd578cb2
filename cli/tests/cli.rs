//! The `gpusched` client commands against a live stack: `gpusched dev`
//! (every service in one process, simulated nodes) serving the API on a
//! free port. Submit (a command, env, working directory and checkpoint
//! signal included), list, get, explain, cancel, watch, logs, queues, nodes
//! (summary and filters), spec files checked before any request, and the
//! documented exit codes.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpusched_testkit::free_port;

const ADMIN: &str = "cli-test-admin";
const VISION: &str = "cli-test-vision";

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_gpusched")
}

struct Dev {
    child: Child,
    server: String,
    dir: tempdir::Dir,
}

mod tempdir {
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Dev {
    fn start() -> Dev {
        let dir =
            std::env::temp_dir().join(format!("gpusched-cli-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let tokens = dir.join("tokens.toml");
        let mut f = std::fs::File::create(&tokens).unwrap();
        writeln!(
            f,
            "[[tokens]]\nname = \"vision\"\ntenant = \"vision\"\nblake3 = \"{}\"",
            gpusched_gateway::hash_token(VISION)
        )
        .unwrap();
        let port = free_port().unwrap();
        let child = Command::new(bin())
            .args(["dev", "--jobs", "0", "--time-scale", "3600"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("GPUSCHED_ADMIN_TOKEN", ADMIN)
            .env("GPUSCHED_TOKENS_FILE", &tokens)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let dev = Dev {
            child,
            server: format!("http://127.0.0.1:{port}"),
            dir: tempdir::Dir(dir),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while dev.run(ADMIN, &["nodes"]).status.code() != Some(0) {
            assert!(Instant::now() < deadline, "gpusched dev did not serve");
            std::thread::sleep(Duration::from_millis(100));
        }
        // The simulated nodes register shortly after start.
        let ready = |o: Output| {
            serde_json::from_slice::<serde_json::Value>(&o.stdout)
                .ok()
                .and_then(|v| v["summary"]["total"]["ready"].as_u64())
                .unwrap_or(0)
        };
        while ready(dev.run(ADMIN, &["nodes", "--json"])) == 0 {
            assert!(Instant::now() < deadline, "no nodes registered");
            std::thread::sleep(Duration::from_millis(100));
        }
        dev
    }

    fn run(&self, token: &str, args: &[&str]) -> Output {
        let mut c = Command::new(bin());
        c.args(args)
            .env("GPUSCHED_SERVER", &self.server)
            .env_remove("GPUSCHED_CONFIG")
            .env("HOME", &self.dir.0);
        if token.is_empty() {
            c.env_remove("GPUSCHED_TOKEN");
        } else {
            c.env("GPUSCHED_TOKEN", token);
        }
        c.output().unwrap()
    }

    /// Runs and expects exit 0; returns stdout.
    fn ok(&self, token: &str, args: &[&str]) -> String {
        let o = self.run(token, args);
        assert_eq!(
            o.status.code(),
            Some(0),
            "gpusched {args:?}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).to_string()
    }

    fn state(&self, id: u64) -> String {
        let v: serde_json::Value =
            serde_json::from_str(&self.ok(ADMIN, &["get", &id.to_string(), "--json"])).unwrap();
        v["state"].as_str().unwrap().to_string()
    }

    fn wait_state(&self, id: u64, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = self.state(id);
            if s == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "job {id} stayed {s}, wanted {want}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn submitted_id(out: &str) -> u64 {
    out.split_whitespace()
        .find_map(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no job id in {out:?}"))
}

#[test]
fn submit_list_explain_cancel_and_watch_a_job() {
    let dev = Dev::start();
    // A long, checkpointing job from flags, as the tenant.
    let out = dev.ok(
        VISION,
        &[
            "submit",
            "-t",
            "vision",
            "-N",
            "1",
            "-G",
            "8",
            "--checkpoint-interval",
            "600",
            "--checkpoint-duration",
            "60",
            "--max-runtime",
            "360000",
        ],
    );
    assert!(out.starts_with("submitted job "), "{out}");
    let id = submitted_id(&out);

    // A spec file (YAML) with an idempotency key: the same job twice.
    let spec = dev.dir.0.join("job.yaml");
    std::fs::write(
        &spec,
        "tenant: vision\nworkers: 2\ngpus_per_worker: 8\ntopology: block\nmax_runtime_s: 60\n",
    )
    .unwrap();
    let f = spec.to_str().unwrap();
    let first = submitted_id(&dev.ok(VISION, &["submit", "-f", f, "--key", "k1"]));
    let again = dev.ok(VISION, &["submit", "-f", f, "--key", "k1"]);
    assert_eq!(submitted_id(&again), first, "{again}");
    assert!(again.contains("already submitted"), "{again}");
    // TOML and JSON spec files too.
    let toml = dev.dir.0.join("job.toml");
    std::fs::write(
        &toml,
        "tenant = \"vision\"\nworkers = 1\ngpus_per_worker = 1\n",
    )
    .unwrap();
    dev.ok(VISION, &["submit", "-f", toml.to_str().unwrap()]);
    let json = dev.dir.0.join("job.json");
    std::fs::write(
        &json,
        r#"{"tenant": "vision", "workers": 1, "gpus_per_worker": 2}"#,
    )
    .unwrap();
    dev.ok(VISION, &["submit", "-f", json.to_str().unwrap()]);

    dev.wait_state(id, "running");
    let table = dev.ok(VISION, &["list"]);
    let header = table.lines().next().unwrap();
    assert!(
        header.starts_with("JOBID") && header.contains("STATE"),
        "{table}"
    );
    let row = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&id.to_string()))
        .unwrap_or_else(|| panic!("job {id} not listed: {table}"));
    assert!(row.contains("RUNNING") && row.contains("1x8"), "{row}");
    let listed: serde_json::Value =
        serde_json::from_str(&dev.ok(VISION, &["list", "--json", "--state", "running"])).unwrap();
    assert!(listed.as_array().unwrap().iter().any(|j| j["id"] == id));

    let ex = dev.ok(VISION, &["explain", &id.to_string()]);
    assert!(ex.contains("submitted to vision: 1×8 GPUs"), "{ex}");
    assert!(ex.contains("bound to"), "{ex}");

    // Cancel: the running job checkpoints, then its agent stops it.
    let c = dev.ok(VISION, &["cancel", &id.to_string()]);
    assert!(c.contains("cancelling"), "{c}");
    dev.wait_state(id, "cancelled");
    let ex = dev.ok(ADMIN, &["explain", &id.to_string()]);
    let lines: Vec<&str> = ex.lines().collect();
    let req = lines
        .iter()
        .position(|l| l.contains("cancel requested"))
        .unwrap();
    let ck = lines[req..]
        .iter()
        .position(|l| l.contains("checkpoint complete"));
    let stop = lines
        .iter()
        .position(|l| l.contains("stopped by its agent: cancelled"));
    assert!(ck.is_some() && stop.is_some_and(|s| s > req), "{ex}");

    // watch: the job's events from the start, exiting when it ends.
    let w = dev.ok(VISION, &["watch", "--job", &id.to_string(), "--from", "0"]);
    assert!(
        w.contains("job_submitted") && w.contains("job_finished"),
        "{w}"
    );

    let q = dev.ok(VISION, &["queues"]);
    assert!(q.starts_with("TENANT") && q.contains("vision"), "{q}");
    let n = dev.ok(VISION, &["nodes", "-l"]);
    assert!(n.starts_with("NODE") && n.contains("READY"), "{n}");
}

#[test]
fn exit_codes_say_what_went_wrong() {
    let dev = Dev::start();
    let other = submitted_id(&dev.ok(ADMIN, &["submit", "-t", "speech", "-G", "1"]));
    let code = |token: &str, args: &[&str]| {
        let o = dev.run(token, args);
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).to_string(),
        )
    };
    // 3: not found, including another tenant's job.
    assert_eq!(code(VISION, &["get", "999999"]).0, Some(3));
    assert_eq!(code(VISION, &["get", &other.to_string()]).0, Some(3));
    // 4: no token, or a bad one.
    let (c, err) = code("", &["list"]);
    assert_eq!(c, Some(4), "{err}");
    assert!(err.contains("GPUSCHED_TOKEN"), "{err}");
    assert_eq!(code("wrong", &["list"]).0, Some(4));
    // 5: refused, naming the field.
    let (c, err) = code(ADMIN, &["submit", "-t", "nobody", "-G", "1"]);
    assert_eq!(c, Some(5), "{err}");
    assert!(err.contains("tenant"), "{err}");
    let (c, err) = code(
        ADMIN,
        &["submit", "-t", "vision", "-G", "1", "--flavor", "b200"],
    );
    assert_eq!(c, Some(5), "{err}");
    assert!(err.contains("--flavor"), "{err}");
    // 2: a field the model's own check refuses, named by its flag.
    let (c, err) = code(ADMIN, &["submit", "-t", "vision", "-G", "0"]);
    assert_eq!(c, Some(2), "{err}");
    assert!(err.contains("--gpus: must be at least 1"), "{err}");
    // 2: a bad spec file.
    let bad = dev.dir.0.join("bad.yaml");
    std::fs::write(&bad, "tenant: [").unwrap();
    assert_eq!(
        code(ADMIN, &["submit", "-f", bad.to_str().unwrap()]).0,
        Some(2)
    );
    // 6: no server there.
    let o = Command::new(bin())
        .args([
            "list",
            "--server",
            &format!("http://127.0.0.1:{}", free_port().unwrap()),
        ])
        .env("GPUSCHED_TOKEN", ADMIN)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(6));
}

/// Runs the binary against a port nothing listens on: an exit other than
/// 6 means no request was made.
fn offline(args: &[&str]) -> (Option<i32>, String) {
    let o = Command::new(bin())
        .args(args)
        .env(
            "GPUSCHED_SERVER",
            format!("http://127.0.0.1:{}", free_port().unwrap()),
        )
        .env("GPUSCHED_TOKEN", ADMIN)
        .env_remove("GPUSCHED_CONFIG")
        .env("HOME", std::env::temp_dir())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}

#[test]
fn spec_files_and_flags_are_checked_before_any_request() {
    let dir = tempdir::Dir(
        std::env::temp_dir().join(format!("gpusched-spec-{}", uuid::Uuid::new_v4().simple())),
    );
    std::fs::create_dir_all(&dir.0).unwrap();
    // An unknown field in YAML: the file, its line and column, the field.
    let yaml = dir.0.join("job.yaml");
    std::fs::write(&yaml, "tenant: vision\nworkers: 1\nmemory: 80g\n").unwrap();
    let y = yaml.to_str().unwrap();
    let (c, err) = offline(&["submit", "-f", y]);
    assert_eq!(c, Some(2), "{err}");
    assert!(err.contains(&format!("{y}:3:1: ")), "{err}");
    assert!(err.contains("unknown field \"memory\""), "{err}");
    assert!(err.contains("expected one of tenant"), "{err}");
    // A wrong type in TOML: its line, the field and the flag.
    let toml = dir.0.join("job.toml");
    std::fs::write(
        &toml,
        "tenant = \"vision\"\nworkers = 1\ngpus_per_worker = \"8\"\n",
    )
    .unwrap();
    let t = toml.to_str().unwrap();
    let (c, err) = offline(&["submit", "-f", t]);
    assert_eq!(c, Some(2), "{err}");
    assert!(err.contains(&format!("{t}:3:")), "{err}");
    assert!(
        err.contains("gpus_per_worker (--gpus): invalid type"),
        "{err}"
    );
    // A flag fixes nothing about a bad file, but it overrides a good one's
    // field: the file's zero GPUs are refused in the file, the flag's zero
    // by the flag's name.
    let json = dir.0.join("job.json");
    std::fs::write(
        &json,
        r#"{"tenant": "vision", "workers": 1, "gpus_per_worker": 0}"#,
    )
    .unwrap();
    let j = json.to_str().unwrap();
    let (c, err) = offline(&["submit", "-f", j]);
    assert_eq!(c, Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{j}:1:36: gpus_per_worker (--gpus): must be at least 1"
        )),
        "{err}"
    );
    assert_eq!(offline(&["submit", "-f", j, "-G", "2"]).0, Some(6));
    let (c, err) = offline(&["submit", "-t", "vision", "-G", "0"]);
    assert_eq!(c, Some(2), "{err}");
    assert!(err.contains("--gpus: must be at least 1"), "{err}");
    // No tenant anywhere.
    let (c, err) = offline(&["submit", "-G", "1"]);
    assert_eq!(c, Some(2), "{err}");
    assert!(err.contains("--tenant is required"), "{err}");
    // A good spec goes to the server (here: none, so exit 6).
    assert_eq!(offline(&["submit", "-t", "vision", "-G", "1"]).0, Some(6));
    // A bad node status is a usage error naming the flag and the values.
    let (c, err) = offline(&["nodes", "--state", "bogus"]);
    assert_eq!(c, Some(2), "{err}");
    assert!(err.contains("--state") && err.contains("cordoned"), "{err}");
}

#[test]
fn a_jsonl_file_is_read_whole_before_any_request() {
    let dir = tempdir::Dir(
        std::env::temp_dir().join(format!("gpusched-jsonl-{}", uuid::Uuid::new_v4().simple())),
    );
    std::fs::create_dir_all(&dir.0).unwrap();
    let path = dir.0.join("jobs.jsonl");
    let f = path.to_str().unwrap();
    let good = r#"{"tenant": "vision", "workers": 1, "gpus_per_worker": 1}"#;
    // A line that is not JSON: its line and column; nothing is sent.
    std::fs::write(&path, format!("{good}\n\n{good}\n{{\"tenant\": \n")).unwrap();
    let (c, err) = offline(&["submit", "-f", f]);
    assert_eq!(c, Some(2), "{err}");
    assert!(err.contains(&format!("{f}:4:")), "{err}");
    // A line the model's checks refuse: named by line, field and flag.
    std::fs::write(
        &path,
        format!(
            "{good}\n{}\n",
            r#"{"tenant": "vision", "workers": 1, "gpus_per_worker": 0}"#
        ),
    )
    .unwrap();
    let (c, err) = offline(&["submit", "-f", f]);
    assert_eq!(c, Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{f}:2:36: gpus_per_worker (--gpus): must be at least 1"
        )),
        "{err}"
    );
    // A flag over every line mends it; then the file goes to the server.
    assert_eq!(offline(&["submit", "-f", f, "-G", "2"]).0, Some(6));
    std::fs::write(&path, "\n").unwrap();
    let (c, err) = offline(&["submit", "-f", f]);
    assert_eq!(c, Some(2), "{err}");
    assert!(err.contains("no jobs"), "{err}");
}

#[test]
fn a_jsonl_file_submits_each_line_and_names_the_lines_refused() {
    let dev = Dev::start();
    let path = dev.dir.0.join("jobs.jsonl");
    let f = path.to_str().unwrap();
    let job =
        |tenant: &str| format!(r#"{{"tenant": "{tenant}", "workers": 1, "gpus_per_worker": 1}}"#);
    let lines = [
        job("vision"),
        job("vision"),
        job("nobody"),
        String::new(),
        job("vision"),
    ];
    std::fs::write(&path, lines.join("\n")).unwrap();
    let o = dev.run(ADMIN, &["submit", "-f", f, "--key", "b1"]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    );
    assert_eq!(o.status.code(), Some(5), "{out}{err}");
    assert!(
        out.contains(&format!("{f}:3: 400: --tenant: unknown tenant")),
        "{out}"
    );
    assert!(out.contains("submitted 3 jobs"), "{out}");
    assert!(err.contains("1 of 4 jobs were not submitted"), "{err}");
    // Again with the same key: the same jobs, none new.
    let o = dev.run(ADMIN, &["submit", "-f", f, "--key", "b1", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (
            v["created"].as_u64(),
            v["existing"].as_u64(),
            v["failed"].as_u64()
        ),
        (Some(0), Some(3), Some(1)),
        "{v}"
    );
    let lines: Vec<u64> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["line"].as_u64().unwrap())
        .collect();
    assert_eq!(lines, [1, 2, 3, 5]);
    // The jobs are there, once each.
    let listed: serde_json::Value =
        serde_json::from_str(&dev.ok(ADMIN, &["list", "--json"])).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 3, "{listed}");
}

/// The column `name` of a table row, by the header's column starts.
fn column(table: &str, row: &str, name: &str) -> String {
    let header = table.lines().next().unwrap();
    let start = header.find(name).unwrap();
    let end = header[start..]
        .find(|c: char| c.is_whitespace())
        .and_then(|w| {
            header[start + w..]
                .find(|c: char| !c.is_whitespace())
                .map(|n| start + w + n)
        })
        .unwrap_or(row.len());
    row.get(start..end.min(row.len()))
        .unwrap_or("")
        .trim()
        .to_string()
}

#[test]
fn nodes_are_summed_up_and_filtered_and_ended_jobs_keep_their_flavor() {
    let dev = Dev::start();
    let v: serde_json::Value = serde_json::from_str(&dev.ok(VISION, &["nodes", "--json"])).unwrap();
    let nodes = v["nodes"].as_array().unwrap();
    let gpus: u64 = nodes.iter().map(|n| n["gpus"].as_u64().unwrap()).sum();
    assert!(gpus > 0);
    let a100: u64 = nodes
        .iter()
        .filter(|n| n["flavor"] == "a100-40g")
        .map(|n| n["gpus"].as_u64().unwrap())
        .sum();
    assert!(a100 > 0 && a100 < gpus, "the demo cluster has two flavors");

    // The summary by default: its TOTAL is the cluster, its flavor rows add up.
    let sum = dev.ok(VISION, &["nodes"]);
    let total = sum.lines().find(|l| l.starts_with("TOTAL")).unwrap();
    assert_eq!(column(&sum, total, "GPUS"), gpus.to_string(), "{sum}");
    assert_eq!(
        column(&sum, total, "NODES"),
        nodes.len().to_string(),
        "{sum}"
    );
    let flavor_table = sum.split("\n\n").next().unwrap();
    let by_flavor: u64 = flavor_table
        .lines()
        .skip(1)
        .filter(|l| !l.starts_with("TOTAL"))
        .map(|l| column(&sum, l, "GPUS").parse::<u64>().unwrap())
        .sum();
    assert_eq!(by_flavor, gpus, "{sum}");
    assert!(sum.contains("TOPOLOGY"), "{sum}");

    // --flavor keeps that flavor's nodes, in the summary and the list.
    let only = dev.ok(VISION, &["nodes", "--flavor", "a100-40g"]);
    let total = only.lines().find(|l| l.starts_with("TOTAL")).unwrap();
    assert_eq!(column(&only, total, "GPUS"), a100.to_string(), "{only}");
    assert!(!only.contains("h100-80g"), "{only}");
    let list = dev.ok(
        VISION,
        &["nodes", "-l", "--flavor", "a100-40g", "--state", "ready"],
    );
    assert!(list.lines().count() > 1, "{list}");
    assert!(
        list.lines()
            .skip(1)
            .all(|l| l.contains("a100-40g") && l.contains("READY")),
        "{list}"
    );
    let none = dev.ok(VISION, &["nodes", "--json", "--state", "lost"]);
    let none: serde_json::Value = serde_json::from_str(&none).unwrap();
    assert_eq!(none["nodes"].as_array().unwrap().len(), 0);
    let o = dev.run(VISION, &["nodes", "--flavor", "b200"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--flavor") && err.contains("a100-40g"),
        "{err}"
    );

    // An ended job: the flavor it ran on and how long it ran (7200 s at
    // the dev run's 3600× is 2 s of wall time).
    let id = submitted_id(&dev.ok(
        VISION,
        &[
            "submit",
            "-t",
            "vision",
            "-G",
            "1",
            "--flavor",
            "a100-40g",
            "--max-runtime",
            "7200",
        ],
    ));
    dev.wait_state(id, "succeeded");
    let table = dev.ok(VISION, &["list"]);
    let row = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&id.to_string()))
        .unwrap_or_else(|| panic!("job {id} not listed: {table}"));
    assert_eq!(column(&table, row, "STATE"), "SUCCEEDED", "{table}");
    assert_eq!(column(&table, row, "FLAVOR"), "a100-40g", "{table}");
    let time = column(&table, row, "TIME");
    assert!(
        time.contains(':') && time != "0:00" && time != "0:01",
        "{table}"
    );
    // One that named no flavor, of a tenant with two: told from its log.
    let id = submitted_id(&dev.ok(
        VISION,
        &["submit", "-t", "vision", "-G", "1", "--max-runtime", "60"],
    ));
    dev.wait_state(id, "succeeded");
    let out = dev.ok(VISION, &["get", &id.to_string()]);
    let row = out.lines().nth(1).unwrap();
    let flavor = column(&out, row, "FLAVOR");
    assert!(flavor == "a100-40g" || flavor == "h100-80g", "{out}");
    let listed = dev.ok(VISION, &["list"]);
    let row = listed
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&id.to_string()))
        .unwrap();
    assert_eq!(column(&listed, row, "FLAVOR"), flavor, "{listed}");
}

#[test]
fn a_jobs_command_env_workdir_and_signal_go_to_the_server() {
    let dev = Dev::start();
    let get = |id: u64| -> serde_json::Value {
        serde_json::from_str(&dev.ok(VISION, &["get", &id.to_string(), "--json"])).unwrap()
    };
    // From flags: everything after `--` is the command.
    let id = submitted_id(&dev.ok(
        VISION,
        &[
            "submit",
            "-t",
            "vision",
            "-G",
            "1",
            "--env",
            "A=1",
            "--workdir",
            "/tmp",
            "--checkpoint-signal",
            "USR2",
            "--",
            "sh",
            "-c",
            "echo hi",
        ],
    ));
    let spec = &get(id)["spec"];
    assert_eq!(spec["command"], serde_json::json!(["sh", "-c", "echo hi"]));
    assert_eq!(spec["env"], serde_json::json!({"A": "1"}));
    assert_eq!(spec["working_dir"], "/tmp");
    assert_eq!(spec["checkpoint_signal"], "USR2");
    // `get` shows it under the job's row, as a shell would take it, with
    // the env's names only.
    let shown = dev.ok(VISION, &["get", &id.to_string()]);
    assert!(shown.contains("command: sh -c 'echo hi'"), "{shown}");
    assert!(shown.contains("env: A\n"), "{shown}");
    assert!(shown.contains("checkpoint_signal: USR2"), "{shown}");

    // From a YAML spec file, a flag's variable merged into the file's env.
    let yaml = dev.dir.0.join("train.yaml");
    std::fs::write(
        &yaml,
        "tenant: vision\nworkers: 1\ngpus_per_worker: 1\ncommand: [python, train.py]\nenv: {A: \"1\"}\n",
    )
    .unwrap();
    let y = yaml.to_str().unwrap();
    let spec = &get(submitted_id(&dev.ok(VISION, &["submit", "-f", y])))["spec"];
    assert_eq!(spec["command"], serde_json::json!(["python", "train.py"]));
    assert_eq!(spec["env"], serde_json::json!({"A": "1"}));
    assert!(spec.get("working_dir").is_none(), "{spec}");
    let spec = &get(submitted_id(&dev.ok(
        VISION,
        &["submit", "-f", y, "--env", "B=2", "--", "python", "eval.py"],
    )))["spec"];
    assert_eq!(spec["command"], serde_json::json!(["python", "eval.py"]));
    assert_eq!(spec["env"], serde_json::json!({"A": "1", "B": "2"}));

    // Logs: the dev run's simulated agents keep none, so the server's
    // `no_logs` message is told with exit 3, with or without --follow once
    // the job has started.
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(id)["starts"].as_u64().unwrap_or(0) == 0 {
        assert!(Instant::now() < deadline, "job {id} never started");
        std::thread::sleep(Duration::from_millis(100));
    }
    for extra in [&[][..], &["--follow"], &["--err", "--worker", "0"]] {
        let job = id.to_string();
        let args: Vec<&str> = ["logs", job.as_str()]
            .into_iter()
            .chain(extra.iter().copied())
            .collect();
        let o = dev.run(VISION, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "{args:?}: {err}");
        assert!(err.starts_with("error: ") && !err.contains("404:"), "{err}");
        assert!(!err.contains("does not serve job logs"), "{err}");
        assert!(o.stdout.is_empty());
    }
    // A worker the job does not have: refused naming the flag.
    let o = dev.run(VISION, &["logs", &id.to_string(), "--worker", "5"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert!(err.contains("--worker"), "{err}");

    // A job without a command shows none.
    let plain = submitted_id(&dev.ok(VISION, &["submit", "-t", "vision", "-G", "1"]));
    assert!(get(plain)["spec"].get("command").is_none());
    let shown = dev.ok(VISION, &["get", &plain.to_string()]);
    assert!(!shown.contains("command:"), "{shown}");
}

#[test]
fn bad_command_env_and_signal_are_usage_errors_before_any_request() {
    let dir = tempdir::Dir(
        std::env::temp_dir().join(format!("gpusched-run-{}", uuid::Uuid::new_v4().simple())),
    );
    std::fs::create_dir_all(&dir.0).unwrap();
    let base = ["submit", "-t", "vision", "-G", "1"];
    let with = |extra: &[&str]| {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        offline(&args)
    };
    let (c, err) = with(&["--env", "BAD"]);
    assert_eq!(c, Some(2), "{err}");
    assert!(err.contains("--env"), "{err}");
    let (c, err) = with(&["--checkpoint-signal", "SIGKILL"]);
    assert_eq!(c, Some(2), "{err}");
    assert!(err.contains("--checkpoint-signal"), "{err}");
    assert!(err.contains("SIGUSR1") && err.contains("SIGUSR2"), "{err}");
    // Good ones go to the server (here: none, so exit 6).
    let (c, err) = with(&["--env", "A=1", "--checkpoint-signal", "12", "--", "true"]);
    assert_eq!(c, Some(6), "{err}");
    // The command as a string, not a list: the file, line and column.
    let yaml = dir.0.join("job.yaml");
    std::fs::write(
        &yaml,
        "tenant: vision\nworkers: 1\ngpus_per_worker: 1\ncommand: python\n",
    )
    .unwrap();
    let y = yaml.to_str().unwrap();
    let (c, err) = offline(&["submit", "-f", y]);
    assert_eq!(c, Some(2), "{err}");
    assert!(err.contains(&format!("{y}:4:10: command")), "{err}");
    assert!(err.contains("invalid type: string"), "{err}");
    // `logs` needs a job id; with one it asks the server.
    assert_eq!(offline(&["logs"]).0, Some(2));
    assert_eq!(offline(&["logs", "1", "--worker", "x"]).0, Some(2));
    assert_eq!(offline(&["logs", "1", "--err", "--follow"]).0, Some(6));
}

#[test]
fn a_job_array_is_submitted_and_cancelled_as_one() {
    let dev = Dev::start();
    let submit = [
        "submit",
        "-t",
        "vision",
        "-G",
        "1",
        "--max-runtime",
        "360000",
        "--array",
        "0-2,7",
        "--key",
        "arr",
    ];
    let out = dev.ok(VISION, &submit);
    assert!(out.starts_with("submitted array "), "{out}");
    assert!(out.contains("4 tasks"), "{out}");
    let id = submitted_id(&out);
    let tasks = || -> Vec<(u64, u64, String)> {
        let v: serde_json::Value =
            serde_json::from_str(&dev.ok(VISION, &["list", "--json"])).unwrap();
        let mut t: Vec<(u64, u64, String)> = v
            .as_array()
            .unwrap()
            .iter()
            .filter(|j| j["spec"]["array"]["array"] == id)
            .map(|j| {
                (
                    j["spec"]["array"]["index"].as_u64().unwrap(),
                    j["id"].as_u64().unwrap(),
                    j["state"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        t.sort();
        t
    };
    let indices: Vec<u64> = tasks().iter().map(|t| t.0).collect();
    assert_eq!(indices, [0, 1, 2, 7]);
    let again = dev.ok(VISION, &submit);
    assert_eq!(
        again.trim(),
        format!("already submitted with this key: array {id} with 4 tasks")
    );

    dev.wait_state(id, "running");
    let c = dev.ok(VISION, &["cancel", "--array", &id.to_string()]);
    assert!(c.starts_with(&format!("array {id}: ")), "{c}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while tasks().iter().any(|t| t.2 != "cancelled") {
        assert!(Instant::now() < deadline, "{:?}", tasks());
        std::thread::sleep(Duration::from_millis(100));
    }
    // The running one stopped through its agent, after a request.
    let ex = dev.ok(VISION, &["explain", &id.to_string()]);
    assert!(
        ex.contains(&format!("submitted as task 0 of array {id} to vision")),
        "{ex}"
    );
    assert!(ex.contains("cancel requested"), "{ex}");
    let c = dev.ok(VISION, &["cancel", "--array", &id.to_string()]);
    assert!(
        c.contains("0 cancelled, 0 cancelling") && c.contains("4 had ended"),
        "{c}"
    );
    // No such array: not found (exit 3).
    let o = dev.run(VISION, &["cancel", "--array", "999999"]);
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn a_bad_array_is_a_usage_error_before_any_request() {
    for (args, want) in [
        (
            &["submit", "-t", "v", "-G", "1", "--array", "5-1"][..],
            "--array",
        ),
        (
            &["submit", "-t", "v", "-G", "1", "--array", "0-1000"][..],
            "at most 1000",
        ),
        (&["cancel", "--array", "3", "7"][..], "cannot be used with"),
        (&["cancel"][..], "required"),
    ] {
        let (code, err) = offline(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn an_admin_holds_and_releases_a_queue_and_evicts_a_node() {
    let dev = Dev::start();
    // Held: a submission queues and stays there; explain says why.
    assert_eq!(
        dev.ok(ADMIN, &["queues", "hold", "vision"]).trim(),
        "queue vision: held"
    );
    let q = dev.ok(ADMIN, &["queues"]);
    assert_eq!(
        column(
            &q,
            q.lines().find(|l| l.starts_with("vision")).unwrap(),
            "QUEUE"
        ),
        "held",
        "{q}"
    );
    let long = [
        "-t",
        "vision",
        "-N",
        "1",
        "-G",
        "8",
        "--checkpoint-interval",
        "600",
        "--checkpoint-duration",
        "60",
        "--max-runtime",
        "360000",
    ];
    let id = submitted_id(&dev.ok(VISION, &[&["submit"][..], &long].concat()));
    dev.wait_state(id, "queued");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(dev.state(id), "queued");
    let why = dev.ok(VISION, &["explain", &id.to_string()]);
    assert!(why.contains("its queue is held"), "{why}");
    // Only the admin may; a second hold is refused (409: exit 5).
    assert_eq!(
        dev.run(VISION, &["queues", "release", "vision"])
            .status
            .code(),
        Some(4)
    );
    assert_eq!(
        dev.run(ADMIN, &["queues", "hold", "vision"]).status.code(),
        Some(5)
    );
    // Released, it runs.
    assert_eq!(
        dev.ok(ADMIN, &["queues", "release", "vision"]).trim(),
        "queue vision: open"
    );
    dev.wait_state(id, "running");
    // Its node evicted for maintenance: it stops after a checkpoint, runs
    // again elsewhere, and the node stays out of service.
    let v: serde_json::Value =
        serde_json::from_str(&dev.ok(ADMIN, &["get", &id.to_string(), "--json"])).unwrap();
    let node = v["nodes"][0].as_str().unwrap().to_string();
    assert_eq!(
        dev.ok(ADMIN, &["nodes", "evict", &node]).trim(),
        format!("node {node}: evicted")
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v: serde_json::Value =
            serde_json::from_str(&dev.ok(ADMIN, &["get", &id.to_string(), "--json"])).unwrap();
        let elsewhere = v["state"] == "running" && v["nodes"][0].as_str() != Some(node.as_str());
        if elsewhere && v["preemptions"] == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "job {id} did not move off {node}: {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let listed = dev.ok(ADMIN, &["nodes", "-l", "--state", "evicted"]);
    assert!(listed.contains(&node), "{listed}");
    assert_eq!(
        dev.ok(ADMIN, &["nodes", "uncordon", &node]).trim(),
        format!("node {node}: ready")
    );
}

#[test]
fn a_job_waits_on_its_dependencies_and_an_array_runs_within_its_limit() {
    let dev = Dev::start();
    let long = [
        "-t",
        "vision",
        "-N",
        "1",
        "-G",
        "8",
        "--max-runtime",
        "360000",
    ];
    let submit =
        |extra: &[&str]| submitted_id(&dev.ok(VISION, &[&["submit"][..], &long, extra].concat()));
    // One job runs; one waits for it to succeed, one for it to end.
    let first = submit(&[]);
    dev.wait_state(first, "running");
    let ok_after = submit(&["--after-ok", &first.to_string()]);
    let any_after = submit(&["--after", &first.to_string()]);
    dev.wait_state(ok_after, "queued");
    let why = dev.ok(VISION, &["explain", &ok_after.to_string()]);
    assert!(
        why.contains(&format!("waits for job {first} to succeed (after_ok)")),
        "{why}"
    );
    // Cancelled, the first never succeeds: the one after_ok it is cancelled
    // and says why; the one after it runs.
    dev.ok(VISION, &["cancel", &first.to_string()]);
    dev.wait_state(ok_after, "cancelled");
    dev.wait_state(any_after, "running");
    let why = dev.ok(VISION, &["explain", &ok_after.to_string()]);
    assert!(
        why.contains(&format!(
            "job {first}, which it runs after (after_ok), ended"
        )),
        "{why}"
    );
    // Bad dependencies and limits are refused naming the flag.
    for (args, flag) in [
        (vec!["--after-ok", "5,5"], "--after-ok"),
        (vec!["--array", "0-3%0"], "--array"),
    ] {
        let o = dev.run(VISION, &[&["submit"][..], &long, &args].concat());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
    }
    let o = dev.run(
        VISION,
        &[&["submit"][..], &long, &["--after", "999999"]].concat(),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("after") && err.contains("not a job of tenant vision"),
        "{err}"
    );
    // An array limited to one at once: one task runs, the rest say why.
    let out = dev.ok(
        VISION,
        &[&["submit"][..], &long, &["--array", "0-2%1"]].concat(),
    );
    let array = submitted_id(&out);
    dev.wait_state(array, "running");
    let second_task = array + 1;
    dev.wait_state(second_task, "queued");
    let why = dev.ok(VISION, &["explain", &second_task.to_string()]);
    assert!(
        why.contains(&format!(
            "array {array} is at its limit of tasks queued or running at once (%1)"
        )),
        "{why}"
    );
}

#[test]
fn an_admin_sets_a_cohorts_half_life_and_everyone_sees_where_they_stand() {
    let dev = Dev::start();
    let out = dev.ok(
        ADMIN,
        &["cohorts", "set", "research", "--usage-half-life", "6h"],
    );
    assert_eq!(out.trim(), "cohort research: usage half-life 6h");
    // The admin sees every member, in the order borrowed quota goes to them.
    let table = dev.ok(ADMIN, &["cohorts"]);
    let rows: Vec<&str> = table.lines().skip(1).collect();
    assert_eq!(rows.len(), 3, "{table}");
    for tenant in ["vision", "language", "speech"] {
        assert!(
            rows.iter()
                .any(|r| r.contains("research") && r.contains("6h") && r.contains(tenant)),
            "{table}"
        );
    }
    let places: Vec<&str> = rows
        .iter()
        .filter_map(|r| r.split_whitespace().nth(2))
        .collect();
    assert_eq!(places, ["1", "2", "3"], "{table}");
    // A tenant sees its own row only.
    let mine = dev.ok(VISION, &["cohorts"]);
    assert_eq!(mine.lines().count(), 2, "{mine}");
    assert!(mine.contains("vision"), "{mine}");
    // A bad half-life names the flag and sends nothing; a tenant may not set one.
    let o = dev.run(
        ADMIN,
        &["cohorts", "set", "research", "--usage-half-life", "7y"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--usage-half-life") && err.contains("unknown unit"),
        "{err}"
    );
    let o = dev.run(
        VISION,
        &["cohorts", "set", "research", "--usage-half-life", "1h"],
    );
    assert_eq!(
        o.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let json: serde_json::Value =
        serde_json::from_str(&dev.ok(ADMIN, &["cohorts", "--json"])).expect("JSON");
    assert_eq!(json["cohorts"][0]["usage_half_life_s"], 21_600);
}

#[test]
fn an_admin_sets_a_gpu_hour_budget_and_the_queues_show_it() {
    let dev = Dev::start();
    let out = dev.ok(
        ADMIN,
        &[
            "tenants",
            "budget",
            "vision",
            "h100-80g",
            "--gpu-hours",
            "500",
            "--period",
            "week",
            "--when-spent",
            "borrow-only",
        ],
    );
    assert_eq!(
        out.trim(),
        "tenant vision: 500 GPU-hours of h100-80g a week, then borrow-only"
    );
    // Only the rows with a budget say so; the others show `-`.
    let table = dev.ok(VISION, &["queues"]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].trim_end().ends_with("BUDGET"), "{table}");
    let h100 = lines
        .iter()
        .find(|l| l.contains("h100-80g"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(h100.trim_end().ends_with("/500 GPU-h per week"), "{table}");
    let a100 = lines
        .iter()
        .find(|l| l.contains("a100-40g"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(a100.trim_end().ends_with('-'), "{table}");
    let json: serde_json::Value =
        serde_json::from_str(&dev.ok(ADMIN, &["queues", "--json"])).expect("JSON");
    let row = json["queues"]
        .as_array()
        .and_then(|rows| {
            rows.iter()
                .find(|r| r["tenant"] == "vision" && r["flavor"] == "h100-80g")
        })
        .cloned()
        .unwrap_or_default();
    assert_eq!(row["budget"]["when_spent"], "borrow-only", "{json}");
    // Bad flags are named and send nothing; a tenant may not set one; an
    // unknown flavor is 404.
    let o = dev.run(
        ADMIN,
        &[
            "tenants",
            "budget",
            "vision",
            "h100-80g",
            "--gpu-hours",
            "0",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--gpu-hours"), "{err}");
    let o = dev.run(
        ADMIN,
        &[
            "tenants",
            "budget",
            "vision",
            "h100-80g",
            "--gpu-hours",
            "5",
            "--period",
            "year",
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--period"));
    let o = dev.run(
        VISION,
        &[
            "tenants",
            "budget",
            "vision",
            "h100-80g",
            "--gpu-hours",
            "5",
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = dev.run(
        ADMIN,
        &["tenants", "budget", "vision", "b200", "--gpu-hours", "5"],
    );
    assert_ne!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no quota in b200"));
    // Removed: the column goes.
    let out = dev.ok(
        ADMIN,
        &["tenants", "budget", "vision", "h100-80g", "--remove"],
    );
    assert_eq!(out.trim(), "tenant vision: no budget in h100-80g");
    assert!(!dev.ok(ADMIN, &["queues"]).contains("BUDGET"));
}
