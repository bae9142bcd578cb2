//! `gpusched logs`: what one worker of a job wrote, once or followed.
//!
//! Owns: reading `GET /v1/jobs/{id}/logs?worker=&stream=&offset=` page by
//! page from an offset (within one run of the job, when the server says
//! which), printing each page's text as the server gives it, and the rules
//! for when `--follow` waits, moves on to the job's next run, or stops
//! (pure functions: [`next_step`], [`waits_for_a_start`]).
//! Must never: read logs any other way than through the API, change the
//! text it prints, or stop following while the worker may still write.

use std::io::Write;
use std::time::Duration;

use anyhow::Result;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::client::{exit, fail, Client, Conn};

/// How long `--follow` waits before asking again when nothing was new.
pub const POLL: Duration = Duration::from_millis(500);

/// `gpusched logs`.
#[derive(clap::Args, Debug)]
pub struct LogsArgs {
    /// Job id.
    job: u64,
    /// Which worker of the gang, from 0.
    #[arg(long, short = 'w', value_name = "N", default_value_t = 0)]
    worker: u32,
    /// The worker's standard error instead of its standard output.
    #[arg(long)]
    err: bool,
    /// Keep printing what the worker writes until it has stopped and the
    /// job has ended.
    #[arg(long, short = 'f')]
    follow: bool,
    #[command(flatten)]
    conn: Conn,
}

impl LogsArgs {
    /// The stream asked for, as the API names it.
    fn stream(&self) -> &'static str {
        if self.err {
            "err"
        } else {
            "out"
        }
    }

    /// The request's query from `offset` on, of `run` (default: the
    /// latest).
    fn query(&self, run: Option<u32>, offset: u64) -> Vec<(&'static str, String)> {
        let mut q = vec![
            ("worker", self.worker.to_string()),
            ("stream", self.stream().to_string()),
            ("offset", offset.to_string()),
        ];
        if let Some(r) = run {
            q.push(("run", r.to_string()));
        }
        q
    }
}

/// One answer of the logs route.
#[derive(Debug, Deserialize, PartialEq, Eq)]
pub struct Page {
    /// The text from the offset asked for.
    pub text: String,
    /// Where the next read starts.
    pub next_offset: u64,
    /// Whether the worker's process is running (it may write more).
    pub running: bool,
    /// Which run (n-th start) of the job this is, where the server says;
    /// offsets count within a run.
    #[serde(default)]
    pub run: Option<u32>,
}

/// What to do after a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Done.
    Stop,
    /// Read the next page at once (this one brought text: more may be
    /// there).
    ReadOn,
    /// Nothing new: wait [`POLL`], then read again.
    Wait,
    /// Nothing new and the worker is not running: ask whether the job has
    /// ended (it may only be waiting to run again), then read once more.
    CheckJob,
}

/// The stop rule. Without `--follow`: read until a page brings nothing.
/// With it: stop only when a page brings nothing, the worker is not
/// running, and the job was already seen ended before that page was asked
/// for (so nothing it wrote before it ended is missed); a job that stopped
/// but has not ended (preempted, requeued) may run and write again.
pub fn next_step(follow: bool, progressed: bool, running: bool, ended_before: bool) -> Step {
    if progressed {
        Step::ReadOn
    } else if !follow {
        Step::Stop
    } else if running {
        Step::Wait
    } else if ended_before {
        Step::Stop
    } else {
        Step::CheckJob
    }
}

/// Whether a page read from `offset` brought anything.
fn progressed(page: &Page, offset: u64) -> bool {
    !page.text.is_empty() || page.next_offset > offset
}

/// Whether a job's state (`GET /v1/jobs/{id}`) is one it never leaves.
pub fn ended(state: &str) -> bool {
    matches!(state, "succeeded" | "failed" | "cancelled" | "rejected")
}

/// Whether `--follow` waits through a `no_logs` answer: only while the job
/// (`GET /v1/jobs/{id}`) has not started yet and may still; a job that ran
/// and has none will not get any by waiting.
pub fn waits_for_a_start(job: &Value) -> bool {
    let state = job.get("state").and_then(Value::as_str).unwrap_or("");
    let starts = job.get("starts").and_then(Value::as_u64).unwrap_or(0);
    !ended(state) && starts == 0
}

/// Whether a page of the latest run shows a newer run than the one read.
fn newer_run(latest: &Page, reading: Option<u32>) -> bool {
    matches!((latest.run, reading), (Some(l), Some(r)) if l > r)
}

/// A non-2xx answer the logs route words its own way.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// `no_logs`: the server's message (exit 3, or a wait under
    /// `--follow` while the job has not started).
    NoLogs(String),
    /// A server without the route (exit 3).
    NoRoute(String),
}

