//! `gpusched simulate --timeline-svg`: a simulated run's preemptions as an
//! SVG timeline. One row per job a `PreemptionPlanned` event involved (its
//! beneficiary, then its victims), the jobs of the first plans in log
//! order up to `MAX_ROWS`; the x axis is the run's virtual time; each row
//! shows the bars and marks `gpusched_core::explain::gantt` gives for the
//! job, coloured by kind, with a tooltip (`<title>`) each.
//!
//! Owns: which jobs get a row, the time window (by default from just
//! before the first plan shown to just after its last beneficiary started
//! or victim stopped), and writing the SVG by hand as text, every text
//! escaped for XML.
//!
//! Must never: decide or infer anything about the run (bars and marks are
//! the gantt's, roles and times the log's), read a clock, or write
//! anywhere: it returns the document, and the caller writes the file.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use gpusched_core::explain::{self, Bar, Lane, Mark};
use gpusched_core::State;
use gpusched_events::{Event, PreemptionCause};
use gpusched_model::{JobId, Timestamp};

/// The most rows drawn; the jobs of later plans are counted as left out.
pub const MAX_ROWS: usize = 48;

const WIDTH: f64 = 1200.0;
const LABEL_W: f64 = 290.0;
const RIGHT_PAD: f64 = 20.0;
const TOP: f64 = 118.0;
const ROW_H: f64 = 22.0;
const BAR_H: f64 = 12.0;
const BOTTOM: f64 = 40.0;

/// The x axis asked for; `None` ends are chosen around the plans shown.
#[derive(Clone, Copy, Debug, Default)]
pub struct Window {
    /// The axis' start.
    pub from: Option<Timestamp>,
    /// The axis' end.
    pub to: Option<Timestamp>,
}

impl Window {
    /// The axis: the ends asked for, the default's for the others; an end
    /// left to the default that would not be after the other keeps the
    /// default's span.
    fn resolve(self, (from, to): (Timestamp, Timestamp)) -> Axis {
        let span = to.0.saturating_sub(from.0).max(1000);
        match (self.from, self.to) {
            (Some(f), None) if f >= to => Axis {
                from: f,
                to: Timestamp(f.0 + span),
            },
            (None, Some(t)) if t <= from => Axis {
                from: Timestamp(t.0.saturating_sub(span)),
                to: t,
            },
            (f, t) => Axis {
                from: f.unwrap_or(from),
                to: t.unwrap_or(to),
            },
        }
    }
}

/// The document and what it shows.
#[derive(Debug)]
pub struct Drawn {
    /// The SVG text.
    pub svg: String,
    /// Plans in the run.
    pub plans: usize,
    /// Plans whose jobs are drawn: the first ones in log order.
    pub plans_shown: usize,
    /// Rows drawn (one per job).
    pub rows: usize,
    /// Jobs some plan involved that got no row.
    pub left_out: usize,
    /// The axis drawn.
    pub from: Timestamp,
    /// Its end.
    pub to: Timestamp,
}

/// A job with a row, and the parts it played in the plans shown.
#[derive(Debug, PartialEq, Eq)]
struct Row {
    job: JobId,
    /// Beneficiary of a plan reclaiming its own lent quota.
    owner: bool,
    /// Beneficiary of another kind of plan.
    beneficiary: bool,
    victim: bool,
}

impl Row {
    fn role(&self) -> &'static str {
        match (self.owner, self.beneficiary, self.victim) {
            (true, _, false) => "owner (beneficiary)",
            (false, true, false) => "beneficiary",
            (false, false, true) => "victim",
            _ => "beneficiary, victim",
        }
    }

    fn role_key(&self) -> &'static str {
        match (self.owner || self.beneficiary, self.victim) {
            (true, true) => "both",
            (true, false) => "beneficiary",
            _ => "victim",
        }
    }
}

