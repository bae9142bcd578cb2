//! `gpusched submit -f jobs.jsonl`: many jobs from a JSON Lines file (one
//! job spec a line), sent through `POST /v1/jobs:batch` a thousand at a
//! time.
//!
//! Owns: turning the file's lines into batch items (the submit flags over
//! every line, a key per line from `--key`), sending them in batches, and
//! telling each line's result by its line number.
//!
//! Must never: send anything before every line has been read and checked
//! (a bad line is a usage error naming FILE:LINE:COL, and nothing is
//! submitted), or report a line as submitted that the server did not
//! record.

use std::io::Write;
use std::path::Path;

use anyhow::Result;
use serde_json::{json, Value};

use crate::client::{exit, fail, Client};
use crate::spec::{self, SpecFile, SpecFlags};

/// Jobs sent in one request (the server's most).
const PER_REQUEST: usize = 1000;

/// One line's job, ready to send.
struct Line {
    number: usize,
    item: Value,
}

/// Reads the file and builds every line's item; the first bad line fails
/// the whole command before anything is sent.
fn read(path: &Path, flags: &SpecFlags, key: Option<&str>) -> Result<Vec<Line>> {
    let usage = |e: spec::BadSpec| fail(exit::USAGE, e.0);
    let mut lines = Vec::new();
    for (number, file) in SpecFile::read_lines(path).map_err(usage)? {
        let spec = spec::body(Some(&file), flags).map_err(usage)?;
        let mut item = json!({ "spec": spec });
        if let Some(k) = key {
            item["idempotency_key"] = json!(format!("{k}-{number}"));
        }
        lines.push(Line { number, item });
    }
    Ok(lines)
}

/// What came back, line by line.
#[derive(Default)]
struct Outcome {
    created: Vec<u64>,
    existing: usize,
    /// (line, status, message) of each line not written.
    failed: Vec<(usize, u64, String)>,
    /// Each line's result as the server gave it, with its line number.
    results: Vec<Value>,
}

impl Outcome {
    fn record(&mut self, c: &Client, line: usize, mut r: Value) {
        if let Some(e) = r.get_mut("error") {
            unnest(e);
        }
        let status = r["status"].as_u64().unwrap_or(0);
        match status {
            201 => self.created.push(r["id"].as_u64().unwrap_or(0)),
            200 => self.existing += 1,
            _ => {
                let err = c.refused(status as u16, &r.to_string());
                self.failed.push((line, status, err.to_string()));
            }
        }
        r["line"] = json!(line);
        self.results.push(r);
    }

    /// The exit for what failed: a line the server refused outranks one
    /// it could not take now.
    fn exit_code(&self) -> Option<u8> {
        let refused = |s: u64| (400..500).contains(&s) && s != 429;
        if self.failed.is_empty() {
            None
        } else if self.failed.iter().any(|(_, s, _)| refused(*s)) {
            Some(exit::REFUSED)
        } else {
            Some(exit::UNAVAILABLE)
        }
    }
}

/// An item's error as the single-job route would give it: its field
/// `jobs[i].spec.tenant` told as `tenant` (so the message names the flag;
/// the line number says which job).
fn unnest(e: &mut Value) {
    let Some(field) = e["field"].as_str().map(str::to_string) else {
        return;
    };
    let inner = field
        .split_once("].")
        .map_or(field.as_str(), |(_, rest)| rest);
    let inner = inner.strip_prefix("spec.").unwrap_or(inner).to_string();
    if let Some(m) = e["message"].as_str() {
        let rule = m.strip_prefix(&format!("{field}: ")).unwrap_or(m);
        e["message"] = json!(format!("{inner}: {rule}"));
    }
    e["field"] = json!(inner);
}

/// `gpusched submit -f FILE.jsonl`.
pub async fn submit_lines(
    c: &Client,
    path: &Path,
    flags: &SpecFlags,
    key: Option<&str>,
) -> Result<()> {
    let lines = read(path, flags, key)?;
    let name = path.display().to_string();
    let mut out = Outcome::default();
    for chunk in lines.chunks(PER_REQUEST) {
        let items: Vec<&Value> = chunk.iter().map(|l| &l.item).collect();
        let req = c
            .request(reqwest::Method::POST, "/v1/jobs:batch")
            .json(&json!({ "jobs": items }));
        let resp = c.open(req).await?;
        if !resp.status().is_success() {
            report(c, &name, &out);
            return Err(c.refusal(resp).await);
        }
        let reply: Value = resp.json().await.unwrap_or(Value::Null);
        let results = reply["results"].as_array().cloned().unwrap_or_default();
        if results.len() != chunk.len() {
            report(c, &name, &out);
            return Err(fail(
                exit::ERROR,
                format!(
                    "the server answered {} results for {} jobs",
                    results.len(),
                    chunk.len()
                ),
            ));
        }
        for (line, r) in chunk.iter().zip(results) {
            out.record(c, line.number, r);
        }
    }
    report(c, &name, &out);
    match out.exit_code() {
        None => Ok(()),
        Some(code) => Err(fail(
            code,
            format!(
                "{} of {} jobs were not submitted (see the lines above); sending the file again with the same --key submits only those",
                out.failed.len(),
                lines.len()
            ),
        )),
    }
}

fn report(c: &Client, name: &str, out: &Outcome) {
    if c.json {
        c.print_json(&json!({
            "created": out.created.len(),
            "existing": out.existing,
            "failed": out.failed.len(),
            "results": out.results,
        }));
        return;
    }
    let mut stdout = std::io::stdout().lock();
    for (line, _, message) in &out.failed {
        let _ = writeln!(stdout, "{name}:{line}: {message}");
    }
    let ids = match (out.created.iter().min(), out.created.iter().max()) {
        (Some(a), Some(b)) if a == b => format!(" (job {a})"),
        (Some(a), Some(b)) => format!(" (jobs {a} to {b})"),
        _ => String::new(),
    };
    let _ = writeln!(
        stdout,
        "submitted {} jobs{ids}, {} already submitted with their keys, {} not submitted",
        out.created.len(),
        out.existing,
        out.failed.len()
    );
}
