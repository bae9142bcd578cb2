//! gpusched runtime: the imperative shell every service shares.
//!
//! Owns: the handles on the event log ([`Log`]: Postgres, or the embedded
//! in-memory log of `gpusched dev`) and on the bus ([`Bus`]: NATS
//! JetStream, or an in-process channel), the [`Projection`] that follows
//! the log in sequence order, the fenced decide loop ([`run_service`]) that
//! turns a pure [`Decider`] into a service, its health and Prometheus
//! endpoints, shutdown, and tracing set-up (with OpenTelemetry export over OTLP and
//! W3C trace context in NATS headers when `OTEL_EXPORTER_OTLP_ENDPOINT` is
//! set: per message, and per job, so that one job's way from submission to
//! binding is one trace across the services).
//!
//! Must never: decide anything itself (deciding is the core's, through a
//! `Decider`), publish a decision before the log has committed it, apply
//! events out of sequence order, or append another service's event kinds.

mod bus;
mod clock;
mod follow;
mod health;
mod job_trace;
mod leader;
mod log;
mod metrics;
mod projection;
mod service;
mod shell;
mod snapshots;
mod stage;
mod stats;
mod telemetry;

pub use bus::{Bus, Feed, Incoming, MessageTrace, NatsBus};
pub use clock::wall_clock;
pub use follow::{follow, read_view, FollowerHealth, SharedView};
pub use health::{health_router, serve_health, STUCK_AFTER};
pub use leader::{is_fenced, Candidate, Leader, LeaseLost, LeaseSpec};
pub use log::{Log, LogPages, LoggedEvent, MemLog};
pub use metrics::{
    counter, family, gauge, histogram_seconds, metrics_route, metrics_text, service_registry,
    Values,
};
pub use projection::{Observer, Projection};
pub use service::{bootstrap_cluster, run_service, Decider, ServiceConfig};
pub use shell::{
    init_tracing, init_tracing_quiet, redact_url, serve, shutdown_signal, spawn_observers,
    Connections, CycleArgs, LogDatabaseArgs, NatsArgs, StackArgs,
};
pub use snapshots::{load_newest, Loaded, SnapshotPolicy, Writer, Written};
pub use stage::DEGRADED_POLL;
pub use stats::Work;
pub use stats::{
    cycle_bucket, cycle_bucket_upper_us, histogram_quantile_us, spawn_stats_writer, CycleHistogram,
    ServiceStats, StatsSnapshot, CYCLE_BUCKETS, STATS_FILE_ENV,
};
pub use telemetry::{
    add_remote_link, current_traceparent, init_tracing_with, parent_context, set_remote_parent,
    span_traceparent, TelemetryGuard, OTLP_ENDPOINT_ENV,
};