/// The plans and rows chosen.
#[derive(Debug)]
struct Pick {
    /// Indices in the log of the plans shown.
    plans: Vec<usize>,
    rows: Vec<Row>,
    total_plans: usize,
    /// Distinct jobs every plan involved.
    total_jobs: usize,
}

/// A plan's jobs: its beneficiary (owner when it reclaims) and victims.
fn plan_jobs(e: &Event) -> Option<Vec<(JobId, Row)>> {
    let Event::PreemptionPlanned {
        beneficiary,
        cause,
        victims,
        ..
    } = e
    else {
        return None;
    };
    let owner = matches!(cause, PreemptionCause::Reclaim { .. });
    let mut jobs = vec![(
        *beneficiary,
        Row {
            job: *beneficiary,
            owner,
            beneficiary: !owner,
            victim: false,
        },
    )];
    jobs.extend(victims.iter().map(|v| {
        (
            v.job,
            Row {
                job: v.job,
                owner: false,
                beneficiary: false,
                victim: true,
            },
        )
    }));
    Some(jobs)
}

/// The jobs of the first plans in log order, while they fit in `cap`
/// rows (a first plan larger than `cap` is cut at `cap`).
fn pick(events: &[Event], cap: usize) -> Pick {
    let mut out = Pick {
        plans: Vec::new(),
        rows: Vec::new(),
        total_plans: 0,
        total_jobs: 0,
    };
    let mut all = BTreeSet::new();
    let mut full = false;
    for (i, e) in events.iter().enumerate() {
        let Some(jobs) = plan_jobs(e) else { continue };
        out.total_plans += 1;
        all.extend(jobs.iter().map(|(j, _)| *j));
        let new: BTreeSet<JobId> = jobs
            .iter()
            .map(|(j, _)| *j)
            .filter(|j| !out.rows.iter().any(|r| r.job == *j))
            .collect();
        full = full || (!out.rows.is_empty() && out.rows.len() + new.len() > cap);
        if full {
            continue;
        }
        out.plans.push(i);
        for (job, part) in jobs {
            merge(&mut out.rows, job, part, cap);
        }
    }
    out.total_jobs = all.len();
    out
}

fn merge(rows: &mut Vec<Row>, job: JobId, part: Row, cap: usize) {
    if let Some(r) = rows.iter_mut().find(|r| r.job == job) {
        r.owner |= part.owner;
        r.beneficiary |= part.beneficiary;
        r.victim |= part.victim;
    } else if rows.len() < cap {
        rows.push(part);
    }
}

/// The log's clock after each event: its own time, or the latest before.
fn clocks(events: &[Event]) -> Vec<Timestamp> {
    let mut t = Timestamp(0);
    events
        .iter()
        .map(|e| {
            t = e.at().map_or(t, |a| a.max(t));
            t
        })
        .collect()
}

/// From the first plan shown to the last start of its beneficiaries and
/// stop of its victims (after their plans), with a margin each side.
fn default_window(
    events: &[Event],
    clock: &[Timestamp],
    plans: &[usize],
) -> (Timestamp, Timestamp) {
    let Some(&first) = plans.first() else {
        let end = clock.last().copied().unwrap_or_default();
        return (Timestamp(0), end.max(Timestamp(1000)));
    };
    let mut starts = BTreeSet::new();
    let mut stops = BTreeSet::new();
    let mut end = clock[first];
    for (i, e) in events.iter().enumerate().skip(first) {
        if plans.contains(&i) {
            if let Some(jobs) = plan_jobs(e) {
                for (j, r) in jobs {
                    if r.victim {
                        stops.insert(j)
                    } else {
                        starts.insert(j)
                    };
                }
            }
        }
        let done = match e {
            Event::JobStarted { job, .. } => starts.remove(job),
            Event::JobPreempted { job, .. } => stops.remove(job),
            _ => false,
        };
        if done {
            end = end.max(clock[i]);
        }
    }
    let begin = clock[first];
    let margin = (end.0.saturating_sub(begin.0) / 10).max(60_000);
    (
        Timestamp(begin.0.saturating_sub(margin)),
        Timestamp(end.0 + margin),
    )
}

