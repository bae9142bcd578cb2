//! `gpusched simulate --timeline-svg` and `--why-preempted` on the reclaim
//! scenario, checked against the same run's log (`--events-out` in the same
//! command): the SVG is well-formed XML with one row per job a plan
//! involved, its victims' bars show them stopping; the victim search run
//! again chooses exactly the logged victims; bad input names the flag;
//! output whose reader went away ends the command quietly.
#![allow(clippy::unwrap_used)]

mod exit;
use exit::{ok, refused};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output};

use gpusched_events::Event;

fn simulate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpusched"))
        .args(["simulate", "--scenario", "reclaim"])
        .args(args)
        .output()
        .unwrap()
}

fn events(path: &Path) -> Vec<Event> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Every plan: (its index in the log, beneficiary, victims).
fn plans(log: &[Event]) -> Vec<(usize, u64, Vec<u64>)> {
    log.iter()
        .enumerate()
        .filter_map(|(i, e)| match e {
            Event::PreemptionPlanned {
                beneficiary,
                victims,
                ..
            } => Some((i, beneficiary.0, victims.iter().map(|v| v.job.0).collect())),
            _ => None,
        })
        .collect()
}

/// An element of a parsed document.
#[derive(Debug, Default)]
struct Element {
    name: String,
    attrs: BTreeMap<String, String>,
    children: Vec<Element>,
    text: String,
}

impl Element {
    fn descendants(&self) -> Vec<&Element> {
        let mut out = Vec::new();
        for c in &self.children {
            out.push(c);
            out.extend(c.descendants());
        }
        out
    }

    fn class(&self) -> &str {
        self.attrs.get("class").map_or("", String::as_str)
    }
}

/// Checks entity references in text or an attribute value.
/// The classes (less `prefix`) of the `name` elements under `row` whose
/// class starts with `prefix`: a row's bar or mark kinds.
fn classes<'a>(row: &'a Element, name: &str, prefix: &str) -> Vec<&'a str> {
    row.descendants()
        .into_iter()
        .filter(|e| e.name == name && e.class().starts_with(prefix))
        .map(|e| &e.class()[prefix.len()..])
        .collect()
}

fn check_entities(s: &str) {
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        let tail = &rest[i + 1..];
        let end = tail.find(';').unwrap_or_else(|| panic!("bare & in {s:?}"));
        let name = &tail[..end];
        assert!(
            ["amp", "lt", "gt", "quot", "apos"].contains(&name)
                || name.starts_with('#') && name.len() > 1,
            "unknown entity &{name}; in {s:?}"
        );
        rest = &tail[end + 1..];
    }
    assert!(!s.contains('<'), "raw < in {s:?}");
}

/// Parses a start tag's inside (`name a="1" b='2'`), checking its
/// attributes are quoted and not repeated.
fn start_tag(inside: &str) -> Element {
    let inside = inside.trim();
    let name_end = inside.find(char::is_whitespace).unwrap_or(inside.len());
    let mut el = Element {
        name: inside[..name_end].to_string(),
        ..Element::default()
    };
    assert!(!el.name.is_empty(), "a tag without a name: <{inside}>");
    let mut rest = inside[name_end..].trim_start();
    while !rest.is_empty() {
        let eq = rest
            .find('=')
            .unwrap_or_else(|| panic!("bad attribute in <{inside}>"));
        let key = rest[..eq].trim().to_string();
        let after = rest[eq + 1..].trim_start();
        let quote = after.chars().next().unwrap();
        assert!(
            quote == '"' || quote == '\'',
            "unquoted value in <{inside}>"
        );
        let close = after[1..]
            .find(quote)
            .unwrap_or_else(|| panic!("unclosed value in <{inside}>"));
        let value = &after[1..1 + close];
        check_entities(value);
        assert!(
            el.attrs.insert(key.clone(), value.to_string()).is_none(),
            "{key} twice in <{inside}>"
        );
        rest = after[close + 2..].trim_start();
    }
    el
}

