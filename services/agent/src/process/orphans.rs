//! Worker records (`<state_dir>/workers/<job>-<run>-<rank>.json`), process
//! identity from `/proc/<pid>/stat`, process-group signals, and killing the
//! workers an earlier agent left behind.
//!
//! Must never: signal a group whose leader is not the recorded process
//! (same pid, same start time, same group), or signal group 0 or 1.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use super::WorkerKey;

/// What the state dir remembers of a running worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRecord {
    /// The job id.
    pub job: u64,
    /// The run.
    pub run: u32,
    /// The rank.
    pub rank: u32,
    /// The worker's main process.
    pub pid: u32,
    /// Its process group (the same as `pid`).
    pub pgid: u32,
    /// Its start time in clock ticks after boot (`/proc/<pid>/stat` field
    /// 22): tells the process from a later one with a reused pid.
    pub start_time: u64,
    /// Its argv, for people reading the file.
    pub command: Vec<String>,
}

/// The dir of worker records.
pub(crate) fn records_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("workers")
}

/// The record file of one worker.
pub(crate) fn record_path(state_dir: &Path, key: WorkerKey) -> PathBuf {
    records_dir(state_dir).join(format!("{}-{}-{}.json", key.job, key.run, key.rank))
}

/// Writes `rec` atomically (temp file, then rename).
pub(crate) fn write_record(state_dir: &Path, rec: &WorkerRecord) -> io::Result<()> {
    let key = WorkerKey {
        job: rec.job,
        run: rec.run,
        rank: rec.rank,
    };
    let path = record_path(state_dir, key);
    let tmp = path.with_extension("json.tmp");
    let body = serde_json::to_vec_pretty(rec).map_err(io::Error::other)?;
    fs::write(&tmp, body)?;
    fs::rename(&tmp, &path)
}

/// Removes a record; a missing one is fine.
pub(crate) fn remove_record(path: &Path) {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(file = %path.display(), error = %e, "cannot remove worker record"),
    }
}

/// The fields of `/proc/<pid>/stat` the supervisor needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStat {
    /// Field 3: `R`, `S`, `Z`, ...
    pub state: char,
    /// Field 5: the process group.
    pub pgrp: u32,
    /// Field 22: start time in clock ticks after boot.
    pub start_time: u64,
}

/// Reads `/proc/<pid>/stat`.
pub(crate) fn proc_stat(pid: u32) -> io::Result<ProcStat> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/{pid}/stat: unexpected format"),
        )
    })
}

/// Parses a stat line; the command name (field 2) may hold spaces and
/// parentheses, so fields are counted after its last `)`.
fn parse_stat(text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3.
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        pgrp: fields.get(2)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// Whether the recorded process still runs: same pid, same start time, same
/// group, and not a zombie.
pub(crate) fn is_recorded_process_alive(rec: &WorkerRecord) -> bool {
    match proc_stat(rec.pid) {
        Ok(s) => s.state != 'Z' && s.start_time == rec.start_time && s.pgrp == rec.pgid,
        Err(_) => false,
    }
}

/// Whether group `rec.pgid` can only hold the recorded worker's processes:
/// its leader is the recorded process (maybe a zombie), or no process has
/// the leader's pid any more (a group id comes from its leader's pid, so
/// members left then are the worker's leftovers). False when the pid was
/// reused by another process.
pub(crate) fn group_is_recorded_one(rec: &WorkerRecord) -> bool {
    match proc_stat(rec.pid) {
        Ok(s) => s.start_time == rec.start_time && s.pgrp == rec.pgid,
        Err(e) => e.kind() == io::ErrorKind::NotFound,
    }
}

/// Sends `sig` to process group `pgid`. Returns whether it was delivered
/// (false for a group that is gone, or an id that is not a worker's group).
pub(crate) fn signal_group(pgid: u32, sig: Signal) -> bool {
    let Ok(raw) = i32::try_from(pgid) else {
        return false;
    };
    if raw <= 1 {
        return false;
    }
    match killpg(Pid::from_raw(raw), sig) {
        Ok(()) => true,
        Err(nix::errno::Errno::ESRCH) => false,
        Err(e) => {
            tracing::warn!(pgid, signal = %sig, error = %e, "cannot signal process group");
            false
        }
    }
}

/// All readable records with their files; unreadable ones are logged and
/// left in place.
pub(crate) fn read_records(state_dir: &Path) -> Vec<(PathBuf, WorkerRecord)> {
    let dir = records_dir(state_dir);
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(&dir) else {
        return out;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let parsed = fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<WorkerRecord>(&b).map_err(|e| e.to_string()));
        match parsed {
            Ok(rec) => out.push((path, rec)),
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "unreadable worker record")
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Kills every recorded worker whose (job, run) `keep` does not want and
/// whose process is still the recorded one (SIGTERM to the group, SIGKILL
/// after `grace`), skipping the pids in `own` (workers of this supervisor),
/// and removes the records of dead workers. Returns the pids it signalled.
pub(crate) async fn kill_unwanted(
    state_dir: &Path,
    grace: Duration,
    poll: Duration,
    keep: &(dyn Fn(u64, u32) -> bool + Sync),
    own: &BTreeSet<u32>,
) -> Vec<u32> {
    let mut doomed = Vec::new();
    for (path, rec) in read_records(state_dir) {
        if own.contains(&rec.pid) {
            continue;
        }
        if !is_recorded_process_alive(&rec) {
            remove_record(&path);
            continue;
        }
        if keep(rec.job, rec.run) {
            continue;
        }
        tracing::info!(
            job = rec.job,
            run = rec.run,
            rank = rec.rank,
            pid = rec.pid,
            "killing orphaned worker"
        );
        signal_group(rec.pgid, Signal::SIGTERM);
        doomed.push((path, rec));
    }
    let deadline = tokio::time::Instant::now() + grace;
    let poll = poll.clamp(Duration::from_millis(10), Duration::from_millis(200));
    while doomed.iter().any(|(_, r)| is_recorded_process_alive(r))
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(poll).await;
    }
    let mut killed = Vec::new();
    for (path, rec) in doomed {
        // Also reaches what the worker forked, when its leader died first.
        if group_is_recorded_one(&rec) {
            signal_group(rec.pgid, Signal::SIGKILL);
        }
        remove_record(&path);
        killed.push(rec.pid);
    }
    killed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let line = "4242 (we ird) (name) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1000 100";
        let s = parse_stat(line).expect("parses");
        assert_eq!(s.state, 'S');
        assert_eq!(s.pgrp, 4242);
        assert_eq!(s.start_time, 987654);
    }

    #[test]
    fn a_truncated_stat_line_is_refused() {
        assert_eq!(parse_stat("1 (x) S 0 1"), None);
    }
}
