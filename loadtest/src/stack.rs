//! The deployment under test: every service binary as its own process on
//! the real Postgres and NATS, with this run's own database and stream
//! names, all removed at the end.
//!
//! Owns: finding (or building) the service binaries, creating and dropping
//! the run's database, spawning, killing and restarting service processes,
//! reading their peak memory (`VmHWM`) and stats files, and deleting the
//! run's JetStream streams.
//!
//! Must never: touch another database or namespace than the run's own, or
//! leave a process, a database or a stream behind on the normal and the
//! error path.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
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

/// How the processes are started.
#[derive(Clone, Debug)]
pub struct StackOptions {
    /// Maintenance database URL (the run's database is created beside it).
    pub admin_url: String,
    /// NATS server.
    pub nats_url: String,
    /// Cluster file the agent simulates and configures.
    pub cluster_file: PathBuf,
    /// The agent's time scale.
    pub time_scale: f64,
    /// Lease time to live of every service, seconds.
    pub lease_ttl_s: f64,
    /// Where process logs and stats files go.
    pub logs: PathBuf,
    /// Bearer token the gateway is started with.
    pub token: String,
    /// Leave the database (the run's event log) in place at teardown.
    pub keep_log: bool,
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
    next_instance: u32,
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr().context("finding a free port")?.port())
}