/// Escapes text for XML content and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// A virtual time as `H:MM:SS`, with `.mmm` when asked.
fn hms(t: Timestamp, millis: bool) -> String {
    let s = t.0 / 1000;
    let base = format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
    if millis {
        format!("{base}.{:03}", t.0 % 1000)
    } else {
        base
    }
}

fn lane_colour(l: Lane) -> &'static str {
    match l {
        Lane::Pending => "#c7c7c7",
        Lane::Admitted => "#9ecae1",
        Lane::Bound => "#4292c6",
        Lane::Running => "#41ab5d",
        Lane::Preempting => "#f16913",
    }
}

const LANES: [Lane; 5] = [
    Lane::Pending,
    Lane::Admitted,
    Lane::Bound,
    Lane::Running,
    Lane::Preempting,
];

/// Mark kinds in the legend: (event kind, name, colour).
const MARKS: [(&str, &str, &str); 6] = [
    ("job_checkpointed", "checkpoint", "#00441b"),
    ("preemption_planned", "plan", "#d62728"),
    ("job_preempted", "preemption", "#67000d"),
    ("job_finished", "end", "#000000"),
    ("job_requeued", "requeued", "#6a51a3"),
    ("reservation_made", "reservation", "#08519c"),
];

fn mark_colour(kind: &str) -> &'static str {
    match kind {
        "job_cancelled" | "job_rejected" => "#000000",
        k => MARKS
            .iter()
            .find(|(m, _, _)| *m == k)
            .map_or("#525252", |(_, _, c)| c),
    }
}

/// Maps virtual time to x.
struct Axis {
    from: Timestamp,
    to: Timestamp,
}

impl Axis {
    fn x(&self, t: Timestamp) -> f64 {
        let span = self.to.0.saturating_sub(self.from.0).max(1) as f64;
        let f = (t.0.clamp(self.from.0, self.to.0) - self.from.0) as f64 / span;
        LABEL_W + f * (WIDTH - LABEL_W - RIGHT_PAD)
    }

    fn contains(&self, t: Timestamp) -> bool {
        self.from <= t && t <= self.to
    }

    /// A round tick step giving at most about ten ticks, in ms.
    fn step(&self) -> u64 {
        const STEPS_S: [u64; 18] = [
            1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200,
            86400,
        ];
        let span = self.to.0.saturating_sub(self.from.0);
        STEPS_S
            .iter()
            .map(|s| s * 1000)
            .find(|s| span / s <= 10)
            .unwrap_or(86_400_000 * (span / 864_000_000 + 1))
    }
}

/// Draws the timeline of the run's preemptions. `state` is the run's end
/// state (for tenants and node names), `events` its whole log.
pub fn timeline(state: &State, events: &[Event], window: Window) -> Drawn {
    let pick = pick(events, MAX_ROWS);
    let clock = clocks(events);
    let axis = window.resolve(default_window(events, &clock, &pick.plans));
    let run_end = clock.last().copied().unwrap_or_default();
    let height = TOP + ROW_H * pick.rows.len().max(1) as f64 + BOTTOM;
    let mut svg = String::new();
    head(&mut svg, &pick, &axis, height);
    legend(&mut svg);
    ticks(&mut svg, &axis, height);
    if pick.rows.is_empty() {
        let _ = writeln!(
            svg,
            r##"<text x="{LABEL_W}" y="{}" fill="#525252">no preemption was planned in this run</text>"##,
            TOP + 15.0
        );
    }
    let canvas = Canvas {
        state,
        events,
        axis: &axis,
        run_end,
    };
    for (i, row) in pick.rows.iter().enumerate() {
        canvas.row(&mut svg, row, i);
    }
    svg.push_str("</svg>\n");
    Drawn {
        svg,
        plans: pick.total_plans,
        plans_shown: pick.plans.len(),
        rows: pick.rows.len(),
        left_out: pick.total_jobs - pick.rows.len(),
        from: axis.from,
        to: axis.to,
    }
}

