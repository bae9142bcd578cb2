//! Positional (binary) forms of model types whose API form skips empty
//! fields, for encodings such as postcard that write fields by position
//! and cannot read back a field that was skipped.
//!
//! Owns: [`job_spec`], a `#[serde(with)]` module that writes every field of
//! a [`JobSpec`](crate::JobSpec) in declaration order (an array task as
//! its three fields, since its API form skips an empty limit). serde's
//! `remote` derive checks the list against the type: a new field fails to
//! compile until it is added here.
//! Must never: be used for JSON (the API's form is the derived one), or
//! change the order of fields already written (snapshots and bus messages
//! depend on it; a new field is added at the end, with a new format
//! version by whoever stores it).

/// A job's spec with every field written, in declaration order.
pub mod job_spec {
    use crate::{ArrayTask, CheckpointPolicy, Gpus, JobId, JobSpec};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;

    /// Every field of [`JobSpec`], none skipped, in declaration order.
    #[derive(Serialize, Deserialize)]
    #[serde(remote = "JobSpec")]
    struct Fields {
        tenant: String,
        priority: i32,
        workers: u32,
        gpus_per_worker: Gpus,
        flavors: Vec<String>,
        topology: String,
        preemptible: bool,
        checkpoint: Option<CheckpointPolicy>,
        max_runtime_s: Option<u64>,
        command: Vec<String>,
        env: BTreeMap<String, String>,
        working_dir: Option<String>,
        checkpoint_signal: Option<String>,
        #[serde(with = "array_task")]
        array: Option<ArrayTask>,
        after_ok: Vec<JobId>,
        after: Vec<JobId>,
    }

    /// Writes every field, in declaration order.
    pub fn serialize<S: Serializer>(spec: &JobSpec, s: S) -> Result<S::Ok, S::Error> {
        Fields::serialize(spec, s)
    }

    /// Reads what [`serialize`] wrote.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<JobSpec, D::Error> {
        Fields::deserialize(d)
    }

    /// An array task as its three fields, the limit written even when empty.
    mod array_task {
        use crate::ArrayTask;
        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        pub fn serialize<S: Serializer>(task: &Option<ArrayTask>, s: S) -> Result<S::Ok, S::Error> {
            task.map(|a| (a.array, a.index, a.max_running)).serialize(s)
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<ArrayTask>, D::Error> {
            let task: Option<(u64, u32, Option<u32>)> = Deserialize::deserialize(d)?;
            Ok(task.map(|(array, index, max_running)| ArrayTask {
                array,
                index,
                max_running,
            }))
        }
    }
}