/// A small well-formedness check and parser: every tag closed in order,
/// attributes quoted, entities known, one root element. Returns the root.
fn parse_xml(doc: &str) -> Element {
    let mut stack = vec![Element::default()];
    let mut rest = doc;
    while let Some(lt) = rest.find('<') {
        let text = &rest[..lt];
        check_entities(text);
        stack.last_mut().unwrap().text.push_str(text);
        rest = &rest[lt..];
        if let Some(r) = rest.strip_prefix("<?") {
            rest = &r[r.find("?>").unwrap() + 2..];
            continue;
        }
        if let Some(r) = rest.strip_prefix("<!--") {
            rest = &r[r.find("-->").unwrap() + 3..];
            continue;
        }
        let gt = rest.find('>').expect("an unclosed tag");
        let tag = &rest[1..gt];
        rest = &rest[gt + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            let el = stack.pop().unwrap();
            assert_eq!(el.name, name.trim(), "</{name}> closes <{}>", el.name);
            stack.last_mut().unwrap().children.push(el);
        } else if let Some(inside) = tag.strip_suffix('/') {
            let el = start_tag(inside);
            stack.last_mut().unwrap().children.push(el);
        } else {
            stack.push(start_tag(tag));
        }
    }
    assert!(rest.trim().is_empty(), "text after the root: {rest:?}");
    assert_eq!(stack.len(), 1, "unclosed: <{}>", stack.last().unwrap().name);
    let mut doc = stack.pop().unwrap();
    assert_eq!(doc.children.len(), 1, "one root element");
    doc.children.pop().unwrap()
}

#[test]
fn the_parser_refuses_what_is_not_well_formed() {
    for bad in [
        "<svg><g></svg></g>",
        "<svg><g></svg>",
        "<svg a=1></svg>",
        "<svg>a & b</svg>",
        "<svg/><svg/>",
    ] {
        let caught = std::panic::catch_unwind(|| parse_xml(bad));
        assert!(caught.is_err(), "accepted {bad}");
    }
    let root = parse_xml(r#"<svg a="&lt;1&gt;"><g><rect/></g>t &amp; u</svg>"#);
    assert_eq!(root.descendants().len(), 2);
}

#[test]
fn timeline_svg_draws_one_row_per_job_a_plan_involved() {
    let dir = tempfile::tempdir().unwrap();
    let svg_path = dir.path().join("reclaim.svg");
    let log_path = dir.path().join("events.jsonl");
    let out = ok(&simulate(&[
        "--timeline-svg",
        svg_path.to_str().unwrap(),
        "--events-out",
        log_path.to_str().unwrap(),
    ]));
    let log = events(&log_path);
    let plans = plans(&log);
    let victims: BTreeSet<u64> = plans.iter().flat_map(|p| p.2.clone()).collect();
    let beneficiaries: BTreeSet<u64> = plans.iter().map(|p| p.1).collect();
    let involved: BTreeSet<u64> = victims.union(&beneficiaries).copied().collect();
    assert!(plans.len() > 1 && victims.len() > plans.len(), "{plans:?}");
    assert!(
        out.contains(&format!(
            "timeline of {n} of {n} preemption plans, {} jobs,",
            involved.len(),
            n = plans.len()
        )),
        "{out}"
    );

    let root = parse_xml(&std::fs::read_to_string(&svg_path).unwrap());
    assert_eq!(root.name, "svg");
    let title = root.children.iter().find(|c| c.name == "title").unwrap();
    assert!(
        title.text.contains(&format!("{} plans", plans.len())),
        "{}",
        title.text
    );
    let rows: Vec<&Element> = root
        .descendants()
        .into_iter()
        .filter(|e| e.name == "g" && e.class() == "row")
        .collect();
    let row_jobs: Vec<u64> = rows
        .iter()
        .map(|r| r.attrs["data-job"].parse().unwrap())
        .collect();
    assert_eq!(row_jobs.len(), involved.len(), "one row per job");
    assert_eq!(row_jobs.iter().copied().collect::<BTreeSet<_>>(), involved);
    // In plan order: the first plan's beneficiary, then its victims.
    assert_eq!(row_jobs[0], plans[0].1);
    assert_eq!(row_jobs[1..=plans[0].2.len()], plans[0].2[..]);

    for row in rows {
        let job: u64 = row.attrs["data-job"].parse().unwrap();
        let role = &row.attrs["data-role"];
        let label = row.children.iter().find(|c| c.name == "text").unwrap();
        let bars = classes(row, "rect", "bar ");
        let tooltips = row
            .descendants()
            .iter()
            .filter(|e| e.name == "title")
            .count();
        assert!(tooltips > bars.len(), "bars and marks have tooltips");
        if victims.contains(&job) {
            assert_eq!(role, "victim", "job {job}");
            assert!(label.text.ends_with("· batch · victim"), "{}", label.text);
            assert!(bars.contains(&"preempting"), "job {job}: {bars:?}");
            let marks = classes(row, "g", "mark ");
            assert!(marks.contains(&"job_preempted"), "job {job}: {marks:?}");
        } else {
            assert_eq!(role, "beneficiary", "job {job}");
            assert!(label.text.contains("· research · owner"), "{}", label.text);
            assert!(!bars.contains(&"preempting"), "job {job}: {bars:?}");
            assert!(bars.contains(&"running"), "job {job}: {bars:?}");
        }
    }

    // A window asked for: the axis is that window.
    let out = ok(&simulate(&[
        "--timeline-svg",
        svg_path.to_str().unwrap(),
        "--timeline-from",
        "10700",
        "--timeline-to",
        "11000",
    ]));
    assert!(out.contains("simulated 10700 s to 11000 s"), "{out}");
    parse_xml(&std::fs::read_to_string(&svg_path).unwrap());
}

/// The `VICTIMS` cell of the chosen set (`N *`) in a why-preempted report.
fn chosen_set(report: &str) -> String {
    let line = report
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("*"))
        .unwrap_or_else(|| panic!("no chosen set in:\n{report}"));
    let cells: Vec<&str> = line.split_whitespace().collect();
    cells[cells.len() - 3].to_string()
}

