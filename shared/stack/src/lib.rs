//! The deployment as processes: every service binary as its own process
//! over the real Postgres and NATS, with a run's own database and stream
//! names, all removed at the end. The CLI's integration tests and the load
//! test both run it.
//!
//! Owns: finding (or building) the service binaries, creating, migrating
//! and dropping the run's database, spawning, signalling, killing and
//! restarting service processes (each with its log file, stats file and
//! health address), reading their peak memory (`VmHWM`) and CPU time, and
//! deleting the run's JetStream streams.
//!
//! Must never: touch another database or namespace than the run's own, or
//! leave a process, a database or a stream behind on the normal and the
//! error path (`Drop` kills what is still running; `teardown` removes the
//! rest).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use gpusched_bus::{async_nats, Namespace};
use gpusched_runtime::{StatsSnapshot, STATS_FILE_ENV};
use gpusched_store::EventStore;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection};

/// Every service, in start order.
pub const SERVICES: [&str; 6] = [
    "admission",
    "quota",
    "placement",
    "preemption",
    "agent",
    "gateway",
];

/// What went wrong, with what was being done.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {cause}")]
pub struct StackError {
    what: String,
    cause: String,
}

/// A result of this crate.
pub type Result<T> = std::result::Result<T, StackError>;

fn fail(what: impl Into<String>, cause: impl std::fmt::Display) -> StackError {
    StackError {
        what: what.into(),
        cause: cause.to_string(),
    }
}

/// How the processes are started.
#[derive(Clone, Debug)]
pub struct StackOptions {
    /// Maintenance database URL (the run's database is created beside it).
    pub admin_url: String,
    /// NATS server.
    pub nats_url: String,
    /// Cluster file the agent simulates and configures (`None`: its
    /// built-in demo cluster).
    pub cluster_file: Option<PathBuf>,
    /// The agent's time scale.
    pub time_scale: f64,
    /// Lease time to live of every service, seconds.
    pub lease_ttl_s: f64,
    /// Where process logs and stats files go.
    pub logs: PathBuf,
    /// Bearer token the gateway is started with as its admin token.
    pub token: String,
    /// Leave the database (the run's event log) in place at teardown.
    pub keep_log: bool,
    /// Names the run's database `gpusched_<label>_<id>` and its NATS root
    /// `<label><id>` (lowercase letters).
    pub label: String,
}

/// One service process.
#[derive(Debug)]
pub struct Proc {
    /// Service name.
    pub service: String,
    /// Instance name (lease holder).
    pub instance: String,
    /// The process.
    pub child: Child,
    /// Where its `/healthz`, `/readyz` and `/metrics` answer.
    pub health: String,
    /// Its stats file.
    pub stats_file: PathBuf,
    /// Its log (stdout and stderr).
    pub log: PathBuf,
    /// Peak resident memory, KiB, read when it was stopped.
    pub peak_rss_kib: Option<u64>,
    /// CPU time used (user + system), seconds, read when it was stopped.
    pub cpu_s: Option<f64>,
    /// Whether it has been stopped.
    pub stopped: bool,
}

/// The running deployment.
pub struct Stack {
    /// Options it was started with.
    pub opts: StackOptions,
    /// The run's database name.
    pub db_name: String,
    /// The run's database URL.
    pub db_url: String,
    /// The store on the run's database.
    pub store: EventStore,
    /// The run's NATS root.
    pub namespace: String,
    /// The gateway's base URL.
    pub http: String,
    /// Processes started, stopped ones included.
    pub procs: Vec<Proc>,
    bin_dir: PathBuf,
    extra: HashMap<String, Vec<String>>,
    next_instance: u32,
    torn_down: bool,
}

fn free_port() -> Result<u16> {
    gpusched_testkit::free_port().map_err(|e| fail("a free port", e))
}

/// When [`service_binaries`] builds the binaries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Build {
    /// Always (cargo finds them up to date in a second or two): a test
    /// never runs a stale binary against a freshly migrated database.
    Always,
    /// Only when one is missing (the load test, run from a release build).
    IfMissing,
}

