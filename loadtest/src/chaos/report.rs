//! The chaos run's report: the table (fault | jobs accepted | ended | lost
//! | duplicated | wrongly refused | longest stall | fault end → deciding
//! again), the run-wide checks, why each failing row failed, and what the
//! service logs said meanwhile; printed, and written as `report.json` and
//! `report.md`.
//!
//! Owns: the report's shape, the log excerpts (warnings and errors each
//! process logged during a failing phase) and how figures are shown.
//!
//! Must never: measure anything, or show a failing row as passing.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

use super::check::{PhaseRun, Row};
use super::plan::ChaosPlan;

/// A run-wide check.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Did it hold?
    pub ok: bool,
    /// What was found.
    pub detail: String,
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct ChaosReport {
    /// The command line.
    pub command: String,
    /// When it finished, UTC.
    pub finished_utc: String,
    /// The plan (form, seed, sizes, phases).
    pub plan: ChaosPlan,
    /// The private servers' directory (removed at the end).
    pub infra_dir: String,
    /// The private Postgres' port (stopped at the end).
    pub postgres_port: u16,
    /// The private nats-server's port (stopped at the end).
    pub nats_port: u16,
    /// The run's database on the private Postgres.
    pub database: String,
    /// The run's NATS root.
    pub namespace: String,
    /// Jobs whose submission was started (probes included).
    pub jobs_sent: usize,
    /// Events in the log at the end.
    pub events: usize,
    /// The table.
    pub rows: Vec<Row>,
    /// What each phase did.
    pub phases: Vec<PhaseRun>,
    /// Run-wide checks.
    pub checks: Vec<Check>,
    /// Warnings and errors the processes logged during each failing row.
    pub excerpts: BTreeMap<String, Vec<String>>,
    /// Every row and check passed.
    pub passed: bool,
}

fn secs(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

fn recovery(r: &Row) -> String {
    match (r.recovery_measured, r.recovery_ms) {
        (false, _) => "-".into(),
        (true, None) => "never".into(),
        (true, Some(ms)) => secs(ms),
    }
}

const HEADER: [&str; 10] = [
    "fault",
    "accepted",
    "ended",
    "lost",
    "duplicated",
    "wrongly refused",
    "gave up",
    "longest stall",
    "fault end → deciding again",
    "verdict",
];

fn cells(r: &Row) -> [String; 10] {
    [
        r.label.clone(),
        r.accepted.to_string(),
        r.ended.to_string(),
        r.lost.to_string(),
        r.duplicated.to_string(),
        r.wrongly_refused.to_string(),
        r.gave_up.to_string(),
        secs(r.longest_stall_ms),
        recovery(r),
        if r.failures.is_empty() { "ok" } else { "FAIL" }.into(),
    ]
}

impl ChaosReport {
    /// Prints the table, the checks and every failure to stdout.
    pub fn print_table(&self) {
        let rows: Vec<[String; 10]> = self.rows.iter().map(cells).collect();
        let width = |i: usize| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([HEADER[i].chars().count()])
                .max()
                .unwrap_or(0)
        };
        let w: Vec<usize> = (0..HEADER.len()).map(width).collect();
        let line = |c: &[String]| {
            c.iter()
                .enumerate()
                .map(|(i, s)| format!("{s:<w$}", w = w[i]))
                .collect::<Vec<_>>()
                .join(" | ")
        };
        let header: Vec<String> = HEADER.iter().map(|s| s.to_string()).collect();
        println!("\n{}", line(&header));
        println!(
            "{}",
            w.iter()
                .map(|n| "-".repeat(*n))
                .collect::<Vec<_>>()
                .join("-+-")
        );
        for r in &rows {
            println!("{}", line(r));
        }
        println!();
        for c in &self.checks {
            println!(
                "{} {}: {}",
                if c.ok { "ok  " } else { "FAIL" },
                c.name,
                c.detail
            );
        }
        for r in self.rows.iter().filter(|r| !r.failures.is_empty()) {
            println!("\n{}: {}", r.label, r.failures.join("; "));
            for n in &r.notes {
                println!("    {n}");
            }
            for e in self.excerpts.get(&r.label).into_iter().flatten() {
                println!("    log: {e}");
            }
        }
        println!(
            "\nchaos {} (seed {}, goals: recovery ≤ {} s, stall ≤ {} s): {}",
            if self.plan.short { "short" } else { "long" },
            self.plan.seed,
            self.plan.goals.recovery.as_secs_f64(),
            self.plan.goals.stall.as_secs_f64(),
            if self.passed { "PASSED" } else { "FAILED" }
        );
    }

    fn markdown(&self) -> String {
        let mut s = format!(
            "# Chaos run, {} form, seed {}\n\n`{}` — {}\n\n{} nodes, {} jobs/s, lease TTL {} s, time scale {}; \
             private Postgres and nats-server (removed); {} jobs sent, {} events in the log. \
             Goals: fault end → deciding again ≤ {} s, no stall over {} s outside a fault window.\n\n",
            if self.plan.short { "short" } else { "long" },
            self.plan.seed,
            self.command,
            self.finished_utc,
            self.plan.nodes,
            self.plan.rate,
            self.plan.lease_ttl_s,
            self.plan.time_scale,
            self.jobs_sent,
            self.events,
            self.plan.goals.recovery.as_secs_f64(),
            self.plan.goals.stall.as_secs_f64()
        );
        let _ = writeln!(s, "| {} |", HEADER.join(" | "));
        let _ = writeln!(s, "|{}", "---|".repeat(HEADER.len()));
        for r in &self.rows {
            let _ = writeln!(s, "| {} |", cells(r).join(" | "));
        }
        s.push_str("\n## Checks\n\n");
        for c in &self.checks {
            let _ = writeln!(
                s,
                "- {} **{}**: {}",
                if c.ok { "ok" } else { "FAIL" },
                c.name,
                c.detail
            );
        }
        s.push_str("\n## Phases\n");
        for r in &self.rows {
            let _ = writeln!(
                s,
                "\n### {} — {}\n",
                r.label,
                if r.failures.is_empty() { "ok" } else { "FAIL" }
            );
            for f in &r.failures {
                let _ = writeln!(s, "- **{f}**");
            }
            for n in &r.notes {
                let _ = writeln!(s, "- {n}");
            }
            if let Some(lines) = self.excerpts.get(&r.label).filter(|l| !l.is_empty()) {
                s.push_str("\n```\n");
                for l in lines {
                    let _ = writeln!(s, "{l}");
                }
                s.push_str("```\n");
            }
        }
        s
    }

    /// Writes `report.json` and `report.md` into `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let json = serde_json::to_vec_pretty(self).context("encoding the report")?;
        std::fs::write(dir.join("report.json"), json).context("writing report.json")?;
        std::fs::write(dir.join("report.md"), self.markdown()).context("writing report.md")
    }
}

