//! Process set-up shared by every service binary: connection flags,
//! tracing (see [`crate::telemetry`]), and the shutdown signal.

use std::time::Duration;

use clap::Args;
use gpusched_bus::Namespace;
use gpusched_store::{EventStore, StoreOptions};
use tokio_util::sync::CancellationToken;

use crate::bus::Bus;
use crate::log::Log;
use crate::telemetry::{init_tracing_with, TelemetryGuard};

/// The `--database-url` flag of every command that reads or writes the
/// event log.
#[derive(Args, Clone, Debug)]
pub struct LogDatabaseArgs {
    /// Postgres holding the event log.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/gpusched"
    )]
    pub database_url: String,
}

/// The `--nats-url` flag of every process on the bus.
#[derive(Args, Clone, Debug)]
pub struct NatsArgs {
    /// NATS server with JetStream.
    #[arg(long, env = "NATS_URL", default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
}

/// Where the log and the bus are, as every service takes them.
#[derive(Args, Clone, Debug)]
pub struct StackArgs {
    /// The event log's database (`--database-url`).
    #[command(flatten)]
    pub log: LogDatabaseArgs,
    /// The bus (`--nats-url`).
    #[command(flatten)]
    pub nats: NatsArgs,
    /// Root of subject and stream names (streams `<ROOT>_EVT`, `<ROOT>_CMD`).
    #[arg(long, env = "GPUSCHED_NAMESPACE", default_value = "gpusched")]
    pub namespace: String,
    /// This instance's name in leases (default: host name and process id).
    #[arg(long, env = "GPUSCHED_INSTANCE")]
    pub instance: Option<String>,
    /// Lease time to live: a standby takes over this long after the active
    /// instance stops, seconds.
    #[arg(long, env = "GPUSCHED_LEASE_TTL_S", default_value_t = 5.0)]
    pub lease_ttl_s: f64,
    /// Run the database migrations on start.
    #[arg(long, env = "GPUSCHED_MIGRATE", default_value_t = true, action = clap::ArgAction::Set)]
    pub migrate: bool,
    /// Create the database named in --database-url if it does not exist
    /// (for a first run on a fresh server; the role needs CREATEDB).
    #[arg(long, env = "GPUSCHED_CREATE_DATABASE")]
    pub create_database: bool,
    /// Deciding services: serve `/healthz` and `/readyz` on this address
    /// (e.g. 127.0.0.1:9090; off unless given). The gateway answers them
    /// on its --listen address.
    #[arg(long, env = "GPUSCHED_HEALTH_LISTEN")]
    pub health_listen: Option<std::net::SocketAddr>,
    /// The gateway and standbys: write a snapshot of the folded state after
    /// this many events since the newest one (0: never write snapshots).
    #[arg(
        long,
        env = "GPUSCHED_SNAPSHOT_EVERY_EVENTS",
        default_value_t = 100_000
    )]
    pub snapshot_every_events: u64,
    /// The gateway and standbys: write a snapshot after this many seconds
    /// since the newest one, when events came since.
    #[arg(long, env = "GPUSCHED_SNAPSHOT_EVERY_S", default_value_t = 300.0)]
    pub snapshot_every_s: f64,
    /// Snapshots kept; older ones are deleted (the log never is).
    #[arg(long, env = "GPUSCHED_SNAPSHOT_KEEP", default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..))]
    pub snapshot_keep: u16,
    /// Start from the newest good snapshot (false: fold the whole log at
    /// every start).
    #[arg(long, env = "GPUSCHED_SNAPSHOT_LOAD", default_value_t = true, action = clap::ArgAction::Set)]
    pub snapshot_load: bool,
}

/// Open connections to the log and the bus.
#[derive(Clone, Debug)]
pub struct Connections {
    /// The log.
    pub log: Log,
    /// The bus.
    pub bus: Bus,
    /// This instance's name.
    pub instance: String,
    /// Lease TTL.
    pub lease_ttl: Duration,
}