/// The directory of the service binaries, `dir` (a `deps/` directory
/// stands for its parent), built with cargo as `build` says.
///
/// The build is `--workspace --bins --tests` (with `--release` in a
/// `release` directory):
/// it resolves features exactly as `cargo test --workspace`, the test
/// command, does, so it reuses every artifact the test build made and only
/// links the binaries; a build of just the service packages would resolve
/// other features and recompile a dozen crates, which the test build would
/// then recompile back.
pub fn service_binaries(dir: &Path, build: Build) -> Result<PathBuf> {
    let mut dir = dir.to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let missing = SERVICES
        .iter()
        .any(|s| !dir.join(format!("gpusched-{s}")).exists());
    if build == Build::Always || missing {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        let mut cmd = Command::new(cargo);
        gpusched_testkit::outside_cargo(&mut cmd);
        cmd.args(["build", "--quiet", "--workspace", "--bins", "--tests"]);
        if dir.ends_with("release") {
            cmd.arg("--release");
        }
        let status = cmd
            .status()
            .map_err(|e| fail("running cargo build for the services", e))?;
        if !status.success() {
            return Err(fail("cargo build of the service binaries", status));
        }
    }
    Ok(dir)
}

fn db_url_for(admin_url: &str, name: &str) -> String {
    let base = admin_url
        .split_once('?')
        .map_or(admin_url, |(b, _)| b)
        .rsplit_once('/')
        .map_or(admin_url, |(base, _)| base);
    format!("{base}/{name}")
}

async fn admin_connection(url: &str) -> Result<PgConnection> {
    let opts = PgConnectOptions::from_str(url)
        .map_err(|e| fail(format!("--database-url {url}: does not parse"), e))?
        .disable_statement_logging();
    opts.connect()
        .await
        .map_err(|e| fail(format!("--database-url {url}: cannot connect"), e))
}

