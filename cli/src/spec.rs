//! What `gpusched submit` sends: a job spec file's fields with the flags
//! over them, checked before any request.
//!
//! Owns: reading a spec file (TOML, YAML, JSON, or JSON on stdin) into the
//! job's fields with errors that name the file, line and column; merging
//! the submit flags over them (the command after `--`, `--env`,
//! `--workdir`, `--checkpoint-signal` included); the model's own field
//! checks (`JobSpec::check_fields`); and the one table from a field's name
//! (as spec files and the API write it) to the flag that sets it.
//! Must never: judge what needs the cluster (tenants, flavors, whether a
//! gang fits): the server does, and names the field; or read anything but
//! the spec file it is given.

use std::collections::BTreeMap;
use std::path::Path;

use gpusched_model::{
    checkpoint_signal_number, CheckpointPolicy, Gpus, JobSpec, CHECKPOINT_SIGNALS,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// A field's name (as spec files and the API write it) and the flag that
/// sets it: the one table the client's messages use.
pub const FIELD_FLAGS: &[(&str, &str)] = &[
    ("tenant", "--tenant"),
    ("priority", "--priority"),
    ("workers", "--workers"),
    ("gpus_per_worker", "--gpus"),
    ("flavors", "--flavor"),
    ("topology", "--topology"),
    ("preemptible", "--no-preempt"),
    ("checkpoint", "--checkpoint-interval"),
    ("checkpoint.interval_s", "--checkpoint-interval"),
    ("checkpoint.duration_s", "--checkpoint-duration"),
    ("max_runtime_s", "--max-runtime"),
    ("command", COMMAND_ARG),
    ("env", "--env"),
    ("working_dir", "--workdir"),
    ("checkpoint_signal", "--checkpoint-signal"),
    ("after_ok", "--after-ok"),
    ("after", "--after"),
    ("indices", "--array"),
    ("Idempotency-Key", "--key"),
    ("state", "--state"),
    ("limit", "--limit"),
    ("worker", "--worker"),
    ("stream", "--err"),
];

/// How messages name the command: it is everything after `--`, not a flag.
pub const COMMAND_ARG: &str = "-- COMMAND";

/// The flag that sets `field` (`gpus_per_worker` → `--gpus`), if one does.
/// A path into a field (`flavors[1]`, `checkpoint.x`) falls back to the
/// field it is in.
pub fn flag_for(field: &str) -> Option<&'static str> {
    let exact = |f: &str| FIELD_FLAGS.iter().find(|(k, _)| *k == f).map(|(_, v)| *v);
    exact(field).or_else(|| {
        let root = field.split(['.', '[']).next().unwrap_or(field);
        exact(root)
    })
}

/// A spec file's field named for people with the flag that sets it:
/// `gpus_per_worker (--gpus)`.
fn field_and_flag(field: &str) -> String {
    match flag_for(field) {
        Some(flag) => format!("{field} ({flag})"),
        None => field.to_string(),
    }
}

/// The submit flags that set the job's fields.
#[derive(clap::Args, Debug, Default)]
pub struct SpecFlags {
    /// Tenant (queue).
    #[arg(long, short = 't')]
    pub tenant: Option<String>,
    /// Workers in the gang (all start together or none does) [default: 1
    /// without --file].
    #[arg(long, short = 'N')]
    pub workers: Option<u32>,
    /// GPUs per worker.
    #[arg(long, short = 'G')]
    pub gpus: Option<u32>,
    /// Acceptable GPU flavor, most preferred first (repeatable).
    #[arg(long = "flavor")]
    pub flavors: Vec<String>,
    /// Topology level the gang must fit in: node, block, rack or any.
    #[arg(long)]
    pub topology: Option<String>,
    /// Priority within the tenant (higher first).
    #[arg(long, allow_negative_numbers = true)]
    pub priority: Option<i32>,
    /// Never preempt this job.
    #[arg(long)]
    pub no_preempt: bool,
    /// Seconds between checkpoints (the job checkpoints).
    #[arg(long, requires = "checkpoint_duration")]
    pub checkpoint_interval: Option<u64>,
    /// Seconds one checkpoint takes.
    #[arg(long, requires = "checkpoint_interval")]
    pub checkpoint_duration: Option<u64>,
    /// Declared maximum runtime, seconds.
    #[arg(long)]
    pub max_runtime: Option<u64>,
    /// Environment variable added to each worker's (repeatable); these win
    /// over the spec file's `env` of the same name.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Working directory of each worker on its node.
    #[arg(long, value_name = "DIR", value_parser = parse_workdir)]
    pub workdir: Option<String>,
    /// Signal that asks the job for a checkpoint [default: SIGUSR1]: a name
    /// (SIGUSR2, USR2) or a number.
    #[arg(long, value_name = "SIG", value_parser = parse_signal)]
    pub checkpoint_signal: Option<String>,
    /// Run only once these jobs (of the same tenant, submitted earlier)
    /// have all succeeded; if one ends otherwise, this job is cancelled.
    /// Comma-separated ids, repeatable.
    #[arg(long = "after-ok", value_name = "IDS", value_delimiter = ',')]
    pub after_ok: Vec<u64>,
    /// Run only once these jobs (of the same tenant, submitted earlier)
    /// have all ended, however. Comma-separated ids, repeatable.
    #[arg(long = "after", value_name = "IDS", value_delimiter = ',')]
    pub after: Vec<u64>,
    /// What each worker runs: everything after `--` (`-- python train.py
    /// --lr 3e-4`).
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// `--env KEY=VALUE`: split at the first `=`; the name must not be empty.
fn parse_env(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        Some(_) => Err("the name before '=' must not be empty (KEY=VALUE)".to_string()),
        None => Err(format!("expected KEY=VALUE, with '=' (got {s:?})")),
    }
}