#[test]
fn why_preempted_in_a_run_chooses_the_logged_victims() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("events.jsonl");
    let log_arg = log_path.to_str().unwrap();
    // The first plan: one victim; a gang's: several.
    let out = ok(&simulate(&["--events-out", log_arg]));
    assert!(out.contains("state_hash: "), "{out}");
    let log = events(&log_path);
    let all = plans(&log);
    let single = all.first().unwrap().clone();
    let gang = all.iter().find(|p| p.2.len() > 1).unwrap().clone();
    for (i, beneficiary, victims) in [single, gang] {
        let victim = *victims.last().unwrap();
        let text = ok(&simulate(&["--why-preempted", &victim.to_string()]));
        assert!(
            text.contains(&format!("job {victim} was chosen as a victim at t=",))
                && text.contains(&format!(
                    "(seq {}, plan 1 of 1) for job {beneficiary}: tenant research reclaimed",
                    i + 1
                )),
            "{text}"
        );
        let logged = victims
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(chosen_set(&text), logged, "{text}");
        assert!(!text.contains("note: run again"), "{text}");
        let stopped = log
            .iter()
            .position(|e| matches!(e, Event::JobPreempted { job, .. } if job.0 == victim))
            .unwrap();
        assert!(
            text.contains(&format!("it stopped: seq {} at t=", stopped + 1)),
            "{text}"
        );
        assert!(text.contains("who got its GPUs:"), "{text}");
        assert!(
            text.contains(&format!("job {beneficiary} bound to ")),
            "{text}"
        );
    }
}

#[test]
fn bad_input_names_the_flag() {
    let err = refused(&simulate(&["--why-preempted", "99999"]));
    assert!(
        err.contains("--why-preempted: no job 99999 in this run"),
        "{err}"
    );
    // A job no plan chose: a beneficiary of one.
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("events.jsonl");
    ok(&simulate(&["--events-out", log_path.to_str().unwrap()]));
    let all = plans(&events(&log_path));
    let owner = all
        .iter()
        .map(|p| p.1)
        .find(|b| !all.iter().any(|p| p.2.contains(b)))
        .unwrap();
    let err = refused(&simulate(&["--why-preempted", &owner.to_string()]));
    assert!(
        err.contains(&format!(
            "--why-preempted: job {owner}: no preemption plan in this run chose it"
        )),
        "{err}"
    );
    let err = refused(&simulate(&[
        "--timeline-svg",
        "/dev/null",
        "--timeline-from",
        "200",
        "--timeline-to",
        "100",
    ]));
    assert!(
        err.contains("--timeline-from: 200 s is not before --timeline-to 100 s"),
        "{err}"
    );
    let nowhere = dir.path().join("no-such-dir").join("t.svg");
    let err = refused(&simulate(&["--timeline-svg", nowhere.to_str().unwrap()]));
    assert!(
        err.contains(&format!("--timeline-svg {}", nowhere.display())),
        "{err}"
    );
    let out = simulate(&["--timeline-from", "100"]);
    assert_eq!(out.status.code(), Some(2), "a window needs --timeline-svg");
}

/// `gpusched … | head`: output whose reader has gone ends the command
/// quietly with 141 (a shell's status for SIGPIPE), whether it was written
/// by `println!` (the report) or through an I/O error (`--events-out`).
#[test]
fn output_whose_reader_went_away_ends_quietly_with_141() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let spawn = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_gpusched"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // The reader is gone before the report is printed.
    let mut report = spawn(&["simulate", "--scenario", "reclaim"]);
    drop(report.stdout.take());
    // The reader takes one line of the log, then goes.
    let mut log = spawn(&[
        "simulate",
        "--synthetic",
        "2000",
        "--events-out",
        "/dev/stdout",
    ]);
    let mut first = String::new();
    BufReader::new(log.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("topology_configured"), "{first}");
    for child in [report, log] {
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "{stderr}");
        assert!(
            !stderr.contains("panicked") && !stderr.contains("error"),
            "{stderr}"
        );
    }
}
