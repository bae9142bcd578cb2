//! Explain's words: durations, times relative to now or to a job's
//! submission and short lists, in the user's terms (a topology level
//! reads through `gpusched_model::Place`).
//!
//! Owns: how a time or a list of jobs reads. Times are log times
//! (the clock the events carry); a raw epoch number is never printed.
//!
//! Must never: read a clock, or decide anything.

use gpusched_model::{JobId, Timestamp};

/// A duration in words: `0.3 s`, `42 s`, `3 min 20 s`, `1 h 5 min`, `2 d 3 h`.
pub fn duration(ms: u64) -> String {
    if ms < 10_000 {
        return format!("{:.1} s", ms as f64 / 1000.0);
    }
    let s = ms / 1000;
    let two = |big: u64, big_unit: &str, small: u64, small_unit: &str| {
        if small == 0 {
            format!("{big} {big_unit}")
        } else {
            format!("{big} {big_unit} {small} {small_unit}")
        }
    };
    match s {
        0..=59 => format!("{s} s"),
        60..=3_599 => two(s / 60, "min", s % 60, "s"),
        3_600..=86_399 => two(s / 3_600, "h", s % 3_600 / 60, "min"),
        _ => two(s / 86_400, "d", s % 86_400 / 3_600, "h"),
    }
}

/// A place in a line: `1st`, `2nd`, `3rd`, `11th`, `22nd`.
pub fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// A duration declared in seconds by a job's specification (its own clock).
pub fn declared(secs: u64) -> String {
    duration(secs.saturating_mul(1000))
}

/// A time relative to now: `in 1 h 5 min`, `12 s ago`, `now`.
pub fn relative(t: Timestamp, now: Timestamp) -> String {
    match t.cmp(&now) {
        std::cmp::Ordering::Greater => format!("in {}", duration(t.millis_since(now))),
        std::cmp::Ordering::Less => format!("{} ago", duration(now.millis_since(t))),
        std::cmp::Ordering::Equal => "now".to_string(),
    }
}

/// A time as an offset from a job's submission (`+3 min 20 s`), without padding.
pub fn offset(t: Timestamp, t0: Timestamp) -> String {
    if t >= t0 {
        format!("+{}", duration(t.millis_since(t0)))
    } else {
        format!("-{}", duration(t0.millis_since(t)))
    }
}

/// GPU-milliseconds as GPU-hours.
pub fn gpu_hours(gpu_ms: u64) -> String {
    format!("{:.2} GPU-hours", gpu_ms as f64 / 3_600_000.0)
}

/// At most `max` items joined by commas, then `and N more`.
pub fn list(items: &[String], max: usize) -> String {
    let shown = items
        .iter()
        .take(max)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > max {
        format!("{shown} and {} more", items.len() - max)
    } else {
        shown
    }
}

/// `job 3` or `jobs 3, 5`.
pub fn jobs(ids: &[JobId]) -> String {
    let names: Vec<String> = ids.iter().map(|j| j.to_string()).collect();
    match ids.len() {
        1 => format!("job {}", names[0]),
        _ => format!("jobs {}", list(&names, 8)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_in_at_most_two_units() {
        assert_eq!(duration(300), "0.3 s");
        assert_eq!(duration(42_000), "42 s");
        assert_eq!(duration(200_000), "3 min 20 s");
        assert_eq!(duration(600_000), "10 min");
        assert_eq!(duration(3_900_000), "1 h 5 min");
        assert_eq!(duration(2 * 86_400_000 + 3 * 3_600_000), "2 d 3 h");
    }

    #[test]
    fn places_in_line_read_as_ordinals() {
        let read: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 103].map(ordinal).into();
        assert_eq!(
            read,
            ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "103rd"]
        );
    }

    #[test]
    fn times_read_relative_to_now() {
        let now = Timestamp::from_secs(1_796_057_012);
        assert_eq!(relative(now.plus_secs(3_900), now), "in 1 h 5 min");
        assert_eq!(relative(Timestamp(now.0 - 12_000), now), "12 s ago");
        assert_eq!(relative(now, now), "now");
    }
}