/// Drops the run's database (ending its sessions).
pub async fn drop_database(admin_url: &str, name: &str) -> Result<()> {
    let mut admin = admin_connection(admin_url).await?;
    sqlx::query(AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await
    .map_err(|e| fail(format!("dropping database {name}"), e))?;
    let _ = admin.close().await;
    Ok(())
}

/// Deletes the run's streams.
pub async fn delete_streams(nats_url: &str, namespace: &str) -> Result<()> {
    let client = async_nats::connect(nats_url)
        .await
        .map_err(|e| fail(format!("--nats-url {nats_url}: cannot connect"), e))?;
    let js = async_nats::jetstream::new(client);
    let ns = Namespace::new(namespace).map_err(|e| fail("namespace", e))?;
    for s in [ns.evt_stream(), ns.cmd_stream()] {
        // A stream never created is not an error here.
        let _ = js.delete_stream(&s).await;
    }
    Ok(())
}

pub use gpusched_testkit::signal_pid;

impl Stack {
    /// Creates the run's database (migrated) and picks its namespace; no
    /// process is started yet. On error nothing is left behind.
    pub async fn create(opts: StackOptions, bin_dir: PathBuf) -> Result<Stack> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let db_name = format!("gpusched_{}_{}", opts.label, &id[..12]);
        let namespace = format!("{}{}", opts.label, &id[..12]);
        let mut admin = admin_connection(&opts.admin_url).await?;
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {db_name}")))
            .execute(&mut admin)
            .await
            .map_err(|e| fail(format!("creating database {db_name}"), e))?;
        let _ = admin.close().await;
        let db_url = db_url_for(&opts.admin_url, &db_name);
        let store = async {
            let store = EventStore::connect(&db_url, 4).await?;
            store.migrate().await?;
            Ok::<_, gpusched_store::StoreError>(store)
        }
        .await;
        let store = match store {
            Ok(s) => s,
            Err(e) => {
                let _ = drop_database(&opts.admin_url, &db_name).await;
                return Err(fail("connecting to and migrating the run's database", e));
            }
        };
        let port = free_port()?;
        if let Err(e) = std::fs::create_dir_all(&opts.logs) {
            let _ = drop_database(&opts.admin_url, &db_name).await;
            return Err(fail(format!("creating {}", opts.logs.display()), e));
        }
        Ok(Stack {
            opts,
            db_name,
            db_url,
            store,
            namespace,
            http: format!("http://127.0.0.1:{port}"),
            procs: Vec::new(),
            bin_dir,
            extra: HashMap::new(),
            next_instance: 0,
            torn_down: false,
        })
    }

    /// Adds command-line arguments for every instance of `service`
    /// started from now on.
    pub fn args(&mut self, service: &str, args: &[&str]) {
        self.extra
            .entry(service.to_string())
            .or_default()
            .extend(args.iter().map(|a| a.to_string()));
    }

    fn args_for(&self, service: &str) -> Vec<String> {
        let mut args: Vec<String> = match service {
            "agent" => {
                let mut a = vec!["--configure".to_string()];
                if let Some(c) = &self.opts.cluster_file {
                    a.extend(["--cluster".to_string(), c.display().to_string()]);
                }
                a.extend(["--time-scale".to_string(), self.opts.time_scale.to_string()]);
                a
            }
            "gateway" => vec![
                "--listen".into(),
                self.http.trim_start_matches("http://").to_string(),
            ],
            _ => Vec::new(),
        };
        args.extend(self.extra.get(service).cloned().unwrap_or_default());
        args
    }

    /// Starts one instance of `service` under a new name; returns the name.
    pub fn start(&mut self, service: &str) -> Result<String> {
        self.next_instance += 1;
        let instance = format!("{service}-{}", self.next_instance);
        self.start_named(service, &instance, &instance)
    }

    /// Starts `instance` of `service` again under the same name, as a
    /// supervisor restarts it in place (its files get a new name).
    pub fn restart_in_place(&mut self, service: &str, instance: &str) -> Result<String> {
        self.next_instance += 1;
        let files = format!("{instance}.restart-{}", self.next_instance);
        self.start_named(service, instance, &files)
    }

    fn start_named(&mut self, service: &str, instance: &str, files: &str) -> Result<String> {
        let log = self.opts.logs.join(format!("{files}.log"));
        let out = std::fs::File::create(&log)
            .map_err(|e| fail(format!("creating {}", log.display()), e))?;
        let err = out.try_clone().map_err(|e| fail("log file", e))?;
        let stats_file = self.opts.logs.join(format!("{files}.stats.json"));
        let (health, health_args) = if service == "gateway" {
            (self.http.clone(), Vec::new())
        } else {
            let addr = format!("127.0.0.1:{}", free_port()?);
            (
                format!("http://{addr}"),
                vec!["--health-listen".to_string(), addr],
            )
        };
        let child = Command::new(self.bin_dir.join(format!("gpusched-{service}")))
            .args(self.args_for(service))
            .args(health_args)
            .env("DATABASE_URL", &self.db_url)
            .env("NATS_URL", &self.opts.nats_url)
            .env("GPUSCHED_NAMESPACE", &self.namespace)
            .env("GPUSCHED_INSTANCE", instance)
            .env("GPUSCHED_LEASE_TTL_S", self.opts.lease_ttl_s.to_string())
            .env("GPUSCHED_MIGRATE", "false")
            .env("GPUSCHED_ADMIN_TOKEN", &self.opts.token)
            .env(STATS_FILE_ENV, &stats_file)
            .env(
                "RUST_LOG",
                std::env::var("LOADTEST_SERVICE_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| fail(format!("starting gpusched-{service}"), e))?;
        self.procs.push(Proc {
            service: service.to_string(),
            instance: instance.to_string(),
            child,
            health,
            stats_file,
            log,
            peak_rss_kib: None,
            cpu_s: None,
            stopped: false,
        });
        Ok(instance.to_string())
    }

    /// Starts every service once and waits for the gateway to answer.
    pub async fn start_all(&mut self) -> Result<()> {
        for s in SERVICES {
            self.start(s)?;
        }
        self.wait_http().await
    }

    /// Waits (60 s at most) for the gateway to answer `/healthz`; a
    /// process that exits meanwhile is an error naming its log.
    pub async fn wait_http(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let client = reqwest::Client::new();
        loop {
            if let Ok(r) = client.get(format!("{}/healthz", self.http)).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            for p in &mut self.procs {
                if let Ok(Some(st)) = p.child.try_wait() {
                    let what = format!("gpusched-{} exited at start", p.service);
                    return Err(fail(what, format!("{st}; see {}", p.log.display())));
                }
            }
            if Instant::now() > deadline {
                let logs = self.opts.logs.display();
                return Err(fail(
                    "the gateway did not come up in 60 s",
                    format!("logs in {logs}"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits (60 s at most) until the gateway's queues name `tenant` (the
    /// agent configures its cluster's tenants when it starts): a job for a
    /// tenant not yet configured is rightly refused.
    pub async fn wait_tenant(&self, tenant: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let client = reqwest::Client::new();
        let quoted = format!("\"{tenant}\"");
        loop {
            let r = client
                .get(format!("{}/v1/queues", self.http))
                .bearer_auth(&self.opts.token)
                .send()
                .await;
            if let Ok(r) = r {
                if r.status().is_success() && r.text().await.is_ok_and(|t| t.contains(&quoted)) {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                let logs = self.opts.logs.display();
                let what = format!("tenant {tenant} never showed up");
                return Err(fail(what, format!("logs in {logs}")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The live instance of `service` started last.
    pub fn live(&self, service: &str) -> Option<&Proc> {
        self.procs
            .iter()
            .rev()
            .find(|p| p.service == service && !p.stopped)
    }

    fn live_instance(&mut self, instance: &str) -> Result<&mut Proc> {
        self.procs
            .iter_mut()
            .find(|p| p.instance == instance && !p.stopped)
            .ok_or_else(|| {
                fail(
                    format!("no live process {instance}"),
                    "not started or stopped",
                )
            })
    }

    /// SIGKILLs the live instance of `service` started last, recording its
    /// peak memory; returns its name.
    pub fn kill(&mut self, service: &str) -> Result<String> {
        let instance = self
            .live(service)
            .map(|p| p.instance.clone())
            .ok_or_else(|| {
                fail(
                    format!("no live {service} process"),
                    "none started or all stopped",
                )
            })?;
        self.kill_instance(&instance)?;
        Ok(instance)
    }

    /// SIGKILLs the process of instance `instance`, recording its peak memory.
    pub fn kill_instance(&mut self, instance: &str) -> Result<()> {
        let p = self.live_instance(instance)?;
        p.peak_rss_kib = peak_rss_kib(p.child.id());
        p.cpu_s = cpu_seconds(p.child.id());
        p.child
            .kill()
            .map_err(|e| fail(format!("SIGKILL {instance}"), e))?;
        let _ = p.child.wait();
        p.stopped = true;
        Ok(())
    }

    /// Sends SIGTERM to instance `instance` and waits (20 s at most) for it
    /// to exit; whether it exited 0.
    pub fn terminate(&mut self, instance: &str) -> Result<bool> {
        let p = self.live_instance(instance)?;
        if !signal_pid(p.child.id(), "TERM") {
            return Err(fail(format!("kill -TERM {instance}"), "not delivered"));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match p.child.try_wait() {
                Ok(Some(s)) => {
                    p.stopped = true;
                    return Ok(s.success());
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Ok(None) => return Err(fail(format!("{instance} ignored SIGTERM"), "20 s")),
                Err(e) => return Err(fail(format!("waiting for {instance}"), e)),
            }
        }
    }

    /// Sends `kill -<sig>` (e.g. `STOP`, `CONT`) to the live process of
    /// instance `instance`.
    pub fn signal(&self, instance: &str, sig: &str) -> Result<()> {
        let p = self
            .procs
            .iter()
            .find(|p| p.instance == instance && !p.stopped)
            .ok_or_else(|| {
                fail(
                    format!("no live process {instance}"),
                    "not started or stopped",
                )
            })?;
        if !signal_pid(p.child.id(), sig) {
            return Err(fail(format!("kill -{sig} {instance}"), "not delivered"));
        }
        Ok(())
    }

    /// The instance holding `service`'s lease (partition `default`) and
    /// its epoch, as the log says, whether or not it still runs.
    pub async fn lease_holder(&self, service: &str) -> Option<(String, u64)> {
        let lease = self.store.lease(service, "default").await.ok().flatten()?;
        Some((lease.holder, lease.epoch))
    }

    /// The live instance holding `service`'s lease, else the live instance
    /// started last.
    pub async fn leader(&self, service: &str) -> Option<String> {
        let holder = self.lease_holder(service).await.map(|(h, _)| h);
        let live = |name: &str| {
            self.procs
                .iter()
                .any(|p| p.instance == name && p.service == service && !p.stopped)
        };
        match holder {
            Some(h) if live(&h) => Some(h),
            _ => self.live(service).map(|p| p.instance.clone()),
        }
    }

    /// Every service process that exited on its own since the last call:
    /// (service, instance, exit status). Each is marked stopped.
    pub fn reap(&mut self) -> Vec<(String, String, String)> {
        let mut out = Vec::new();
        for p in &mut self.procs {
            if !p.stopped {
                if let Ok(Some(st)) = p.child.try_wait() {
                    p.stopped = true;
                    out.push((p.service.clone(), p.instance.clone(), st.to_string()));
                }
            }
        }
        out
    }

    /// A service process that exited on its own, if any (marked stopped;
    /// another one that exited too is told by the next call).
    pub fn crashed(&mut self) -> Option<String> {
        for p in &mut self.procs {
            if !p.stopped {
                if let Ok(Some(st)) = p.child.try_wait() {
                    p.stopped = true;
                    return Some(format!(
                        "gpusched-{} ({}) exited: {st}",
                        p.service, p.instance
                    ));
                }
            }
        }
        None
    }

    /// Peak memory and CPU time of every live process now.
    pub fn sample_rss(&mut self) {
        for p in &mut self.procs {
            if !p.stopped {
                if let Some(k) = peak_rss_kib(p.child.id()) {
                    p.peak_rss_kib = Some(k);
                }
                if let Some(c) = cpu_seconds(p.child.id()) {
                    p.cpu_s = Some(c);
                }
            }
        }
    }

    /// Stops every process: SIGTERM, then SIGKILL after 10 s. Records peak
    /// memory first.
    pub fn stop_all(&mut self) {
        self.sample_rss();
        for p in &mut self.procs {
            if !p.stopped {
                // A paused process must run to see its SIGTERM.
                signal_pid(p.child.id(), "CONT");
                signal_pid(p.child.id(), "TERM");
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for p in &mut self.procs {
            if p.stopped {
                continue;
            }
            loop {
                match p.child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    _ => {
                        let _ = p.child.kill();
                        let _ = p.child.wait();
                        break;
                    }
                }
            }
            p.stopped = true;
        }
    }

    /// Stops every process, deletes the streams, drops the database and
    /// removes the logs unless the log is kept. Errors are reported, and
    /// every step is tried.
    pub async fn teardown(mut self) -> Result<()> {
        self.torn_down = true;
        self.stop_all();
        self.store.pool().close().await;
        let streams = delete_streams(&self.opts.nats_url, &self.namespace).await;
        let db = if self.opts.keep_log {
            eprintln!(
                "kept the run's log: DATABASE_URL={} (drop it with: psql {} -c 'DROP DATABASE {}')",
                self.db_url, self.opts.admin_url, self.db_name
            );
            Ok(())
        } else {
            drop_database(&self.opts.admin_url, &self.db_name).await
        };
        streams?;
        db
    }
}

impl Drop for Stack {
    /// Kills what still runs; without a `teardown` (a test that failed,
    /// a load test that stopped on an error), also drops the database and
    /// the streams, on a private runtime: `Drop` cannot await, and the
    /// caller's runtime may be the one blocked here.
    fn drop(&mut self) {
        for p in &mut self.procs {
            if !p.stopped {
                let _ = p.child.kill();
                let _ = p.child.wait();
            }
        }
        if self.torn_down || self.opts.keep_log {
            return;
        }
        let (admin, db) = (self.opts.admin_url.clone(), self.db_name.clone());
        let (nats, ns) = (self.opts.nats_url.clone(), self.namespace.clone());
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| fail("a runtime to clean up on", e))?;
            rt.block_on(async move {
                let streams = delete_streams(&nats, &ns).await;
                drop_database(&admin, &db).await?;
                streams
            })
        })
        .join();
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("warning: cleaning up run {}: {e}", self.db_name),
            Err(_) => eprintln!("warning: cleaning up run {} panicked", self.db_name),
        }
    }
}

/// Peak resident set size of a process, KiB (`VmHWM` in /proc).
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// CPU time a process has used so far (user + system), seconds: fields 14
/// and 15 of `/proc/<pid>/stat`, in clock ticks of 1/100 s (Linux's
/// `USER_HZ` on every architecture it runs on).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count from after its ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

/// A service's last stats snapshot, if it wrote one.
pub fn read_stats(path: &Path) -> Option<StatsSnapshot> {
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_database_sits_beside_the_admin_one() {
        assert_eq!(
            db_url_for("postgres://postgres@127.0.0.1:5432/postgres", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(
            db_url_for("postgres://u@h/postgres?sslmode=disable", "x"),
            "postgres://u@h/x"
        );
    }

    #[test]
    fn own_peak_memory_is_readable() {
        assert!(peak_rss_kib(std::process::id()).is_some_and(|k| k > 0));
    }

    #[test]
    fn reads_the_cpu_time_of_a_process_that_spun() {
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let used = cpu_seconds(std::process::id()).unwrap_or(0.0);
        assert!(used >= 0.1, "300 ms of spinning read as {used} s");
    }
}
