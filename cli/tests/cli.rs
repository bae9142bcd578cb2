//! The `gpusched` client commands against a live stack: `gpusched dev`
//! (every service in one process, simulated nodes) serving the API on a
//! free port. Submit, list, get, explain, cancel, watch, queues, nodes,
//! and the documented exit codes.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const ADMIN: &str = "cli-test-admin";
const VISION: &str = "cli-test-vision";

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_gpusched")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
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
        let port = free_port();
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
        while !String::from_utf8_lossy(&dev.run(ADMIN, &["nodes"]).stdout).contains("READY") {
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
    let n = dev.ok(VISION, &["nodes"]);
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
    let (c, err) = code(ADMIN, &["submit", "-t", "vision", "-G", "0"]);
    assert_eq!(c, Some(5), "{err}");
    assert!(err.contains("gpus_per_worker"), "{err}");
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
            &format!("http://127.0.0.1:{}", free_port()),
        ])
        .env("GPUSCHED_TOKEN", ADMIN)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(6));
}