fn heading(pick: &Pick) -> String {
    let shown = match pick.total_jobs - pick.rows.len() {
        0 => format!("{} jobs", pick.rows.len()),
        n => format!(
            "{} jobs of the first {} plans ({n} more jobs left out)",
            pick.rows.len(),
            pick.plans.len()
        ),
    };
    format!(
        "Preemptions in a simulated run: {} plans, {shown}",
        pick.total_plans
    )
}

fn head(svg: &mut String, pick: &Pick, axis: &Axis, height: f64) {
    let title = heading(pick);
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, "<title>{}</title>", esc(&title));
    let _ = writeln!(
        svg,
        r##"<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        svg,
        r#"<text class="heading" x="10" y="20" font-size="15" font-weight="bold">{}</text>"#,
        esc(&title)
    );
    let _ = writeln!(
        svg,
        r##"<text x="10" y="38" fill="#525252">simulated time {} to {} (h:mm:ss since the run's start); one row per job a plan involved, beneficiary first, then its victims</text>"##,
        hms(axis.from, false),
        hms(axis.to, false)
    );
}

fn legend(svg: &mut String) {
    let y = 52.0;
    let mut x = 10.0;
    for lane in LANES {
        let _ = writeln!(
            svg,
            r#"<rect x="{x}" y="{y}" width="14" height="10" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            lane_colour(lane),
            x + 18.0,
            y + 9.5,
            lane.name()
        );
        x += 100.0;
    }
    for (kind, name, colour) in MARKS {
        // Centred on the legend's text line.
        let top = if kind == "job_checkpointed" {
            y + 1.0
        } else {
            y + 5.0
        };
        let _ = writeln!(svg, "{}", mark_shape(kind, x + 5.0, top, 8.0, colour));
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}">{name}</text>"#,
            x + 14.0,
            y + 9.5
        );
        x += 100.0;
    }
}

fn ticks(svg: &mut String, axis: &Axis, height: f64) {
    let step = axis.step();
    let first = axis.from.0.div_ceil(step) * step;
    let bottom = height - BOTTOM;
    let millis = step < 1000;
    let seconds = !step.is_multiple_of(60_000);
    let _ = writeln!(svg, r#"<g class="axis">"#);
    for t in (first..=axis.to.0).step_by(step as usize) {
        let x = axis.x(Timestamp(t));
        let label = if seconds || millis {
            hms(Timestamp(t), millis)
        } else {
            let s = t / 1000;
            format!("{}:{:02}", s / 3600, s / 60 % 60)
        };
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{bottom}" stroke="#e0e0e0"/><text x="{x:.1}" y="{}" text-anchor="middle" fill="#525252">{label}</text><text x="{x:.1}" y="{}" text-anchor="middle" fill="#525252">{label}</text>"##,
            TOP - 8.0,
            TOP - 12.0,
            bottom + 16.0
        );
    }
    let _ = writeln!(svg, "</g>");
}

/// What every row is drawn from.
struct Canvas<'a> {
    state: &'a State,
    events: &'a [Event],
    axis: &'a Axis,
    /// Where open bars end: the log's last time.
    run_end: Timestamp,
}