/// `--workdir DIR`: any path but an empty one.
fn parse_workdir(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        Err("must not be empty".to_string())
    } else {
        Ok(s.to_string())
    }
}

/// The signal names jobs may ask to be checkpointed with, for messages.
pub fn signal_names() -> String {
    CHECKPOINT_SIGNALS
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `--checkpoint-signal SIG`: one the model accepts, kept as written (the
/// server stores it so).
fn parse_signal(s: &str) -> Result<String, String> {
    match checkpoint_signal_number(Some(s)) {
        Some(_) => Ok(s.to_string()),
        None => Err(format!(
            "must be one of {} (with or without SIG, or its number)",
            signal_names()
        )),
    }
}

impl SpecFlags {
    /// Whether a flag set this field (or the field it is in).
    fn sets(&self, field: &str) -> bool {
        match field.split(['.', '[']).next().unwrap_or(field) {
            "tenant" => self.tenant.is_some(),
            "priority" => self.priority.is_some(),
            "workers" => self.workers.is_some(),
            "gpus_per_worker" => self.gpus.is_some(),
            "flavors" => !self.flavors.is_empty(),
            "topology" => self.topology.is_some(),
            "preemptible" => self.no_preempt,
            "checkpoint" => self.checkpoint_interval.is_some(),
            "max_runtime_s" => self.max_runtime.is_some(),
            "command" => !self.command.is_empty(),
            "working_dir" => self.workdir.is_some(),
            "checkpoint_signal" => self.checkpoint_signal.is_some(),
            "after_ok" => !self.after_ok.is_empty(),
            "after" => !self.after.is_empty(),
            // `--env` names are checked as they are parsed: a bad name the
            // model refuses can only have come from the file.
            _ => false,
        }
    }

    /// Writes the flags given over `o`.
    fn overlay(&self, o: &mut Map<String, Value>) {
        if let Some(t) = &self.tenant {
            o.insert("tenant".into(), json!(t));
        }
        if let Some(w) = self.workers {
            o.insert("workers".into(), json!(w));
        }
        if let Some(g) = self.gpus {
            o.insert("gpus_per_worker".into(), json!(g));
        }
        if !self.flavors.is_empty() {
            o.insert("flavors".into(), json!(self.flavors));
        }
        if let Some(t) = &self.topology {
            o.insert("topology".into(), json!(t));
        }
        if let Some(p) = self.priority {
            o.insert("priority".into(), json!(p));
        }
        if self.no_preempt {
            o.insert("preemptible".into(), json!(false));
        }
        if let (Some(i), Some(d)) = (self.checkpoint_interval, self.checkpoint_duration) {
            o.insert(
                "checkpoint".into(),
                json!({"interval_s": i, "duration_s": d}),
            );
        }
        if let Some(m) = self.max_runtime {
            o.insert("max_runtime_s".into(), json!(m));
        }
        if !self.command.is_empty() {
            o.insert("command".into(), json!(self.command));
        }
        if !self.env.is_empty() {
            // Merged by name over the file's: one variable overrides one.
            let env = o.entry("env").or_insert_with(|| Value::Object(Map::new()));
            if !env.is_object() {
                *env = Value::Object(Map::new());
            }
            if let Value::Object(env) = env {
                for (k, v) in &self.env {
                    env.insert(k.clone(), json!(v));
                }
            }
        }
        if let Some(d) = &self.workdir {
            o.insert("working_dir".into(), json!(d));
        }
        if let Some(sig) = &self.checkpoint_signal {
            o.insert("checkpoint_signal".into(), json!(sig));
        }
        if !self.after_ok.is_empty() {
            o.insert("after_ok".into(), json!(self.after_ok));
        }
        if !self.after.is_empty() {
            o.insert("after".into(), json!(self.after));
        }
    }
}

/// A bad spec: a usage error (exit 2) with its message.
#[derive(Debug, PartialEq, Eq)]
pub struct BadSpec(pub String);

impl std::fmt::Display for BadSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadSpec {}

/// The fields a spec file may hold: `JobSpec`'s, each optional because a
/// flag may give it (a unit test keeps the two lists the same).
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    priority: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    workers: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gpus_per_worker: Option<Gpus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    flavors: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    topology: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    preemptible: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    checkpoint: Option<CheckpointPolicy>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_runtime_s: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    command: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    env: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    working_dir: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    checkpoint_signal: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    after_ok: Option<Vec<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    after: Option<Vec<u64>>,
}

/// Fields one level down (in `checkpoint`).
const NESTED: &[(&str, &str)] = &[
    ("interval_s", "checkpoint.interval_s"),
    ("duration_s", "checkpoint.duration_s"),
];

/// The field path a key names, if it is one of the spec's.
fn known_field(key: &str) -> Option<String> {
    const TOP: &[&str] = &[
        "tenant",
        "priority",
        "workers",
        "gpus_per_worker",
        "flavors",
        "topology",
        "preemptible",
        "checkpoint",
        "max_runtime_s",
        "command",
        "env",
        "working_dir",
        "checkpoint_signal",
        "after_ok",
        "after",
        "checkpoint.interval_s",
        "checkpoint.duration_s",
    ];
    if TOP.contains(&key) {
        return Some(key.to_string());
    }
    // One variable of `env` (`env.PORT`), as serde_yaml_ng names it.
    if key.strip_prefix("env.").is_some_and(|k| !k.is_empty()) {
        return Some(key.to_string());
    }
    NESTED
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, path)| path.to_string())
}

