//! The OpenAPI contract: schemathesis (`st run … --checks all`) against the
//! real router served on a free 127.0.0.1 port, over the embedded log, so
//! `/openapi.json` and the handlers cannot drift apart: every status a
//! route answers is documented, every request the document allows is taken
//! and every request it forbids is refused.
//!
//! Needs the schemathesis CLI: `scripts/test-deps` installs it in
//! `target/tools/venv`. This test fails (never skips) without it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpusched_events::Event;
use gpusched_gateway::{serve_on, start, Principal, Tokens};
use gpusched_model::{FlavorQuota, JobSpec, NodeId, NodeSpec, TenantSpec, Timestamp};
use gpusched_runtime::{Bus, Log, MemLog};
use tokio_util::sync::CancellationToken;

const ADMIN: &str = "contract-admin-secret";
const H100: &str = "h100-80g";
/// The examples schemathesis draws per operation and phase.
const MAX_EXAMPLES: &str = "25";
/// Fixed, so a failure reproduces (deterministic generation draws the same
/// cases whatever the seed; the seed pins anything left random).
const SEED: &str = "20240611";
/// A run that has not ended by then is hung (the bounded run takes well
/// under a minute); it is killed and the test fails.
const HUNG_AFTER: Duration = Duration::from_secs(300);

fn tenant(name: &str) -> TenantSpec {
    TenantSpec {
        cohort: Some("research".into()),
        ..TenantSpec::new(name, vec![FlavorQuota::new(H100, 16)])
    }
}

/// Topology, two tenants, 4 nodes × 8 GPUs and a few jobs, so generated
/// ids and names sometimes hit something real.
fn seed_events() -> Vec<Event> {
    let mut events = vec![
        Event::TopologyConfigured {
            levels: vec!["rack".into(), "block".into()],
        },
        Event::TenantConfigured {
            spec: tenant("vision"),
        },
        Event::TenantConfigured {
            spec: tenant("speech"),
        },
    ];
    for i in 0..4u32 {
        events.push(Event::NodeAdded {
            node: NodeId(i),
            spec: NodeSpec::new(
                format!("n{i}"),
                H100,
                8,
                &["rack-0", &format!("block-{}", i / 2)],
            ),
            at: Timestamp(1),
        });
    }
    events
}

fn job(tenant: &str) -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "tenant": tenant, "workers": 1, "gpus_per_worker": 1
    }))
    .unwrap()
}

/// The schemathesis CLI: `$GPUSCHED_SCHEMATHESIS`, else the venv that
/// `scripts/test-deps` makes, else `st` on PATH.
fn schemathesis() -> Result<PathBuf, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let venv = root.join("target/tools/venv/bin/st");
    if let Some(p) = std::env::var_os("GPUSCHED_SCHEMATHESIS").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "GPUSCHED_SCHEMATHESIS={} is not a file; unset it or point it at schemathesis' `st`",
                p.display()
            ))
        };
    }
    if venv.is_file() {
        return Ok(venv);
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|d| d.join("st"))
        .find(|p| p.is_file());
    on_path.ok_or_else(|| {
        format!(
            "schemathesis is missing: no `st` at $GPUSCHED_SCHEMATHESIS, at {} nor on PATH. \
             Install it with `scripts/test-deps` (a Python venv at target/tools/venv with \
             schemathesis; needs python3 with the venv module)",
            venv.display()
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_document_matches_the_handlers() {
    let st = match schemathesis() {
        Ok(st) => st,
        Err(why) => panic!("{why}"),
    };

    let tokens = Tokens::none().with_token(ADMIN, Principal::Admin);
    let shutdown = CancellationToken::new();
    let (gw, _tasks) = start(
        Log::Memory(MemLog::new()),
        Bus::memory(),
        "contract",
        tokens,
        shutdown.clone(),
    );
    let w = gw.submitter.write(seed_events(), None).await.unwrap();
    assert!(gw.caught_up(w.seq).await);
    for t in ["vision", "speech", "vision"] {
        let s = gw.submitter.submit(job(t), None).await.unwrap();
        assert!(gw.caught_up(s.seq).await);
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(serve_on(gw, listener, shutdown.clone()));

    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/contract.toml");
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gateway-contract");
    std::fs::create_dir_all(&work).unwrap();
    let out_path = work.join("st.out");
    let out = std::fs::File::create(&out_path).unwrap();
    let err = out.try_clone().unwrap();
    let mut cmd = Command::new(&st);
    cmd.current_dir(&work)
        .arg("--config-file")
        .arg(&config)
        .arg("--no-color")
        .arg("run")
        .arg(format!("http://{addr}/openapi.json"))
        .args(["-H", &format!("Authorization: Bearer {ADMIN}")])
        .args(["--checks", "all"])
        // `--checks all` overrides the file's `enabled = false`: the one
        // check the API's rules rule out (see contract.toml) is left out
        // here.
        .args(["--exclude-checks", "use_after_free"])
        .args(["--max-examples", MAX_EXAMPLES])
        .args(["--seed", SEED])
        // Deterministic: the same cases every run, and no example database.
        .arg("--generation-deterministic")
        // One worker: hypothesis describes its strategies with `ast.parse`,
        // which CPython 3.11 before 3.11.8 cannot run in two threads at
        // once ("AST constructor recursion depth mismatch", a runtime
        // error that fails the run whatever the gateway does).
        .args(["--workers", "1"])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    let what = format!("{} {:?}", st.display(), cmd.get_args().collect::<Vec<_>>());
    let mut child = cmd.spawn().unwrap_or_else(|e| {
        panic!("cannot run schemathesis ({what}): {e}; reinstall it with scripts/test-deps")
    });
    let status = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if started.elapsed() >= HUNG_AFTER => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("killed after {HUNG_AFTER:?}: it hung"));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(100)),
                Err(e) => return Err(e.to_string()),
            }
        }
    })
    .await
    .unwrap();
    shutdown.cancel();
    let _ = server.await;
    let output = std::fs::read_to_string(&out_path).unwrap_or_default();
    match status {
        Ok(s) if s.success() => {
            // Its closing summary, for the test log.
            let tail: Vec<&str> = output.lines().rev().take(12).collect();
            for l in tail.into_iter().rev() {
                println!("{l}");
            }
        }
        Ok(s) => panic!(
            "schemathesis found the document and the handlers disagree ({s}):\n{what}\n{output}"
        ),
        Err(why) => panic!("schemathesis did not finish ({why}):\n{what}\n{output}"),
    }
}