impl Canvas<'_> {
    /// Row `i`: a stripe, the label, the job's bars, then its marks.
    fn row(&self, svg: &mut String, row: &Row, i: usize) {
        let y = TOP + ROW_H * i as f64;
        let tenant = self
            .state
            .job(row.job)
            .map_or("?", |j| j.spec.tenant.as_str());
        let stripe = if i.is_multiple_of(2) {
            "#f7f7f7"
        } else {
            "#ffffff"
        };
        let _ = writeln!(
            svg,
            r#"<g class="row" data-job="{}" data-role="{}">"#,
            row.job,
            row.role_key()
        );
        let _ = writeln!(
            svg,
            r#"<rect x="0" y="{y}" width="{WIDTH}" height="{ROW_H}" fill="{stripe}"/>"#
        );
        let _ = writeln!(
            svg,
            r#"<text x="10" y="{}">job {} · {} · {}</text>"#,
            y + 15.0,
            row.job,
            esc(tenant),
            row.role()
        );
        let mid = y + ROW_H / 2.0;
        let g = explain::gantt(self.state, self.events, row.job);
        for bar in &g.bars {
            draw_bar(svg, bar, self.axis, mid, self.run_end);
        }
        let own = own_plans(self.state, self.events, row.job);
        for mark in g.marks.iter().chain(&own) {
            draw_mark(svg, mark, self.axis, mid);
        }
        let _ = writeln!(svg, "</g>");
    }
}

/// The plans made for `job` as their beneficiary, as marks (the gantt
/// marks only the plans that chose a job as a victim).
fn own_plans(state: &State, events: &[Event], job: JobId) -> Vec<Mark> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::PreemptionPlanned {
                beneficiary, at, ..
            } if *beneficiary == job => Some(Mark {
                at: *at,
                kind: e.kind(),
                text: explain::log_line(state, e),
            }),
            _ => None,
        })
        .collect()
}

fn draw_bar(svg: &mut String, bar: &Bar, axis: &Axis, mid: f64, run_end: Timestamp) {
    let to = bar.to.unwrap_or(run_end.max(bar.from));
    if to <= axis.from || bar.from >= axis.to {
        return;
    }
    let (x0, x1) = (axis.x(bar.from), axis.x(to));
    if x1 - x0 < 0.05 {
        return;
    }
    let name = bar.lane.name();
    let until = bar
        .to
        .map_or_else(|| "the run's end".to_string(), |t| hms(t, true));
    let _ = writeln!(
        svg,
        r#"<rect class="bar {name}" x="{x0:.2}" y="{:.1}" width="{:.2}" height="{BAR_H}" fill="{}"><title>{name}: {} ({} to {until})</title></rect>"#,
        mid - BAR_H / 2.0,
        x1 - x0,
        lane_colour(bar.lane),
        esc(&bar.text),
        hms(bar.from, true)
    );
}

fn draw_mark(svg: &mut String, mark: &Mark, axis: &Axis, mid: f64) {
    if !axis.contains(mark.at) {
        return;
    }
    let shape = mark_shape(
        mark.kind,
        axis.x(mark.at),
        mid - BAR_H / 2.0,
        BAR_H,
        mark_colour(mark.kind),
    );
    let _ = writeln!(
        svg,
        r#"<g class="mark {}">{shape}<title>{}: {}</title></g>"#,
        mark.kind,
        hms(mark.at, true),
        esc(&mark.text)
    );
}