/// Sizes of every `*.log` in a directory at one moment.
#[derive(Clone, Debug, Default)]
pub struct LogMarks(BTreeMap<PathBuf, u64>);

impl LogMarks {
    /// The sizes now.
    pub fn take(dir: &Path) -> LogMarks {
        let mut m = BTreeMap::new();
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "log") {
                    if let Ok(md) = e.metadata() {
                        m.insert(p, md.len());
                    }
                }
            }
        }
        LogMarks(m)
    }
}

fn read_range(path: &Path, from: u64, to: u64) -> String {
    let mut buf = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        if f.seek(SeekFrom::Start(from)).is_ok() {
            let _ = f
                .take(to.saturating_sub(from).min(8 << 20))
                .read_to_end(&mut buf);
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// Warnings, errors, panics, and the lease's life (standing by, taken,
/// rebuilt, stepped down), which tells how long a takeover waited.
fn worth_showing(line: &str) -> bool {
    [
        " WARN ",
        " ERROR ",
        "panicked",
        "lease",
        "rebuilt",
        "stepped down",
    ]
    .iter()
    .any(|w| line.contains(w))
}

/// The message of a log line without its timestamp (to count repeats).
fn message(line: &str) -> &str {
    line.split_once(' ')
        .map_or(line, |(_, rest)| rest.trim_start())
}

/// What every process logged between two marks that is worth showing
/// (see `worth_showing`), each distinct message once with its count, at
/// most `per_file` per file.
pub fn excerpts(from: &LogMarks, to: &LogMarks, per_file: usize) -> Vec<String> {
    let mut out = Vec::new();
    for (path, end) in &to.0 {
        let start = from.0.get(path).copied().unwrap_or(0);
        if *end <= start {
            continue;
        }
        let text = read_range(path, start, *end);
        let mut seen: BTreeMap<String, (usize, String)> = BTreeMap::new();
        let mut order = Vec::new();
        for line in text.lines() {
            if !worth_showing(line) {
                continue;
            }
            let key: String = message(line).chars().take(72).collect();
            let entry = seen.entry(key.clone()).or_insert_with(|| {
                order.push(key.clone());
                (0, line.chars().take(400).collect())
            });
            entry.0 += 1;
        }
        let name = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        for key in order.iter().take(per_file) {
            if let Some((n, line)) = seen.get(key) {
                out.push(format!(
                    "{name}: {line}{}",
                    if *n > 1 {
                        format!("  (×{n})")
                    } else {
                        String::new()
                    }
                ));
            }
        }
        if order.len() > per_file {
            out.push(format!(
                "{name}: … {} more distinct warnings",
                order.len() - per_file
            ));
        }
    }
    out
}

/// The last `n` non-empty lines of a file.
pub fn tail(path: &Path, n: usize) -> Vec<String> {
    let len = std::fs::metadata(path).map_or(0, |m| m.len());
    let text = read_range(path, len.saturating_sub(16 << 10), len);
    let lines: Vec<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.chars().take(400).collect())
        .collect();
    lines[lines.len().saturating_sub(n)..].to_vec()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn excerpts_show_each_warning_of_the_window_once() {
        let dir =
            std::env::temp_dir().join(format!("chaos-report-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("quota-2.log");
        std::fs::write(&f, "2025-01-01T00:00:00Z  WARN old warning\n").unwrap();
        let from = LogMarks::take(&dir);
        let body = "2025-01-01T00:00:01Z  INFO fine\n\
                    2025-01-01T00:00:01Z  INFO lease taken; rebuilding\n\
                    2025-01-01T00:00:02Z  WARN bus read failed\n\
                    2025-01-01T00:00:03Z  WARN bus read failed\n\
                    2025-01-01T00:00:04Z ERROR leading failed\n";
        std::fs::write(
            &f,
            format!("2025-01-01T00:00:00Z  WARN old warning\n{body}"),
        )
        .unwrap();
        let to = LogMarks::take(&dir);
        let e = excerpts(&from, &to, 10);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(e[0].contains("lease taken"));
        assert!(e[1].contains("bus read failed") && e[1].contains("×2"));
        assert!(e[2].contains("leading failed"));
    }
}
