//! Worker log files: where they are, opening them for a child, and keeping
//! them under the size cap by rotating their tail to `<file>.1`.
//!
//! Must never: read or write a worker's pipes (the child writes the files
//! itself, so it outlives the agent), or keep more than one rotated file.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The log files of one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogPaths {
    /// `<log_dir>/<job>/<run>-<rank>.out`: the live stdout file.
    pub out: PathBuf,
    /// `<log_dir>/<job>/<run>-<rank>.err`: the live stderr file.
    pub err: PathBuf,
    /// `<out>.1`: older stdout, kept when `out` passed the cap.
    pub out_rotated: PathBuf,
    /// `<err>.1`: older stderr, kept when `err` passed the cap.
    pub err_rotated: PathBuf,
}

/// Where the logs of rank `rank` of run `run` of job `job` are. To show a
/// stream in order, read the rotated file (if any) and then the live one.
pub fn log_paths(log_dir: &Path, job: u64, run: u32, rank: u32) -> LogPaths {
    let dir = log_dir.join(job.to_string());
    let out = dir.join(format!("{run}-{rank}.out"));
    let err = dir.join(format!("{run}-{rank}.err"));
    LogPaths {
        out_rotated: rotated(&out),
        err_rotated: rotated(&err),
        out,
        err,
    }
}

fn rotated(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".1");
    PathBuf::from(s)
}

/// Creates the log dir and opens both files for appending (the child
/// inherits `O_APPEND`, so a truncation by [`enforce_cap`] is safe).
pub(crate) fn open(paths: &LogPaths) -> io::Result<(File, File)> {
    if let Some(dir) = paths.out.parent() {
        fs::create_dir_all(dir)?;
    }
    let open = |p: &Path| OpenOptions::new().create(true).append(true).open(p);
    Ok((open(&paths.out)?, open(&paths.err)?))
}

/// Rotates each file of `paths` that is longer than `cap` bytes.
pub(crate) fn enforce_cap(paths: &LogPaths, cap: u64) {
    for (live, old) in [
        (&paths.out, &paths.out_rotated),
        (&paths.err, &paths.err_rotated),
    ] {
        if let Err(e) = rotate_if_over(live, old, cap) {
            tracing::warn!(file = %live.display(), error = %e, "log rotation failed");
        }
    }
}

/// When `live` is longer than `cap`: its last `cap` bytes replace `old`, and
/// `live` is truncated. Returns whether it rotated.
pub(crate) fn rotate_if_over(live: &Path, old: &Path, cap: u64) -> io::Result<bool> {
    let len = match fs::metadata(live) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if len <= cap {
        return Ok(false);
    }
    let mut src = File::open(live)?;
    src.seek(SeekFrom::Start(len - cap))?;
    let mut tail = Vec::new();
    src.take(cap).read_to_end(&mut tail)?;
    let mut tmp = old.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut f = File::create(&tmp)?;
        f.write_all(&tail)?;
    }
    fs::rename(&tmp, old)?;
    OpenOptions::new().write(true).open(live)?.set_len(0)?;
    Ok(true)
}
