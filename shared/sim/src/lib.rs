//! gpusched's simulator: the same scheduling core, in virtual time.
//!
//! Owns: cluster files (`cluster`), workloads from the native CSV, the ITP
//! traces and a synthetic generator (`workload`), the discrete-event loop
//! that plays users and node agents (`engine`), built-in scenarios
//! (`scenario`), and the report (`report`), fair-share and budgets
//! sections included.
//!
//! Must never: make a scheduling decision of its own; every decision comes
//! from `gpusched-core`.

pub mod cluster;
pub mod engine;
pub mod report;
pub mod scenario;
pub mod workload;

pub use cluster::Cluster;
pub use engine::{replay, Progress, SimOptions, Simulator};
pub use report::{Report, ReportOptions};
pub use workload::{Workload, WorkloadItem, WorkloadKind};
