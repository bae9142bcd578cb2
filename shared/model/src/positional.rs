//! Positional (binary) forms of model types whose API form skips empty
//! fields, for encodings such as postcard that write fields by position
//! and cannot read back a field that was skipped.
//!
//! Owns: [`job_spec`], a `#[serde(with)]` module that writes every field of
//! a [`JobSpec`](crate::JobSpec) in declaration order (an array task as
//! its three fields, since its API form skips an empty limit). The destructuring
//! lists every field: a new one fails to compile until it is added here.
//! Must never: be used for JSON (the API's form is the derived one), or
//! change the order of fields already written (snapshots and bus messages
//! depend on it; a new field is added at the end, with a new format
//! version by whoever stores it).

/// A job's spec with every field written, in declaration order.
pub mod job_spec {
    use crate::{ArrayTask, CheckpointPolicy, Gpus, JobId, JobSpec};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;

    type Fields = (
        String,
        i32,
        u32,
        Gpus,
        Vec<String>,
        String,
        bool,
        Option<CheckpointPolicy>,
        Option<u64>,
        Vec<String>,
        BTreeMap<String, String>,
        Option<String>,
        Option<String>,
        Option<(u64, u32, Option<u32>)>,
        Vec<JobId>,
        Vec<JobId>,
    );

    /// Writes every field, in declaration order.
    pub fn serialize<S: Serializer>(spec: &JobSpec, s: S) -> Result<S::Ok, S::Error> {
        let JobSpec {
            tenant,
            priority,
            workers,
            gpus_per_worker,
            flavors,
            topology,
            preemptible,
            checkpoint,
            max_runtime_s,
            command,
            env,
            working_dir,
            checkpoint_signal,
            array,
            after_ok,
            after,
        } = spec;
        (
            tenant,
            priority,
            workers,
            gpus_per_worker,
            flavors,
            topology,
            preemptible,
            checkpoint,
            max_runtime_s,
            command,
            env,
            working_dir,
            checkpoint_signal,
            array.map(|a| (a.array, a.index, a.max_running)),
            after_ok,
            after,
        )
            .serialize(s)
    }

    /// Reads what [`serialize`] wrote.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<JobSpec, D::Error> {
        let (
            tenant,
            priority,
            workers,
            gpus_per_worker,
            flavors,
            topology,
            preemptible,
            checkpoint,
            max_runtime_s,
            command,
            env,
            working_dir,
            checkpoint_signal,
            array,
            after_ok,
            after,
        ): Fields = Deserialize::deserialize(d)?;
        Ok(JobSpec {
            tenant,
            priority,
            workers,
            gpus_per_worker,
            flavors,
            topology,
            preemptible,
            checkpoint,
            max_runtime_s,
            command,
            env,
            working_dir,
            checkpoint_signal,
            array: array.map(|(array, index, max_running)| ArrayTask {
                array,
                index,
                max_running,
            }),
            after_ok,
            after,
        })
    }
}
