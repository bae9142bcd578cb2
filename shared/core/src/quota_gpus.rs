//! GPUs as the quota ledger counts them: the one type for quota
//! arithmetic (tenants' usage and limits, cohorts' pools, this cycle's
//! charges).
//!
//! Owns: the rule that quota arithmetic never wraps and never panics. A sum
//! stops at [`QuotaGpus::UNLIMITED`] (`u32::MAX`, which is also what "no
//! borrowing limit" means), a difference at zero. New configurations bound
//! every quota at `MAX_QUOTA_GPUS` (far below `UNLIMITED`), so sums of
//! real quotas are exact; an older release's log with larger quotas still
//! folds, and its sums saturate instead of wrapping. Whether the ledger
//! matches the jobs holding quota is `State::check_invariants`'s question,
//! answered by recounting, not by this type.
//!
//! Must never: be written to the log as itself: events carry plain `Gpus`,
//! read with [`QuotaGpus::get`]. A whole job's GPUs enter the ledger
//! through `Job::quota_gpus`, a configuration's through `Quota::resolve`;
//! other counts (a victim's GPUs in a search, a job's released GPUs)
//! through [`QuotaGpus::from`].

use gpusched_model::Gpus;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::{Add, AddAssign, Sub, SubAssign};

/// A count of GPUs in quota arithmetic: `+` saturates at
/// [`QuotaGpus::UNLIMITED`], `-` at zero. Encoded as the bare count, so a
/// snapshot or state hash reads the same as a plain `u32`.
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct QuotaGpus(Gpus);

impl QuotaGpus {
    /// No GPUs.
    pub const ZERO: QuotaGpus = QuotaGpus(0);
    /// No limit: the limit of a cohort member without a borrowing limit,
    /// and where every sum stops.
    pub const UNLIMITED: QuotaGpus = QuotaGpus(Gpus::MAX);

    /// The plain count, for an event, a report or a hash.
    pub const fn get(self) -> Gpus {
        self.0
    }

    /// Whether it is zero.
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// The count as a float, for shares and weights.
    pub fn as_f64(self) -> f64 {
        f64::from(self.0)
    }
}

impl From<Gpus> for QuotaGpus {
    fn from(g: Gpus) -> Self {
        QuotaGpus(g)
    }
}

/// Compares with a plain count, as tests and reports state one.
impl PartialEq<Gpus> for QuotaGpus {
    fn eq(&self, other: &Gpus) -> bool {
        self.0 == *other
    }
}

impl Add for QuotaGpus {
    type Output = QuotaGpus;
    fn add(self, rhs: QuotaGpus) -> QuotaGpus {
        QuotaGpus(self.0.saturating_add(rhs.0))
    }
}

impl Sub for QuotaGpus {
    type Output = QuotaGpus;
    fn sub(self, rhs: QuotaGpus) -> QuotaGpus {
        QuotaGpus(self.0.saturating_sub(rhs.0))
    }
}

impl AddAssign for QuotaGpus {
    fn add_assign(&mut self, rhs: QuotaGpus) {
        *self = *self + rhs;
    }
}

impl SubAssign for QuotaGpus {
    fn sub_assign(&mut self, rhs: QuotaGpus) {
        *self = *self - rhs;
    }
}

impl std::iter::Sum for QuotaGpus {
    fn sum<I: Iterator<Item = QuotaGpus>>(iter: I) -> QuotaGpus {
        iter.fold(QuotaGpus::ZERO, Add::add)
    }
}

impl fmt::Display for QuotaGpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(n: Gpus) -> QuotaGpus {
        QuotaGpus::from(n)
    }

    #[test]
    fn sums_and_differences_of_real_quotas_are_exact() {
        assert_eq!(g(8) + g(4), g(12));
        assert_eq!(g(8) - g(3), g(5));
        let mut x = g(10);
        x += g(6);
        x -= g(16);
        assert_eq!(x, QuotaGpus::ZERO);
        assert_eq!([g(1), g(2), g(3)].into_iter().sum::<QuotaGpus>(), g(6));
    }

    #[test]
    fn a_sum_past_the_top_stops_at_unlimited_instead_of_wrapping() {
        // `nominal + borrowing_limit` of an older release's quota.
        assert_eq!(g(Gpus::MAX - 1) + g(2), QuotaGpus::UNLIMITED);
        assert_eq!(QuotaGpus::UNLIMITED + g(1), QuotaGpus::UNLIMITED);
        let many = std::iter::repeat_n(g(Gpus::MAX / 2), 3).sum::<QuotaGpus>();
        assert_eq!(many, QuotaGpus::UNLIMITED);
    }

    #[test]
    fn a_difference_below_zero_stops_at_zero_instead_of_wrapping() {
        assert_eq!(g(3) - g(5), QuotaGpus::ZERO);
        let mut x = g(2);
        x -= g(7);
        assert!(x.is_zero());
    }

    #[test]
    fn it_encodes_as_the_bare_count() {
        assert_eq!(serde_json::to_string(&g(42)).ok().as_deref(), Some("42"));
        assert_eq!(
            postcard::to_allocvec(&g(300)).ok(),
            postcard::to_allocvec(&300u32).ok()
        );
        assert_eq!(g(7).get(), 7);
        assert_eq!(g(7).to_string(), "7");
    }

    #[test]
    fn it_equals_a_plain_count_of_the_same_gpus_only() {
        // Tests state ledgers as plain counts: this must be able to fail.
        assert_eq!(g(7), 7);
        assert_ne!(g(7), 8);
        assert_ne!(QuotaGpus::UNLIMITED, 0);
    }
}