/// The language of a spec file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Toml,
    Yaml,
    Json,
}

/// A spec file as read: its name for messages, its text and its fields.
pub struct SpecFile {
    name: String,
    text: String,
    fields: FileSpec,
    /// The file's line that `text` starts on (1, but for a line of a JSON
    /// Lines file).
    first_line: usize,
}

/// Line and column (both from 1, the column in characters) of a byte
/// offset into `text`; an offset inside a character counts as that
/// character, one past the end as the end.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut at = offset.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// `msg` without the " at line L column C" a parser appends (serde_json,
/// serde_yaml_ng), so the position is said once, in front.
pub fn strip_position(msg: &str, line: usize, col: usize) -> String {
    msg.replacen(&format!(" at line {line} column {col}"), "", 1)
}

/// Serde's wording made plain: `unknown field "x"; expected one of a, b`,
/// backquotes as double quotes, and the file's struct named for people.
fn plain(msg: &str) -> String {
    let msg = msg.trim();
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        if let Some((name, tail)) = rest.split_once('`') {
            let expected: Vec<&str> = tail
                .split('`')
                .skip(1)
                .step_by(2)
                .filter(|s| !s.is_empty())
                .collect();
            return if expected.is_empty() {
                format!("unknown field \"{name}\"")
            } else {
                format!(
                    "unknown field \"{name}\"; expected one of {}",
                    expected.join(", ")
                )
            };
        }
    }
    msg.replace("struct FileSpec", "a table of job fields")
        .replace(
            "struct CheckpointPolicy",
            "a table with interval_s and duration_s",
        )
        .replace('`', "\"")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The unknown field a serde message names (`unknown field `x``).
fn unknown_field(msg: &str) -> Option<&str> {
    msg.split("unknown field `").nth(1)?.split('`').next()
}

/// The key the value at `col` (from 1) of `line` belongs to: the name
/// before the last `=` or `:` ahead of it (`workers = "two"`,
/// `"workers": "two"`), if it is one of the spec's fields.
pub fn key_before(line: &str, col: usize) -> Option<String> {
    let head: String = line.chars().take(col.saturating_sub(1)).collect();
    let cut = head.rfind(['=', ':'])?;
    let name = head[..cut]
        .trim_end()
        .rsplit(|c: char| c.is_whitespace() || matches!(c, '{' | ',' | '['))
        .next()?
        .trim_matches(|c| c == '"' || c == '\'');
    known_field(name)
}

/// Where `key` (the last part of a field path) is written as a key in
/// `text`: the first `key =`, `key:` or `"key":`, as (line, column).
pub fn locate_key(text: &str, field: &str) -> Option<(usize, usize)> {
    let key = field.rsplit('.').next().unwrap_or(field);
    for (n, line) in text.lines().enumerate() {
        let mut from = 0;
        while let Some(i) = line[from..].find(key) {
            let start = from + i;
            let end = start + key.len();
            from = end;
            let before = line[..start].chars().next_back();
            let opens = match before {
                None => true,
                Some(c) => c.is_whitespace() || matches!(c, '"' | '\'' | '{' | ','),
            };
            let quoted = matches!(before, Some('"' | '\''));
            let after = line[end..].trim_start_matches(['"', '\'']).trim_start();
            if opens && (after.starts_with(':') || after.starts_with('=')) {
                let key_start = if quoted { start - 1 } else { start };
                return Some((n + 1, line[..key_start].chars().count() + 1));
            }
        }
    }
    None
}