impl StackArgs {
    /// The snapshot flags as a policy.
    pub fn snapshot_policy(&self) -> anyhow::Result<crate::snapshots::SnapshotPolicy> {
        if !(self.snapshot_every_s > 0.0 && self.snapshot_every_s.is_finite()) {
            anyhow::bail!("--snapshot-every-s: must be a positive number of seconds");
        }
        Ok(crate::snapshots::SnapshotPolicy {
            every_events: self.snapshot_every_events,
            every: Duration::from_secs_f64(self.snapshot_every_s),
            keep: usize::from(self.snapshot_keep),
            load: self.snapshot_load,
        })
    }

    /// Connects to Postgres (migrating if asked) and NATS.
    pub async fn connect(&self, service: &str) -> anyhow::Result<Connections> {
        use anyhow::Context;
        if self.create_database
            && EventStore::create_database_if_missing(&self.log.database_url)
                .await
                .with_context(|| {
                    format!(
                        "--create-database: cannot create {}",
                        redact_url(&self.log.database_url)
                    )
                })?
        {
            tracing::info!(url = %redact_url(&self.log.database_url), "created the database");
        }
        if !(self.lease_ttl_s > 0.0 && self.lease_ttl_s.is_finite()) {
            anyhow::bail!("--lease-ttl-s: must be a positive number of seconds");
        }
        let lease_ttl = Duration::from_secs_f64(self.lease_ttl_s);
        let store = EventStore::connect_with(&self.log.database_url, store_options(lease_ttl))
            .await
            .with_context(|| {
                format!(
                    "--database-url {}: cannot connect",
                    redact_url(&self.log.database_url)
                )
            })?;
        if self.migrate {
            store.migrate().await.context("running migrations")?;
        }
        let ns = Namespace::new(&self.namespace).context("--namespace")?;
        let bus = Bus::connect_nats(&self.nats.nats_url, ns)
            .await
            .with_context(|| {
                format!(
                    "--nats-url {}: cannot connect",
                    redact_url(&self.nats.nats_url)
                )
            })?;
        let instance = self.instance.clone().unwrap_or_else(|| {
            let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "local".to_string());
            format!("{service}-{host}-{}", std::process::id())
        });
        Ok(Connections {
            log: Log::Postgres(store),
            bus,
            instance,
            lease_ttl,
        })
    }
}

/// `url` with any password in it replaced by `***`, for logs and errors
/// (`postgres://u:secret@h/db` → `postgres://u:***@h/db`).
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return url.to_string();
    };
    let user = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => "***".to_string(),
    };
    format!("{scheme}://{user}@{host}{tail}")
}

/// The store's timeouts for a writer whose lease lives `ttl`: a writer
/// paused inside its append transaction is cut off (idle timeout), and one
/// queued behind it gives up (lock timeout), well within the lease's life,
/// so a standby can take over and the log stays writable.
fn store_options(ttl: Duration) -> StoreOptions {
    let defaults = StoreOptions::default();
    StoreOptions {
        max_connections: 4,
        idle_in_transaction_timeout: Some((ttl / 5).min(Duration::from_secs(1))),
        lock_timeout: Some((ttl * 2 / 5).min(Duration::from_secs(2))),
        ..defaults
    }
}

/// Structured logs to stderr, filtered by `RUST_LOG` (default `info`),
/// and spans over OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (see
/// [`init_tracing_with`]). Hold the guard until the process ends.
pub fn init_tracing(service: &str) -> TelemetryGuard {
    init_tracing_with(service, "info")
}

/// A token cancelled on SIGTERM or Ctrl-C.
pub fn shutdown_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            match signal(SignalKind::terminate()) {
                Ok(mut term) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = tokio::signal::ctrl_c() => {}
                    }
                }
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("shutdown signal received");
        t.cancel();
    });
    token
}