/// How the logs route's own refusals read; `None`: the common refusal.
fn logs_refusal(status: u16, text: &str) -> Option<Refusal> {
    let body: Value = serde_json::from_str(text).ok()?;
    let code = body.pointer("/error/code").and_then(Value::as_str);
    let message = body.pointer("/error/message").and_then(Value::as_str);
    match (status, code, message) {
        (404, Some("no_logs"), Some(m)) => Some(Refusal::NoLogs(m.to_string())),
        (404, Some("not_found"), Some("no such route")) => Some(Refusal::NoRoute(
            "404: this server does not serve job logs (GET /v1/jobs/{id}/logs)".to_string(),
        )),
        _ => None,
    }
}

/// One answer of the logs route.
enum Answer {
    Page(Page),
    /// `no_logs`: the server's message.
    NoLogs(String),
}

/// Reads one page of `run` (default: the latest) from `offset`.
async fn read(c: &Client, a: &LogsArgs, run: Option<u32>, offset: u64) -> Result<Answer> {
    let req = c
        .request(reqwest::Method::GET, &format!("/v1/jobs/{}/logs", a.job))
        .query(&a.query(run, offset));
    let resp = c.open(req).await?;
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    if !(200..300).contains(&status) {
        return match logs_refusal(status, &text) {
            Some(Refusal::NoLogs(m)) => Ok(Answer::NoLogs(m)),
            Some(Refusal::NoRoute(m)) => Err(fail(exit::NOT_FOUND, m)),
            None => Err(c.refused(status, &text)),
        };
    }
    serde_json::from_str(&text).map(Answer::Page).map_err(|e| {
        fail(
            exit::ERROR,
            format!("the server's logs answer is not {{text, next_offset, running}}: {e}"),
        )
    })
}