impl SpecFile {
    /// Reads and checks a spec file (`-`: JSON on stdin). Every error is
    /// `FILE:LINE:COL: what` where the parser says where.
    pub fn read(path: &Path) -> Result<SpecFile, BadSpec> {
        let stdin = path == Path::new("-");
        let name = if stdin {
            "<stdin>".to_string()
        } else {
            path.display().to_string()
        };
        let unreadable = |e: std::io::Error| BadSpec(format!("--file {name}: {e}"));
        let text = if stdin {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(unreadable)?;
            s
        } else {
            std::fs::read_to_string(path).map_err(unreadable)?
        };
        let ext = if stdin {
            "json".to_string()
        } else {
            path.extension()
                .and_then(|e| e.to_str())
                .unwrap_or("json")
                .to_ascii_lowercase()
        };
        let format = match ext.as_str() {
            "toml" => Format::Toml,
            "yaml" | "yml" => Format::Yaml,
            "json" => Format::Json,
            other => {
                return Err(BadSpec(format!(
                    "--file {name}: unknown extension .{other}; use .toml, .yaml, .yml, .json, or .jsonl for many jobs"
                )))
            }
        };
        let fields = parse(format, &text).map_err(|e| e.located(&name, &text))?;
        Ok(SpecFile {
            name,
            text,
            fields,
            first_line: 1,
        })
    }

    /// Reads a JSON Lines file of job specs, one JSON object a line
    /// (blank lines skipped), each with its line number. Every line is
    /// read before any is used: the first bad one is the error,
    /// `FILE:LINE:COL: what`.
    pub fn read_lines(path: &Path) -> Result<Vec<(usize, SpecFile)>, BadSpec> {
        let name = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| BadSpec(format!("--file {name}: {e}")))?;
        let mut out = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            if line.trim().is_empty() {
                continue;
            }
            let fields = parse(Format::Json, line).map_err(|mut e| {
                e.at = e.at.map(|(_, col)| (n, col));
                e.located(&name, &text)
            })?;
            let spec = SpecFile {
                name: name.clone(),
                text: line.to_string(),
                fields,
                first_line: n,
            };
            out.push((n, spec));
        }
        if out.is_empty() {
            return Err(BadSpec(format!("--file {name}: no jobs in it")));
        }
        Ok(out)
    }

    /// Whether `path` names a JSON Lines file of many jobs.
    pub fn is_lines(path: &Path) -> bool {
        path.extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e.eq_ignore_ascii_case("jsonl"))
    }

    /// Parses spec text as a file named `name` would be (for tests).
    #[cfg(test)]
    fn from_text(name: &str, format: Format, text: &str) -> Result<SpecFile, BadSpec> {
        let fields = parse(format, text).map_err(|e| e.located(name, text))?;
        Ok(SpecFile {
            name: name.to_string(),
            text: text.to_string(),
            fields,
            first_line: 1,
        })
    }
}

/// A parser's complaint: what, and where if it says.
struct ParseError {
    message: String,
    at: Option<(usize, usize)>,
}

impl ParseError {
    /// `FILE:LINE:COL: field (--flag): what`, naming the field where the
    /// parser or the line shows it.
    fn located(self, name: &str, text: &str) -> BadSpec {
        let mut at = self.at;
        let mut message = self.message;
        // A path the parser put in front (serde_yaml_ng: `workers: ...`).
        let mut field = message.split_once(": ").and_then(|(head, rest)| {
            let f = known_field(head)?;
            let rest = rest.to_string();
            Some((f, rest))
        });
        if let Some((_, rest)) = &field {
            message = rest.clone();
        }
        if let Some(unknown) = unknown_field(&message).map(str::to_string) {
            // Point at the key itself (serde_json points past it).
            if let Some((line, col)) = at {
                let line_text = text.lines().nth(line - 1).unwrap_or("");
                let head: String = line_text.chars().take(col).collect();
                if let Some(i) = head.rfind(&unknown) {
                    let quoted = head[..i].ends_with(['"', '\'']);
                    let start = if quoted { i - 1 } else { i };
                    at = Some((line, head[..start].chars().count() + 1));
                }
            }
            field = None;
        } else if field.is_none() {
            field = at.and_then(|(line, col)| {
                let f = key_before(text.lines().nth(line - 1)?, col)?;
                Some((f, String::new()))
            });
        }
        let what = match field {
            Some((f, _)) => format!("{}: {}", field_and_flag(&f), plain(&message)),
            None => plain(&message),
        };
        match at {
            Some((line, col)) => BadSpec(format!("{name}:{line}:{col}: {what}")),
            None => BadSpec(format!("{name}: {what}")),
        }
    }
}

fn parse(format: Format, text: &str) -> Result<FileSpec, ParseError> {
    match format {
        Format::Toml => toml::from_str(text).map_err(|e| ParseError {
            message: e.message().to_string(),
            at: e.span().map(|s| line_col(text, s.start)),
        }),
        Format::Yaml => serde_yaml_ng::from_str(text).map_err(|e| {
            let at = e.location().map(|l| (l.line(), l.column()));
            let msg = e.to_string();
            ParseError {
                message: match at {
                    Some((l, c)) => strip_position(&msg, l, c),
                    None => msg,
                },
                at,
            }
        }),
        Format::Json => serde_json::from_str(text).map_err(|e| {
            let (l, c) = (e.line(), e.column());
            ParseError {
                message: strip_position(&e.to_string(), l, c),
                at: (l > 0).then_some((l, c.max(1))),
            }
        }),
    }
}