/// What watches a service's loop from outside it, until `shutdown`: the
/// stats file (only when [`crate::stats::STATS_FILE_ENV`] names one) and
/// the health endpoints (only with `--health-listen`). Await the handles
/// after cancelling `shutdown`.
pub fn spawn_observers(
    service: &str,
    health_listen: Option<std::net::SocketAddr>,
    stats: &std::sync::Arc<crate::stats::ServiceStats>,
    shutdown: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    // Stats leave the process only when asked (load tests, operators).
    let writer = std::env::var_os(crate::stats::STATS_FILE_ENV).map(|path| {
        crate::stats::spawn_stats_writer(
            path.into(),
            service.to_string(),
            stats.clone(),
            Duration::from_millis(200),
            shutdown.clone(),
        )
    });
    let health = health_listen.map(|addr| {
        let (service, stats, shutdown) = (service.to_string(), stats.clone(), shutdown.clone());
        tokio::spawn(async move {
            if let Err(e) = crate::health::serve_health(addr, &service, stats, shutdown).await {
                tracing::error!(%addr, error = %e, "--health-listen: cannot serve");
            }
        })
    });
    [writer, health].into_iter().flatten().collect()
}

/// Runs one deciding service process: connects, then runs the decide loop
/// until SIGTERM (the whole `main` of a deciding service).
pub async fn serve<D, F>(service: &str, stack: &StackArgs, make: F) -> anyhow::Result<()>
where
    D: crate::service::Decider,
    F: Fn() -> D,
{
    let _telemetry = init_tracing(service);
    let snapshots = stack.snapshot_policy()?;
    let conns = stack.connect(service).await?;
    let shutdown = shutdown_signal();
    let mut cfg = crate::service::ServiceConfig::new(service, &conns.instance);
    cfg.lease_ttl = conns.lease_ttl;
    cfg.snapshots = snapshots;
    tracing::info!(service, instance = %conns.instance, "starting");
    let stats = std::sync::Arc::new(crate::stats::ServiceStats::default());
    let observers = spawn_observers(service, stack.health_listen, &stats, &shutdown);
    let out =
        crate::service::run_service(conns.log, conns.bus, cfg, make, shutdown.clone(), stats).await;
    shutdown.cancel();
    for task in observers {
        let _ = task.await;
    }
    out
}

/// Cycle limits as the deciding services take them.
#[derive(Args, Clone, Copy, Debug)]
pub struct CycleArgs {
    /// K: queue heads (quota) or admitted jobs (placement) examined per cycle.
    /// Higher than the simulator's 256: a service's cycle ends in an append
    /// under the log's one append lock (70–90 ms an append under a burst), and 1,024
    /// heads a cycle let the pipeline keep up with 10k submissions/s
    /// (docs/loadtest.md, "Cycle size").
    #[arg(long, env = "GPUSCHED_MAX_HEADS", default_value_t = 1024)]
    pub max_heads: usize,
    /// How deep one tenant's queue is searched per cycle.
    #[arg(long, env = "GPUSCHED_MAX_HEADS_PER_TENANT", default_value_t = 64)]
    pub max_heads_per_tenant: usize,
    /// R: blocked jobs holding a reservation at once (0: no reservations, no backfill).
    #[arg(long, env = "GPUSCHED_RESERVATIONS", default_value_t = 4)]
    pub reservations: usize,
}

impl CycleArgs {
    /// The core's cycle limits from these flags.
    pub fn config(&self) -> gpusched_core::CycleConfig {
        gpusched_core::CycleConfig {
            max_heads: self.max_heads.max(1),
            max_heads_per_tenant: self.max_heads_per_tenant.max(1),
            reservations: self.reservations,
            ..gpusched_core::CycleConfig::default()
        }
    }
}

/// Like [`init_tracing`] but warnings only unless `RUST_LOG` says more
/// (for interactive commands with their own progress display).
pub fn init_tracing_quiet(service: &str) -> TelemetryGuard {
    init_tracing_with(service, "warn")
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_never_reach_a_log_line() {
        assert_eq!(
            redact_url("postgres://gpusched:s3cret@db:5432/gpusched?sslmode=require"),
            "postgres://gpusched:***@db:5432/gpusched?sslmode=require"
        );
        assert_eq!(redact_url("nats://tok3n@nats:4222"), "nats://***@nats:4222");
        assert_eq!(
            redact_url("postgres://postgres@127.0.0.1:5432/gpusched"),
            "postgres://***@127.0.0.1:5432/gpusched"
        );
        assert_eq!(redact_url("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        assert_eq!(redact_url("not a url"), "not a url");
    }
}
