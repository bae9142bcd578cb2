//! GPU-hour budgets: how many GPU-hours a tenant may use of one flavor per
//! calendar period, and what happens to its jobs once they are spent.
//!
//! Owns: the budget's fields and their checks, and the calendar (UTC)
//! arithmetic of a period: where the period holding an instant starts and
//! where the next one does.
//!
//! Must never: keep the running total (the core's state does, from the
//! log's own times) or read a clock.

use crate::{FieldError, Timestamp};
use chrono::{DateTime, Datelike, Months, NaiveDate, NaiveTime, Utc};
use serde::{Deserialize, Serialize};

/// The largest budget accepted, in GPU-hours: a million GPUs for a year
/// is below it, and GPU-milliseconds of it still fit in 64 bits.
pub const MAX_BUDGET_GPU_HOURS: u64 = 1_000_000_000_000;

/// A tenant's GPU-hour budget in one flavor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// GPU-hours per period (GPUs held × hours, from admission to release).
    #[schema(minimum = 1, maximum = 1_000_000_000_000_u64)]
    pub gpu_hours: u64,
    /// The calendar period it renews on (UTC).
    pub period: BudgetPeriod,
    /// What happens to the tenant's jobs once the period's GPU-hours are
    /// spent: running jobs run on either way.
    #[serde(default)]
    pub when_spent: WhenSpent,
}

/// The calendar period a budget renews on, in UTC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum BudgetPeriod {
    /// From 00:00 each day.
    Day,
    /// From Monday 00:00.
    Week,
    /// From 00:00 on the first of each month.
    Month,
}

/// What a spent budget does to a tenant's queued jobs in that flavor.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum WhenSpent {
    /// They wait for the next period.
    #[default]
    Wait,
    /// They run only on idle capacity: all of the tenant's use counts as
    /// borrowed (its nominal quota is lent to the cohort), so they start
    /// only where the cohort has quota to lend and are the first a returning
    /// quota owner reclaims.
    BorrowOnly,
}

impl Budget {
    /// The budget in GPU-milliseconds.
    pub fn gpu_ms(&self) -> u64 {
        self.gpu_hours.saturating_mul(3_600_000)
    }
    /// Field-level checks; `prefix` names where the budget sits (e.g.
    /// `quotas.budget`; empty where it is the whole body).
    pub fn check_fields(&self, prefix: &str) -> Result<(), FieldError> {
        if self.gpu_hours == 0 || self.gpu_hours > MAX_BUDGET_GPU_HOURS {
            let field = if prefix.is_empty() {
                "gpu_hours".to_string()
            } else {
                format!("{prefix}.gpu_hours")
            };
            return Err(FieldError::new(
                &field,
                "must be at least 1 and at most 1000000000000",
            ));
        }
        Ok(())
    }
}

impl BudgetPeriod {
    /// The start of the period holding `at`.
    pub fn start_of(self, at: Timestamp) -> Timestamp {
        let date = utc(at).date_naive();
        let first = match self {
            BudgetPeriod::Day => date,
            BudgetPeriod::Week => {
                date - chrono::Days::new(u64::from(date.weekday().num_days_from_monday()))
            }
            BudgetPeriod::Month => date.with_day(1).unwrap_or(date),
        };
        midnight(first)
    }
    /// The start of the period after the one holding `at`.
    pub fn next_start(self, at: Timestamp) -> Timestamp {
        let start = utc(self.start_of(at)).date_naive();
        let next = match self {
            BudgetPeriod::Day => start.checked_add_days(chrono::Days::new(1)),
            BudgetPeriod::Week => start.checked_add_days(chrono::Days::new(7)),
            BudgetPeriod::Month => start.checked_add_months(Months::new(1)),
        };
        next.map_or(Timestamp(u64::MAX), midnight)
    }
    /// The period's name as written in a tenant spec.
    pub fn name(self) -> &'static str {
        match self {
            BudgetPeriod::Day => "day",
            BudgetPeriod::Week => "week",
            BudgetPeriod::Month => "month",
        }
    }
}

impl WhenSpent {
    /// The policy's name as written in a tenant spec.
    pub fn name(self) -> &'static str {
        match self {
            WhenSpent::Wait => "wait",
            WhenSpent::BorrowOnly => "borrow-only",
        }
    }
}

fn utc(at: Timestamp) -> DateTime<Utc> {
    let ms = i64::try_from(at.0).unwrap_or(i64::MAX);
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

fn midnight(date: NaiveDate) -> Timestamp {
    let ms = date.and_time(NaiveTime::MIN).and_utc().timestamp_millis();
    Timestamp(u64::try_from(ms).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-05 (a Saturday) 11:04:56.789 UTC.
    const AT: Timestamp = Timestamp(1_796_468_696_789);

    fn day(y: i32, m: u32, d: u32) -> Timestamp {
        midnight(NaiveDate::from_ymd_opt(y, m, d).unwrap())
    }

    #[test]
    fn periods_start_at_utc_midnight_on_the_calendar() {
        assert_eq!(BudgetPeriod::Day.start_of(AT), day(2026, 12, 5));
        assert_eq!(BudgetPeriod::Day.next_start(AT), day(2026, 12, 6));
        assert_eq!(BudgetPeriod::Week.start_of(AT), day(2026, 11, 30));
        assert_eq!(BudgetPeriod::Week.next_start(AT), day(2026, 12, 7));
        assert_eq!(BudgetPeriod::Month.start_of(AT), day(2026, 12, 1));
        assert_eq!(BudgetPeriod::Month.next_start(AT), day(2027, 1, 1));
        // A period's own start is inside it.
        let feb = day(2028, 2, 1);
        assert_eq!(BudgetPeriod::Month.start_of(feb), feb);
        assert_eq!(BudgetPeriod::Month.next_start(feb), day(2028, 3, 1));
        assert_eq!(BudgetPeriod::Day.start_of(Timestamp(0)), Timestamp(0));
    }

    #[test]
    fn a_budget_names_its_bad_field() {
        let mut b = Budget {
            gpu_hours: 0,
            period: BudgetPeriod::Month,
            when_spent: WhenSpent::Wait,
        };
        let e = b.check_fields("quotas.budget").unwrap_err();
        assert_eq!(e.field, "quotas.budget.gpu_hours");
        b.gpu_hours = 10;
        assert!(b.check_fields("quotas.budget").is_ok());
        assert_eq!(b.gpu_ms(), 36_000_000);
    }

    #[test]
    fn a_budget_reads_as_written_in_a_tenant_file() {
        let b: Budget = serde_json::from_str(
            r#"{"gpu_hours": 500, "period": "week", "when_spent": "borrow-only"}"#,
        )
        .unwrap();
        assert_eq!(b.period, BudgetPeriod::Week);
        assert_eq!(b.when_spent, WhenSpent::BorrowOnly);
        let b: Budget = serde_json::from_str(r#"{"gpu_hours": 5, "period": "day"}"#).unwrap();
        assert_eq!(b.when_spent, WhenSpent::Wait);
    }
}