/// The request body: the file's fields, the flags over them, checked with
/// the model's own field rules. Without a file, one worker unless told.
pub fn body(file: Option<&SpecFile>, flags: &SpecFlags) -> Result<Value, BadSpec> {
    let mut o = match file {
        Some(f) => match serde_json::to_value(&f.fields) {
            Ok(Value::Object(o)) => o,
            _ => Map::new(),
        },
        None => Map::new(),
    };
    flags.overlay(&mut o);
    if file.is_none() {
        o.entry("workers").or_insert(json!(1));
    }
    for field in ["tenant", "workers", "gpus_per_worker"] {
        if !o.contains_key(field) {
            let flag = flag_for(field).unwrap_or(field);
            return Err(BadSpec(format!(
                "{flag} is required (or \"{field}\" in the spec file)"
            )));
        }
    }
    let spec: JobSpec = serde_json::from_value(Value::Object(o.clone()))
        .map_err(|e| BadSpec(format!("the job spec: {e}")))?;
    spec.check_fields().map_err(|e| {
        let rule = &e.rule;
        match (flags.sets(&e.field), file) {
            (true, _) | (false, None) => {
                let flag = flag_for(&e.field).unwrap_or(&e.field);
                BadSpec(format!("{flag}: {rule}"))
            }
            (false, Some(f)) => {
                let what = format!("{}: {rule}", field_and_flag(&e.field));
                match locate_key(&f.text, &e.field) {
                    Some((line, col)) => {
                        let line = line + f.first_line - 1;
                        BadSpec(format!("{}:{line}:{col}: {what}", f.name))
                    }
                    None => BadSpec(format!("{}: {what}", f.name)),
                }
            }
        }
    })?;
    Ok(Value::Object(o))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn fields_map_to_the_flags_that_set_them() {
        assert_eq!(flag_for("gpus_per_worker"), Some("--gpus"));
        assert_eq!(flag_for("tenant"), Some("--tenant"));
        assert_eq!(flag_for("max_runtime_s"), Some("--max-runtime"));
        assert_eq!(
            flag_for("checkpoint.duration_s"),
            Some("--checkpoint-duration")
        );
        assert_eq!(flag_for("flavors[2]"), Some("--flavor"));
        assert_eq!(flag_for("command[0]"), Some(COMMAND_ARG));
        assert_eq!(flag_for("env.PORT"), Some("--env"));
        assert_eq!(flag_for("working_dir"), Some("--workdir"));
        assert_eq!(flag_for("checkpoint_signal"), Some("--checkpoint-signal"));
        assert_eq!(flag_for("nonsense"), None);
    }

    #[test]
    fn every_mapped_flag_is_a_real_flag() {
        // Every flag of every subcommand, and the arguments after `--`.
        let cli = <crate::Cli as clap::CommandFactory>::command();
        let mut longs = BTreeSet::new();
        let mut last = BTreeSet::new();
        for sub in cli.get_subcommands() {
            for a in sub.get_arguments() {
                if let Some(l) = a.get_long() {
                    longs.insert(format!("--{l}"));
                }
                if a.is_last_set() {
                    for name in a.get_value_names().into_iter().flatten() {
                        last.insert(format!("-- {name}"));
                    }
                }
            }
        }
        for (field, flag) in FIELD_FLAGS {
            assert!(
                longs.contains(*flag) || last.contains(*flag),
                "{field} maps to {flag}, not a flag"
            );
        }
        assert!(last.contains(COMMAND_ARG), "{last:?}");
    }

    #[test]
    fn the_file_fields_are_the_models() {
        // Every field set to a value JobSpec serializes (it skips an empty
        // command, env, working_dir and checkpoint_signal), so each one is
        // in the model's list; a new JobSpec field breaks this literal.
        let spec = JobSpec {
            tenant: "a".into(),
            priority: 1,
            workers: 1,
            gpus_per_worker: 1,
            flavors: vec!["x".into()],
            topology: "any".into(),
            preemptible: true,
            checkpoint: Some(CheckpointPolicy {
                interval_s: 1,
                duration_s: 1,
            }),
            max_runtime_s: Some(1),
            command: vec!["python".into(), "train.py".into()],
            env: [("A".to_string(), "1".to_string())].into(),
            working_dir: Some("/tmp".into()),
            checkpoint_signal: Some("SIGUSR2".into()),
            // Set by the gateway on an array's tasks, never in a file.
            array: None,
            after_ok: vec![gpusched_model::JobId(1)],
            after: vec![gpusched_model::JobId(2)],
        };
        let keys = |v: Value| -> BTreeSet<String> {
            match v {
                Value::Object(o) => o.keys().cloned().collect(),
                _ => BTreeSet::new(),
            }
        };
        let model = keys(serde_json::to_value(&spec).unwrap());
        assert!(model.contains("command") && model.contains("checkpoint_signal"));
        let file: FileSpec = serde_json::from_value(serde_json::to_value(&spec).unwrap()).unwrap();
        let ours = serde_json::to_value(&file).unwrap();
        assert_eq!(keys(ours.clone()), model);
        // And the values come through as the model has them.
        assert_eq!(serde_json::from_value::<JobSpec>(ours).unwrap(), spec);
        for f in &model {
            assert!(known_field(f).is_some(), "{f}");
            assert!(flag_for(f).is_some(), "{f} has no flag");
        }
    }

    #[test]
    fn line_and_column_of_an_offset() {
        let t = "a = 1\nbé = 2\n";
        assert_eq!(line_col(t, 0), (1, 1));
        assert_eq!(line_col(t, 4), (1, 5));
        assert_eq!(line_col(t, 6), (2, 1));
        // After the two-byte é: the third character of the line.
        assert_eq!(line_col(t, 9), (2, 3));
        assert_eq!(line_col(t, 8), (2, 2));
        assert_eq!(line_col(t, 999), (3, 1));
    }

    #[test]
    fn positions_are_said_once() {
        assert_eq!(
            strip_position("invalid type: string \"x\" at line 3 column 7", 3, 7),
            "invalid type: string \"x\""
        );
        assert_eq!(strip_position("eof", 1, 1), "eof");
    }

    #[test]
    fn keys_are_found_before_values_and_in_text() {
        assert_eq!(key_before("workers = \"two\"", 11), Some("workers".into()));
        assert_eq!(
            key_before(r#"{"tenant": "a", "gpus_per_worker": "8"}"#, 39),
            Some("gpus_per_worker".into())
        );
        assert_eq!(
            key_before("interval_s = \"x\"", 14),
            Some("checkpoint.interval_s".into())
        );
        assert_eq!(key_before("memory = 1", 10), None);
        let yaml = "tenant: a\n# gpus_per_worker: 1\nworkers: 2\n  gpus_per_worker: 0\n";
        assert_eq!(locate_key(yaml, "gpus_per_worker"), Some((2, 3)));
        assert_eq!(
            locate_key("x\ngpus_per_worker = 0", "gpus_per_worker"),
            Some((2, 1))
        );
        assert_eq!(
            locate_key(r#"{"a": 1, "gpus_per_worker": 0}"#, "gpus_per_worker"),
            Some((1, 10))
        );
        assert_eq!(locate_key("my_workers = 1", "workers"), None);
        assert_eq!(
            locate_key("[checkpoint]\ninterval_s = 0\n", "checkpoint.interval_s"),
            Some((2, 1))
        );
    }

    fn err(name: &str, format: Format, text: &str) -> String {
        match SpecFile::from_text(name, format, text) {
            Ok(_) => panic!("{text:?} was accepted"),
            Err(e) => e.0,
        }
    }

    #[test]
    fn an_unknown_field_is_named_with_its_place_in_the_file() {
        let yaml = "tenant: vision\nworkers: 1\nmemory: 80g\n";
        let e = err("job.yaml", Format::Yaml, yaml);
        assert!(
            e.starts_with("job.yaml:3:1: unknown field \"memory\"; expected one of tenant, "),
            "{e}"
        );
        let toml = "tenant = \"vision\"\n\nmemory = 1\n";
        let e = err("job.toml", Format::Toml, toml);
        assert!(
            e.starts_with("job.toml:3:1: unknown field \"memory\""),
            "{e}"
        );
        let json = "{\"tenant\": \"vision\",\n  \"memory\": 1}";
        let e = err("job.json", Format::Json, json);
        assert!(
            e.starts_with("job.json:2:3: unknown field \"memory\""),
            "{e}"
        );
    }

    #[test]
    fn a_wrong_type_names_the_field_its_flag_and_line() {
        let toml = "tenant = \"vision\"\nworkers = 1\ngpus_per_worker = \"eight\"\n";
        let e = err("job.toml", Format::Toml, toml);
        assert!(
            e.starts_with("job.toml:3:19: gpus_per_worker (--gpus): invalid type: string"),
            "{e}"
        );
        let yaml = "tenant: vision\nworkers: two\n";
        let e = err("job.yaml", Format::Yaml, yaml);
        assert!(
            e.starts_with("job.yaml:2:10: workers (--workers): invalid type: string"),
            "{e}"
        );
        let json = "{\"tenant\": \"vision\", \"workers\": \"2\"}";
        let e = err("job.json", Format::Json, json);
        assert!(e.starts_with("job.json:1:"), "{e}");
        assert!(e.contains("workers (--workers): invalid type"), "{e}");
        let e = err("c.toml", Format::Toml, "[checkpoint]\ninterval_s = 1\n");
        assert!(e.starts_with("c.toml:1:"), "{e}");
        assert!(e.contains("missing field \"duration_s\""), "{e}");
    }

    #[test]
    fn broken_syntax_says_where() {
        let e = err("bad.yaml", Format::Yaml, "tenant: [");
        assert!(e.starts_with("bad.yaml:"), "{e}");
        let e = err("bad.json", Format::Json, "{\"tenant\": ");
        assert!(e.starts_with("bad.json:1:"), "{e}");
        let e = err("bad.toml", Format::Toml, "tenant = \n");
        assert!(e.starts_with("bad.toml:1:"), "{e}");
    }

    #[test]
    fn flags_override_the_file_and_the_model_checks_the_result() {
        let f = SpecFile::from_text(
            "job.yaml",
            Format::Yaml,
            "tenant: vision\nworkers: 2\ngpus_per_worker: 0\n",
        )
        .unwrap();
        // The file's zero, found in the file.
        let e = body(Some(&f), &SpecFlags::default()).unwrap_err().0;
        assert_eq!(
            e,
            "job.yaml:3:1: gpus_per_worker (--gpus): must be at least 1"
        );
        // A flag over it fixes it; the flag's own zero names the flag.
        let flags = SpecFlags {
            gpus: Some(4),
            ..SpecFlags::default()
        };
        let v = body(Some(&f), &flags).unwrap();
        assert_eq!(v["gpus_per_worker"], 4);
        assert_eq!(v["workers"], 2);
        let flags = SpecFlags {
            tenant: Some("vision".into()),
            gpus: Some(0),
            ..SpecFlags::default()
        };
        assert_eq!(
            body(None, &flags).unwrap_err().0,
            "--gpus: must be at least 1"
        );
    }

    #[test]
    fn required_fields_name_the_flag_and_the_file_field() {
        let flags = SpecFlags {
            gpus: Some(1),
            ..SpecFlags::default()
        };
        assert_eq!(
            body(None, &flags).unwrap_err().0,
            "--tenant is required (or \"tenant\" in the spec file)"
        );
        let flags = SpecFlags {
            tenant: Some("vision".into()),
            ..SpecFlags::default()
        };
        assert_eq!(
            body(None, &flags).unwrap_err().0,
            "--gpus is required (or \"gpus_per_worker\" in the spec file)"
        );
        let v = body(
            None,
            &SpecFlags {
                tenant: Some("vision".into()),
                gpus: Some(2),
                ..SpecFlags::default()
            },
        )
        .unwrap();
        assert_eq!(
            v,
            json!({"tenant": "vision", "gpus_per_worker": 2, "workers": 1})
        );
    }

    /// The submit flags as clap parses them (`submit` alone).
    fn submit(args: &[&str]) -> Result<SpecFlags, clap::Error> {
        #[derive(clap::Parser)]
        struct Submit {
            #[command(flatten)]
            flags: SpecFlags,
        }
        let argv = std::iter::once("submit").chain(args.iter().copied());
        <Submit as clap::Parser>::try_parse_from(argv).map(|s| s.flags)
    }

    #[test]
    fn the_command_is_everything_after_the_double_dash() {
        let f = submit(&[
            "-t", "vision", "-G", "2", "--", "python", "train.py", "--lr", "3e-4", "-G", "9",
        ])
        .unwrap();
        assert_eq!(f.command, ["python", "train.py", "--lr", "3e-4", "-G", "9"]);
        assert_eq!(f.gpus, Some(2));
        // Without `--`, a word is not taken as the command.
        assert!(submit(&["-t", "vision", "python"]).is_err());
        let v = body(None, &f).unwrap();
        assert_eq!(
            v["command"],
            json!(["python", "train.py", "--lr", "3e-4", "-G", "9"])
        );
        // No command: none is sent (a job for a simulated agent).
        let v = body(None, &submit(&["-t", "vision", "-G", "1"]).unwrap()).unwrap();
        assert!(v.get("command").is_none(), "{v}");
        // An empty program is the model's to refuse, named as the command.
        let f = submit(&["-t", "vision", "-G", "1", "--", " "]).unwrap();
        assert_eq!(
            body(None, &f).unwrap_err().0,
            "-- COMMAND: the program must not be empty"
        );
    }

    #[test]
    fn env_workdir_and_signal_flags_are_checked_as_they_are_parsed() {
        let f = submit(&[
            "--env",
            "A=1",
            "--env",
            "B=x=y",
            "--env",
            "C=",
            "--workdir",
            "/tmp",
            "--checkpoint-signal",
            "usr2",
        ])
        .unwrap();
        assert_eq!(
            f.env,
            [
                ("A".into(), "1".into()),
                ("B".into(), "x=y".into()),
                ("C".into(), String::new())
            ]
        );
        assert_eq!(f.workdir.as_deref(), Some("/tmp"));
        // Kept as written: the server stores it so.
        assert_eq!(f.checkpoint_signal.as_deref(), Some("usr2"));
        for sig in ["SIGUSR1", "USR2", "12", "sigterm"] {
            assert!(submit(&["--checkpoint-signal", sig]).is_ok(), "{sig}");
        }

        let usage = |args: &[&str]| -> String {
            match submit(args) {
                Ok(_) => panic!("{args:?} was accepted"),
                Err(e) => {
                    assert_eq!(e.exit_code(), 2, "{args:?}");
                    e.to_string()
                }
            }
        };
        let e = usage(&["--env", "BAD"]);
        assert!(e.contains("--env") && e.contains("KEY=VALUE"), "{e}");
        let e = usage(&["--env", "=1"]);
        assert!(
            e.contains("--env") && e.contains("must not be empty"),
            "{e}"
        );
        let e = usage(&["--checkpoint-signal", "SIGKILL"]);
        assert!(e.contains("--checkpoint-signal"), "{e}");
        assert!(e.contains("SIGUSR1, SIGUSR2"), "{e}");
        let e = usage(&["--checkpoint-signal", "9"]);
        assert!(e.contains("--checkpoint-signal"), "{e}");
        let e = usage(&["--workdir", ""]);
        assert!(e.contains("--workdir"), "{e}");
    }

    #[test]
    fn flags_override_the_files_command_and_merge_into_its_env() {
        let f = SpecFile::from_text(
            "job.yaml",
            Format::Yaml,
            "tenant: vision\nworkers: 1\ngpus_per_worker: 1\ncommand: [python, train.py]\n\
             env: {A: \"1\", B: \"2\"}\nworking_dir: /data\ncheckpoint_signal: USR2\n",
        )
        .unwrap();
        let v = body(Some(&f), &SpecFlags::default()).unwrap();
        assert_eq!(v["command"], json!(["python", "train.py"]));
        assert_eq!(v["env"], json!({"A": "1", "B": "2"}));
        assert_eq!(v["working_dir"], "/data");
        assert_eq!(v["checkpoint_signal"], "USR2");
        let flags = submit(&[
            "--env",
            "B=3",
            "--env",
            "C=4",
            "--workdir",
            "/tmp",
            "--checkpoint-signal",
            "SIGTERM",
            "--",
            "sh",
            "-c",
            "echo hi",
        ])
        .unwrap();
        let v = body(Some(&f), &flags).unwrap();
        assert_eq!(v["command"], json!(["sh", "-c", "echo hi"]));
        assert_eq!(v["env"], json!({"A": "1", "B": "3", "C": "4"}));
        assert_eq!(v["working_dir"], "/tmp");
        assert_eq!(v["checkpoint_signal"], "SIGTERM");
        // TOML and JSON say the same.
        let t = SpecFile::from_text(
            "job.toml",
            Format::Toml,
            "tenant = \"v\"\nworkers = 1\ngpus_per_worker = 1\ncommand = [\"python\"]\n\
             [env]\nA = \"1\"\n",
        )
        .unwrap();
        let v = body(Some(&t), &SpecFlags::default()).unwrap();
        assert_eq!(
            (&v["command"], &v["env"]),
            (&json!(["python"]), &json!({"A": "1"}))
        );
    }

    #[test]
    fn the_new_fields_errors_say_where_in_the_file() {
        let e = err(
            "job.yaml",
            Format::Yaml,
            "tenant: vision\ncommand: python\n",
        );
        assert!(
            e.starts_with("job.yaml:2:10: command (-- COMMAND): invalid type: string"),
            "{e}"
        );
        let e = err(
            "job.toml",
            Format::Toml,
            "tenant = \"v\"\ncommand = \"python\"\n",
        );
        assert!(
            e.starts_with("job.toml:2:11: command (-- COMMAND): invalid type: string"),
            "{e}"
        );
        let e = err(
            "job.json",
            Format::Json,
            "{\"tenant\": \"v\",\n \"command\": \"python\"}",
        );
        assert!(e.starts_with("job.json:2:"), "{e}");
        assert!(
            e.contains("command (-- COMMAND): invalid type: string"),
            "{e}"
        );
        let e = err(
            "job.yaml",
            Format::Yaml,
            "tenant: vision\nenv:\n  PORT: [1]\n",
        );
        assert!(
            e.starts_with("job.yaml:3:9: env.PORT (--env): invalid type: sequence"),
            "{e}"
        );
        // YAML reads a plain scalar as the string it spells; TOML's
        // numbers are not strings.
        let f = SpecFile::from_text("job.yaml", Format::Yaml, "env:\n  PORT: 8080\n").unwrap();
        assert_eq!(f.fields.env, Some([("PORT".into(), "8080".into())].into()));
        let e = err(
            "job.toml",
            Format::Toml,
            "tenant = \"v\"\n[env]\nPORT = 8080\n",
        );
        assert!(e.starts_with("job.toml:3:8: "), "{e}");
        assert!(e.contains("invalid type: integer"), "{e}");
        let e = err("job.yaml", Format::Yaml, "tenant: vision\nenv: [A]\n");
        assert!(
            e.starts_with("job.yaml:2:6: env (--env): invalid type: sequence"),
            "{e}"
        );
        // The model's rules, found in the file.
        let f = SpecFile::from_text(
            "job.yaml",
            Format::Yaml,
            "tenant: vision\nworkers: 1\ngpus_per_worker: 1\ncheckpoint_signal: KILL\n",
        )
        .unwrap();
        let e = body(Some(&f), &SpecFlags::default()).unwrap_err().0;
        assert!(
            e.starts_with("job.yaml:4:1: checkpoint_signal (--checkpoint-signal): must be one of"),
            "{e}"
        );
        let f = SpecFile::from_text(
            "job.yaml",
            Format::Yaml,
            "tenant: vision\nworkers: 1\ngpus_per_worker: 1\ncommand: [\"\"]\n",
        )
        .unwrap();
        assert_eq!(
            body(Some(&f), &SpecFlags::default()).unwrap_err().0,
            "job.yaml:4:1: command (-- COMMAND): the program must not be empty"
        );
    }
}
