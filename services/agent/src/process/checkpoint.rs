//! Watching a job's checkpoint dir for checkpoints with a completion marker.
//!
//! Must never: report a checkpoint without its `COMPLETE` marker, report a
//! name twice, or write into the checkpoint dir.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The marker a job writes last into a finished checkpoint.
pub(crate) const MARKER: &str = "COMPLETE";

/// A checkpoint found complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    pub name: String,
    pub path: PathBuf,
    pub progress: u64,
}

/// The checkpoints of one (job, run) seen so far.
#[derive(Debug)]
pub(crate) struct CheckpointWatch {
    dir: PathBuf,
    seen: BTreeSet<String>,
}

impl CheckpointWatch {
    /// Starts watching `dir`; whatever already has a marker (the checkpoint
    /// a run resumes from, earlier runs' ones) counts as seen.
    pub fn new(dir: &Path) -> Self {
        let seen = entries(dir)
            .filter(|(_, path)| path.join(MARKER).exists())
            .map(|(name, _)| name)
            .collect();
        Self {
            dir: dir.to_path_buf(),
            seen,
        }
    }

    /// The checkpoints newly complete since the last scan, by progress then
    /// name. A marker that does not hold an integer (yet) is not reported
    /// and is looked at again next time.
    pub fn scan(&mut self) -> Vec<Found> {
        let mut found: Vec<Found> = entries(&self.dir)
            .filter(|(name, _)| !self.seen.contains(name))
            .filter_map(|(name, path)| {
                let text = fs::read_to_string(path.join(MARKER)).ok()?;
                let progress = text.trim().parse::<u64>().ok()?;
                Some(Found {
                    name,
                    path,
                    progress,
                })
            })
            .collect();
        found.sort_by(|a, b| (a.progress, &a.name).cmp(&(b.progress, &b.name)));
        for f in &found {
            self.seen.insert(f.name.clone());
        }
        found
    }
}

/// The sub-directories of `dir` with UTF-8 names; none when `dir` cannot be
/// read.
fn entries(dir: &Path) -> impl Iterator<Item = (String, PathBuf)> {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            Some((name, e.path()))
        })
}
