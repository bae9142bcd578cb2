//! GPU-hour budgets as the state keeps them: per tenant and flavor, the
//! GPU-milliseconds held since the current period began.
//!
//! Owns: bringing a ledger forward at the log's own clock (usage is
//! constant between the events that change it, so the sum is exact, with
//! no per-tick work), splitting it at a period's start, and what it reads
//! at any later time. Whether the budget counts as spent is the log's say
//! (`BudgetSpent` / `BudgetRenewed`, written by the quota stage), kept in
//! `spent_in`.
//!
//! Must never: decide anything, or read a clock (time is the log's).

use gpusched_model::{Budget, Gpus, Timestamp};
use serde::{Deserialize, Serialize};

/// One tenant's budget in one flavor and what it has used of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetLedger {
    /// The budget as configured.
    pub budget: Budget,
    /// The start of the period `used_gpu_ms` belongs to.
    pub period_start: Timestamp,
    /// GPU-milliseconds held in that period, up to `at`.
    pub used_gpu_ms: u64,
    /// When it was last brought forward.
    pub at: Timestamp,
    /// The start of the period whose budget the log says is spent
    /// (`BudgetSpent`), until `BudgetRenewed`.
    pub spent_in: Option<Timestamp>,
}

impl BudgetLedger {
    /// A ledger counting from `now`.
    pub fn new(budget: Budget, now: Timestamp) -> Self {
        BudgetLedger {
            budget,
            period_start: budget.period.start_of(now),
            used_gpu_ms: 0,
            at: now,
            spent_in: None,
        }
    }

    /// Brings the count up to `now`, `gpus` having been held since `at`;
    /// what was held before the period holding `now` began is left behind.
    pub fn roll(&mut self, gpus: Gpus, now: Timestamp) {
        if now <= self.at {
            return;
        }
        (self.period_start, self.used_gpu_ms) = self.count_at(gpus, now);
        self.at = now;
    }

    /// GPU-milliseconds used in the period holding `now`, `gpus` being
    /// held since the last roll.
    pub fn used_at(&self, gpus: Gpus, now: Timestamp) -> u64 {
        self.count_at(gpus, now).1
    }

    /// GPU-milliseconds left in the period holding `now`.
    pub fn left_at(&self, gpus: Gpus, now: Timestamp) -> u64 {
        self.budget.gpu_ms().saturating_sub(self.used_at(gpus, now))
    }

    /// Whether the log says the budget is spent, and its policy applies.
    pub fn is_spent(&self) -> bool {
        self.spent_in.is_some()
    }

    fn count_at(&self, gpus: Gpus, now: Timestamp) -> (Timestamp, u64) {
        let now = now.max(self.at);
        let start = self.budget.period.start_of(now);
        let (since, carried) = if start > self.period_start {
            (self.at.max(start), 0)
        } else {
            (self.at, self.used_gpu_ms)
        };
        let held = u64::from(gpus).saturating_mul(now.millis_since(since));
        (start, carried.saturating_add(held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_model::{BudgetPeriod, WhenSpent};

    const DAY: u64 = 86_400_000;
    const HOUR: u64 = 3_600_000;

    fn ledger() -> BudgetLedger {
        let budget = Budget {
            gpu_hours: 100,
            period: BudgetPeriod::Day,
            when_spent: WhenSpent::Wait,
        };
        BudgetLedger::new(budget, Timestamp(10 * DAY + 20 * HOUR))
    }

    #[test]
    fn use_is_counted_up_to_any_time_and_split_at_the_period_start() {
        let mut l = ledger();
        assert_eq!(l.period_start, Timestamp(10 * DAY));
        // 8 GPUs from 20:00: 16 GPU-hours by 22:00.
        let at_22 = Timestamp(10 * DAY + 22 * HOUR);
        assert_eq!(l.used_at(8, at_22), 16 * HOUR);
        l.roll(8, at_22);
        assert_eq!(l.used_gpu_ms, 16 * HOUR);
        assert_eq!(l.left_at(0, at_22), 84 * HOUR);
        // Still 8 GPUs, past midnight: only the hour since midnight counts.
        let at_1 = Timestamp(11 * DAY + HOUR);
        assert_eq!(l.used_at(8, at_1), 8 * HOUR);
        l.roll(8, at_1);
        assert_eq!(
            (l.period_start, l.used_gpu_ms),
            (Timestamp(11 * DAY), 8 * HOUR)
        );
        // A roll into the past changes nothing.
        l.roll(64, Timestamp(10 * DAY));
        assert_eq!(l.used_gpu_ms, 8 * HOUR);
        assert_eq!(l.left_at(0, Timestamp(12 * DAY)), 100 * HOUR);
    }
}
