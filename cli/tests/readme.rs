//! The README's blocks work when pasted as is, in order.
//!
//! Every fenced `sh` block of README.md runs, in order, in one bash process
//! started at the repository root, as a newcomer would paste them into one
//! terminal. Two things differ from a newcomer's terminal, and only these:
//! the services' database and stream names (`DATABASE_URL`,
//! `GPUSCHED_NAMESPACE`) are this test's own, removed afterwards; and the
//! test command itself (`scripts/test`) is not run again from inside the
//! test command — this run is it.
//!
//! The blocks build in the dev profile, the one the test command builds,
//! so after `cargo test` they compile nothing of their own: the workspace's
//! one feature set (`gpusched-workspace-hack`) and an environment without
//! what cargo sets for this test keep the artifacts shared.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpusched_bus::async_nats;
use gpusched_store::testing::TestDb;

/// The README's own test command: never run from inside itself.
const TEST_COMMAND: &str = "scripts/test";
/// The README's blocks serve the API on this port.
const README_PORT: u16 = 8080;
/// A cold build included (when run on its own).
const TIME_LIMIT: Duration = Duration::from_secs(30 * 60);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("repository root")
}

/// The `sh` blocks of a Markdown text, in order, each with its first line
/// number.
fn sh_blocks(markdown: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, line) in markdown.lines().enumerate() {
        match &mut current {
            None if line.trim_start() == "```sh" => current = Some((i + 2, String::new())),
            Some(_) if line.trim_start() == "```" => blocks.extend(current.take()),
            Some((_, text)) => {
                text.push_str(line);
                text.push('\n');
            }
            None => {}
        }
    }
    blocks
}

/// One bash script of every block, each announced with its README line, and
/// the test command's line replaced by a note.
fn script(blocks: &[(usize, String)]) -> String {
    let mut s = String::from("set -eo pipefail\n");
    for (line, text) in blocks {
        s.push_str(&format!("echo '=== README.md:{line}'\n"));
        for l in text.lines() {
            let command = l.split('#').next().unwrap_or("").trim();
            if command == TEST_COMMAND {
                s.push_str(&format!(
                    "echo '(skipped: {TEST_COMMAND} is the command running this test)'\n"
                ));
            } else {
                s.push_str(l);
                s.push('\n');
            }
        }
    }
    s
}

#[test]
fn blocks_are_found_and_the_test_command_is_not_rerun() {
    let md = "text\n```sh\na\n  b\n```\n```text\nno\n```\n```sh\nscripts/test   # test\nc\n```\n";
    let blocks = sh_blocks(md);
    assert_eq!(
        blocks,
        vec![
            (3, "a\n  b\n".to_string()),
            (10, "scripts/test   # test\nc\n".into())
        ]
    );
    let s = script(&blocks);
    assert!(s.contains("echo '=== README.md:3'\na\n  b\n"));
    assert!(!s.lines().any(|l| l.starts_with("scripts/test")));
    assert!(s.contains("\nc\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_readme_block_works_as_pasted() {
    let root = repo_root();
    let md = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let blocks = sh_blocks(&md);
    assert!(
        blocks.len() >= 3,
        "README.md has {} sh blocks",
        blocks.len()
    );
    if std::net::TcpListener::bind(("127.0.0.1", README_PORT)).is_err() {
        panic!("port {README_PORT} is in use: the README's blocks serve the API there; stop what holds it");
    }

    let db = TestDb::new().await;
    let namespace = format!("readme{}", uuid::Uuid::new_v4().simple());
    let work = std::env::temp_dir().join(format!("gpusched-{namespace}"));
    std::fs::create_dir_all(&work).expect("work dir");
    let script_path = work.join("readme.sh");
    std::fs::write(&script_path, script(&blocks)).expect("write the script");
    let out_path = work.join("output.log");
    let out = std::fs::File::create(&out_path).expect("output file");

    let mut cmd = Command::new("bash");
    // A newcomer's terminal has none of what cargo sets for this test.
    gpusched_testkit::outside_cargo(&mut cmd);
    cmd.arg(&script_path)
        .current_dir(&root)
        .env("DATABASE_URL", &db.url)
        .env("GPUSCHED_NAMESPACE", &namespace)
        .env("NO_COLOR", "1")
        .env_remove("GPUSCHED_TOKEN")
        .env_remove("GPUSCHED_ADMIN_TOKEN")
        .env_remove("GPUSCHED_SERVER")
        .env_remove("GPUSCHED_TOKENS_FILE")
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("output file"))
        .stderr(out);
    // Its own process group, so every server the blocks start in the
    // background is stopped with it, whatever happens.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().expect("bash");
    let group = child.id();
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for bash") {
            break Some(s);
        }
        if started.elapsed() > TIME_LIMIT {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{group}")])
        .stderr(Stdio::null())
        .status();
    let _ = child.wait();

    if let Ok(client) = async_nats::connect("nats://127.0.0.1:4222").await {
        let js = async_nats::jetstream::new(client);
        let ns = gpusched_bus::Namespace::new(&namespace).expect("namespace");
        let _ = js.delete_stream(ns.evt_stream()).await;
        let _ = js.delete_stream(ns.cmd_stream()).await;
    }
    let mut output = String::new();
    let _ = std::fs::File::open(&out_path).and_then(|mut f| f.read_to_string(&mut output));
    let _ = std::fs::remove_dir_all(&work);

    let ok = status.is_some_and(|s| s.success());
    assert!(
        ok,
        "the README's blocks failed ({}):\n{output}",
        match status {
            Some(s) => format!("bash exited with {s}"),
            None => format!("still running after {TIME_LIMIT:?}"),
        }
    );
    // What the blocks promise a reader shows up.
    for expected in [
        "replay matches:   yes",
        "state_hash: ",
        "HTTP API on http://127.0.0.1:8080",
    ] {
        assert!(
            output.contains(expected),
            "the README's blocks ran but never printed {expected:?}:\n{output}"
        );
    }
}