/// `gpusched logs JOB`: prints the worker's text; `--follow` keeps
/// printing until the stop rule ([`next_step`]) says done, reading each
/// run of the job in turn. A closed stdout (`| head`) ends it quietly.
pub async fn logs(a: LogsArgs) -> Result<()> {
    let c = a.conn.client()?;
    let job_path = format!("/v1/jobs/{}", a.job);
    let mut out = std::io::stdout();
    // The run being read (pinned once the server names it) and where.
    let mut run: Option<u32> = None;
    let mut offset = 0;
    let mut ended_before = false;
    let mut told_waiting = false;
    loop {
        let p = match read(&c, &a, run, offset).await? {
            Answer::Page(p) => p,
            Answer::NoLogs(message) => {
                if a.follow && run.is_none() && waits_for_a_start(&c.get(&job_path).await?) {
                    if !told_waiting {
                        eprintln!("{message}; waiting for job {} to start", a.job);
                        told_waiting = true;
                    }
                    tokio::time::sleep(POLL).await;
                    continue;
                }
                return Err(fail(exit::NOT_FOUND, message));
            }
        };
        if run.is_none() {
            run = p.run;
        }
        let wrote = if c.json {
            let line = json!({"run": p.run, "offset": offset, "text": p.text,
                "next_offset": p.next_offset, "running": p.running});
            writeln!(out, "{line}")
        } else {
            out.write_all(p.text.as_bytes())
        };
        if wrote.and_then(|()| out.flush()).is_err() {
            return Ok(());
        }
        let step = next_step(a.follow, progressed(&p, offset), p.running, ended_before);
        offset = p.next_offset;
        match step {
            Step::Stop => return Ok(()),
            Step::ReadOn => {}
            Step::Wait => tokio::time::sleep(POLL).await,
            Step::CheckJob => {
                // This run is drained and its worker stopped. Whether the
                // job ended is asked first, so a run that started before
                // that answer is seen by the look at the latest run below.
                let job = c.get(&job_path).await?;
                let has_ended = ended(job.get("state").and_then(Value::as_str).unwrap_or(""));
                if run.is_some() {
                    if let Answer::Page(latest) = read(&c, &a, None, offset).await? {
                        if newer_run(&latest, run) {
                            run = latest.run;
                            offset = 0;
                            continue;
                        }
                    }
                }
                ended_before = has_ended;
                if !has_ended {
                    tokio::time::sleep(POLL).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        logs: LogsArgs,
    }

    fn parse(args: &[&str]) -> Result<LogsArgs, clap::Error> {
        Cmd::try_parse_from(std::iter::once("logs").chain(args.iter().copied())).map(|c| c.logs)
    }

    #[test]
    fn arguments_pick_the_job_worker_and_stream() {
        let a = parse(&["17"]).unwrap();
        assert_eq!((a.job, a.worker, a.follow), (17, 0, false));
        assert_eq!(
            a.query(None, 0),
            [
                ("worker", "0".to_string()),
                ("stream", "out".to_string()),
                ("offset", "0".to_string())
            ]
        );
        let a = parse(&["17", "--worker", "3", "--err", "-f"]).unwrap();
        assert_eq!((a.worker, a.follow), (3, true));
        assert_eq!(
            a.query(Some(2), 42)[1..],
            [
                ("stream", "err".to_string()),
                ("offset", "42".to_string()),
                ("run", "2".to_string())
            ]
        );
        for bad in [
            &[][..],
            &["x"],
            &["17", "--worker", "-1"],
            &["17", "--worker"],
        ] {
            let e = parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} was accepted"));
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn without_follow_it_reads_until_a_page_brings_nothing() {
        assert_eq!(next_step(false, true, true, false), Step::ReadOn);
        assert_eq!(next_step(false, false, true, false), Step::Stop);
        assert_eq!(next_step(false, false, false, false), Step::Stop);
    }

    #[test]
    fn follow_stops_only_once_the_worker_stopped_and_the_job_ended() {
        // New text: read on at once, whatever else holds.
        for (running, ended) in [(true, false), (false, true), (false, false)] {
            assert_eq!(next_step(true, true, running, ended), Step::ReadOn);
        }
        // Nothing new while the worker runs: wait and ask again.
        assert_eq!(next_step(true, false, true, false), Step::Wait);
        assert_eq!(next_step(true, false, true, true), Step::Wait);
        // Not running: has the job ended, or will it run again?
        assert_eq!(next_step(true, false, false, false), Step::CheckJob);
        // Seen ended before this empty page: done.
        assert_eq!(next_step(true, false, false, true), Step::Stop);
    }

    #[test]
    fn a_page_progresses_by_text_or_offset() {
        let p = |text: &str, next_offset, running| Page {
            text: text.into(),
            next_offset,
            running,
            run: None,
        };
        assert!(progressed(&p("hi\n", 3, true), 0));
        assert!(!progressed(&p("", 3, true), 3));
        assert!(progressed(&p("", 5, false), 3));
        let page: Page =
            serde_json::from_str(r#"{"text": "a\n", "next_offset": 2, "running": false}"#).unwrap();
        assert_eq!(page, p("a\n", 2, false));
    }

    #[test]
    fn follow_moves_to_a_newer_run_only() {
        let p = |run| Page {
            text: String::new(),
            next_offset: 0,
            running: false,
            run,
        };
        assert!(newer_run(&p(Some(2)), Some(1)));
        assert!(!newer_run(&p(Some(1)), Some(1)));
        assert!(!newer_run(&p(Some(1)), Some(2)));
        // A server that does not say which run: one stream, never switched.
        assert!(!newer_run(&p(None), Some(1)));
        assert!(!newer_run(&p(Some(1)), None));
        let page: Page = serde_json::from_str(
            r#"{"text": "", "next_offset": 0, "running": true, "run": 3, "worker": 0, "node": "n1"}"#,
        )
        .unwrap();
        assert_eq!(page.run, Some(3));
    }

    #[test]
    fn follow_waits_through_no_logs_only_before_the_job_starts() {
        assert!(waits_for_a_start(&json!({"state": "queued", "starts": 0})));
        assert!(waits_for_a_start(&json!({"state": "bound", "starts": 0})));
        // It ran (a simulated agent, or an agent keeping none): no wait.
        assert!(!waits_for_a_start(
            &json!({"state": "running", "starts": 1})
        ));
        assert!(!waits_for_a_start(&json!({"state": "queued", "starts": 2})));
        // Ended without running (rejected, cancelled while queued).
        assert!(!waits_for_a_start(
            &json!({"state": "rejected", "starts": 0})
        ));
        assert!(!waits_for_a_start(
            &json!({"state": "cancelled", "starts": 0})
        ));
    }

    #[test]
    fn no_logs_is_the_servers_message_and_exit_3() {
        let body = r#"{"error": {"code": "no_logs", "message": "job 17 has no command: no logs"}}"#;
        assert_eq!(
            logs_refusal(404, body),
            Some(Refusal::NoLogs(
                "job 17 has no command: no logs".to_string()
            ))
        );
        let route = r#"{"error": {"code": "not_found", "message": "no such route"}}"#;
        match logs_refusal(404, route) {
            Some(Refusal::NoRoute(msg)) => assert!(msg.contains("does not serve job logs")),
            other => panic!("{other:?}"),
        }
        // Anything else is the common refusal (a missing job, a bad worker).
        let job = r#"{"error": {"code": "not_found", "message": "no job 17"}}"#;
        assert_eq!(logs_refusal(404, job), None);
        let bad = r#"{"error": {"code": "invalid_field", "message": "worker: no worker 9", "field": "worker"}}"#;
        assert_eq!(logs_refusal(400, bad), None);
        assert_eq!(logs_refusal(404, "not json"), None);
    }

    #[test]
    fn only_final_states_end_a_job() {
        for s in ["succeeded", "failed", "cancelled", "rejected"] {
            assert!(ended(s), "{s}");
        }
        for s in [
            "submitted",
            "queued",
            "admitted",
            "bound",
            "running",
            "preempting",
            "",
        ] {
            assert!(!ended(s), "{s}");
        }
    }
}