/// The directory of the service binaries: next to this executable (or its
/// parent, for a test binary in `deps/`), built with cargo if missing.
pub fn service_binaries(hint: Option<&Path>) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the loadtest executable")?;
    let mut dir = match hint {
        Some(h) => h.to_path_buf(),
        None => exe
            .parent()
            .map(Path::to_path_buf)
            .context("the loadtest executable has no directory")?,
    };
    if dir.ends_with("deps") {
        dir.pop();
    }
    let missing = SERVICES
        .iter()
        .any(|s| !dir.join(format!("gpusched-{s}")).exists());
    if missing {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--workspace", "--bins"]);
        if dir.ends_with("release") {
            cmd.arg("--release");
        } else {
            // Under the test command: the features `cargo test --workspace`
            // resolves (see the CLI's test stack), so nothing shared is
            // compiled again.
            cmd.arg("--tests");
        }
        eprintln!("building the service binaries into {}", dir.display());
        let status = cmd
            .status()
            .context("running cargo build for the services")?;
        if !status.success() {
            bail!("cargo build of the service binaries failed");
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
        .with_context(|| format!("--database-url {url}: does not parse"))?
        .disable_statement_logging();
    opts.connect()
        .await
        .with_context(|| format!("--database-url {url}: cannot connect"))
}

/// Drops the run's database (ending its sessions).
pub async fn drop_database(admin_url: &str, name: &str) -> Result<()> {
    let mut admin = admin_connection(admin_url).await?;
    sqlx::query(AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await
    .with_context(|| format!("dropping database {name}"))?;
    let _ = admin.close().await;
    Ok(())
}

/// Deletes the run's streams.
pub async fn delete_streams(nats_url: &str, namespace: &str) -> Result<()> {
    let client = async_nats::connect(nats_url)
        .await
        .with_context(|| format!("--nats-url {nats_url}: cannot connect"))?;
    let js = async_nats::jetstream::new(client);
    let ns = Namespace::new(namespace).context("namespace")?;
    for s in [ns.evt_stream(), ns.cmd_stream()] {
        // A stream never created is not an error here.
        let _ = js.delete_stream(&s).await;
    }
    Ok(())
}

impl Stack {
    /// Creates the run's database (migrated) and picks its namespace; no
    /// process is started yet. On error nothing is left behind.
    pub async fn create(opts: StackOptions, bin_dir: PathBuf) -> Result<Stack> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let db_name = format!("gpusched_loadtest_{}", &id[..12]);
        let namespace = format!("lt{}", &id[..12]);
        let mut admin = admin_connection(&opts.admin_url).await?;
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {db_name}")))
            .execute(&mut admin)
            .await
            .with_context(|| format!("creating database {db_name}"))?;
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
                return Err(e).context("connecting to and migrating the run's database");
            }
        };
        std::fs::create_dir_all(&opts.logs)
            .with_context(|| format!("creating {}", opts.logs.display()))?;
        let port = free_port()?;
        Ok(Stack {
            opts,
            db_name,
            db_url,
            store,
            namespace,
            http: format!("http://127.0.0.1:{port}"),
            procs: Vec::new(),
            bin_dir,
            next_instance: 0,
        })
    }

    fn args_for(&self, service: &str) -> Vec<String> {
        match service {
            "agent" => vec![
                "--configure".into(),
                "--cluster".into(),
                self.opts.cluster_file.display().to_string(),
                "--time-scale".into(),
                self.opts.time_scale.to_string(),
            ],
            "gateway" => vec![
                "--listen".into(),
                self.http.trim_start_matches("http://").to_string(),
            ],
            _ => Vec::new(),
        }
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
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone().context("log file")?;
        let stats_file = self.opts.logs.join(format!("{files}.stats.json"));
        let child = Command::new(self.bin_dir.join(format!("gpusched-{service}")))
            .args(self.args_for(service))
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
            .with_context(|| format!("starting gpusched-{service}"))?;
        self.procs.push(Proc {
            service: service.to_string(),
            instance: instance.to_string(),
            child,
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

    async fn wait_http(&mut self) -> Result<()> {
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
                    bail!(
                        "gpusched-{} exited at start ({st}); see {}",
                        p.service,
                        p.log.display()
                    );
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the gateway did not come up in 60 s; logs in {}",
                    self.opts.logs.display()
                );
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

    /// SIGKILLs the live instance of `service`, recording its peak memory.
    pub fn kill(&mut self, service: &str) -> Result<String> {
        let p = self
            .procs
            .iter_mut()
            .rev()
            .find(|p| p.service == service && !p.stopped)
            .with_context(|| format!("no live {service} process"))?;
        p.peak_rss_kib = peak_rss_kib(p.child.id());
        p.cpu_s = cpu_seconds(p.child.id());
        p.child
            .kill()
            .with_context(|| format!("SIGKILL {}", p.instance))?;
        let _ = p.child.wait();
        p.stopped = true;
        Ok(p.instance.clone())
    }

    /// SIGKILLs the process of instance `instance`, recording its peak memory.
    pub fn kill_instance(&mut self, instance: &str) -> Result<()> {
        let p = self
            .procs
            .iter_mut()
            .find(|p| p.instance == instance && !p.stopped)
            .with_context(|| format!("no live process {instance}"))?;
        p.peak_rss_kib = peak_rss_kib(p.child.id());
        p.cpu_s = cpu_seconds(p.child.id());
        p.child
            .kill()
            .with_context(|| format!("SIGKILL {instance}"))?;
        let _ = p.child.wait();
        p.stopped = true;
        Ok(())
    }

    /// Sends `kill -<sig>` (e.g. `STOP`, `CONT`) to the live process of
    /// instance `instance`.
    pub fn signal(&self, instance: &str, sig: &str) -> Result<()> {
        let p = self
            .procs
            .iter()
            .find(|p| p.instance == instance && !p.stopped)
            .with_context(|| format!("no live process {instance}"))?;
        if !crate::infra::signal_pid(p.child.id(), sig) {
            bail!("kill -{sig} {instance} failed");
        }
        Ok(())
    }

    /// The live instance holding `service`'s lease (partition `default`),
    /// else the live instance started last.
    pub async fn leader(&self, service: &str) -> Option<String> {
        let holder = self
            .store
            .lease(service, "default")
            .await
            .ok()
            .flatten()
            .map(|l| l.holder);
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

    /// Any service process that exited on its own.
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
                crate::infra::signal_pid(p.child.id(), "CONT");
                let _ = Command::new("kill")
                    .args(["-TERM", &p.child.id().to_string()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
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

    /// Stops every process, deletes the streams and drops the database.
    /// Errors are reported, and every step is tried.
    pub async fn teardown(mut self) -> Result<()> {
        self.stop_all();
        self.store.pool().close().await;
        let streams = delete_streams(&self.opts.nats_url, &self.namespace).await;
        let db = if self.opts.keep_log {
            eprintln!(
                "kept the run's log: DATABASE_URL={} (drop it with: psql {} -c 'DROP DATABASE {}')",
                db_url_for(&self.opts.admin_url, &self.db_name),
                self.opts.admin_url,
                self.db_name
            );
            Ok(())
        } else {
            drop_database(&self.opts.admin_url, &self.db_name).await
        };
        streams.context("deleting the run's streams")?;
        db.context("dropping the run's database")
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        for p in &mut self.procs {
            if !p.stopped {
                let _ = p.child.kill();
                let _ = p.child.wait();
            }
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