/// A checkpoint is a tick across the bar; any other mark a triangle
/// pointing down at it. `top` is the bar's top edge, `h` its height.
fn mark_shape(kind: &str, x: f64, top: f64, h: f64, colour: &str) -> String {
    if kind == "job_checkpointed" {
        format!(
            r#"<line x1="{x:.2}" y1="{:.1}" x2="{x:.2}" y2="{:.1}" stroke="{colour}" stroke-width="2"/>"#,
            top - 2.0,
            top + h + 2.0
        )
    } else {
        format!(
            r#"<path d="M {x:.2} {:.1} l -5 -7 h 10 z" fill="{colour}"/>"#,
            top + 3.0
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_events::Victim;

    fn plan(beneficiary: u64, victims: &[u64], at_s: u64) -> Event {
        Event::PreemptionPlanned {
            beneficiary: JobId(beneficiary),
            cause: PreemptionCause::Reclaim {
                tenant: "research".into(),
                flavor: "h100".into(),
                quota_deficit: 8,
            },
            victims: victims
                .iter()
                .map(|&v| Victim {
                    job: JobId(v),
                    deadline: Timestamp::from_secs(at_s + 30),
                    expected_lost_gpu_ms: 0,
                    cost: 0,
                })
                .collect(),
            reserve: vec![],
            at: Timestamp::from_secs(at_s),
        }
    }

    fn jobs(p: &Pick) -> Vec<u64> {
        p.rows.iter().map(|r| r.job.0).collect()
    }

    #[test]
    fn rows_are_the_first_plans_jobs_up_to_the_cap() {
        let log = vec![
            plan(10, &[1, 2], 100),
            plan(11, &[3], 100),
            plan(12, &[4, 5], 200),
            plan(13, &[6], 300),
        ];
        let p = pick(&log, 5);
        assert_eq!(jobs(&p), vec![10, 1, 2, 11, 3]);
        assert_eq!(p.plans, vec![0, 1], "the third plan does not fit whole");
        assert_eq!((p.total_plans, p.total_jobs), (4, 10));
        // Later plans that would fit are not taken out of order.
        assert_eq!(pick(&log, 7).plans, vec![0, 1]);
        assert!(
            heading(&p).contains("(5 more jobs left out)"),
            "{}",
            heading(&p)
        );
        // A first plan larger than the cap is cut, not dropped.
        assert_eq!(jobs(&pick(&log, 2)), vec![10, 1]);
        assert_eq!(pick(&log, 100).rows.len(), 10);
    }

    #[test]
    fn a_job_in_two_plans_has_one_row_with_both_roles() {
        let log = vec![plan(10, &[1], 100), plan(1, &[2], 200)];
        let p = pick(&log, 10);
        assert_eq!(jobs(&p), vec![10, 1, 2]);
        assert_eq!(p.rows[1].role(), "beneficiary, victim");
        assert_eq!(p.rows[0].role(), "owner (beneficiary)");
        assert_eq!(p.rows[2].role(), "victim");
    }

    #[test]
    fn the_window_spans_the_plans_to_the_last_start_or_stop() {
        let log = vec![
            plan(10, &[1], 1000),
            Event::JobPreempted {
                job: JobId(1),
                lost_gpu_ms: 0,
                resume_from: None,
                at: Timestamp::from_secs(1100),
            },
            Event::JobStarted {
                job: JobId(10),
                at: Timestamp::from_secs(1200),
            },
            Event::JobStarted {
                job: JobId(1),
                at: Timestamp::from_secs(9000),
            },
        ];
        let (from, to) = default_window(&log, &clocks(&log), &[0]);
        // 200 s span: the margin is its floor, 60 s.
        assert_eq!((from.as_secs(), to.as_secs()), (940, 1260));
        // One end asked for: the other stays after it.
        let w = |f: Option<u64>, t: Option<u64>| {
            let a = Window {
                from: f.map(Timestamp::from_secs),
                to: t.map(Timestamp::from_secs),
            }
            .resolve((from, to));
            (a.from.as_secs(), a.to.as_secs())
        };
        assert_eq!(w(Some(1000), None), (1000, 1260));
        assert_eq!(w(Some(2000), None), (2000, 2320));
        assert_eq!(w(None, Some(100)), (0, 100));
        assert_eq!(w(Some(5), Some(7)), (5, 7));
    }

    #[test]
    fn text_is_escaped_and_ticks_are_round() {
        assert_eq!(
            esc(r#"a<b & "c">'"#),
            "a&lt;b &amp; &quot;c&quot;&gt;&apos;"
        );
        let axis = Axis {
            from: Timestamp::from_secs(10_500),
            to: Timestamp::from_secs(12_900),
        };
        assert_eq!(axis.step(), 300_000);
        assert_eq!(hms(Timestamp(10_830_250), true), "3:00:30.250");
    }
}
