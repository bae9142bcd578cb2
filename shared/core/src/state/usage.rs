//! Use with a half-life: each tenant's past GPU use per flavor, decayed so
//! that use `h` ago counts half as much as use now (`h`: its cohort's
//! `usage_half_life_s`).
//!
//! A tenant holding `u` GPUs from `t0` to `t1` adds
//! `u·τ·(1 − 2^(−(t1−t0)/h))` GPU-ms at `t1`, with `τ = h / ln 2`, and
//! what it had decays by `2^(−(t1−t0)/h)`. Quota usage is constant between
//! two events that change it, so bringing the record forward at each
//! change is exact (up to floating point), with no per-tick work. Divided
//! by `τ`, the record is a mean of the GPUs held, weighted by age: a
//! tenant that holds `u` GPUs for many half-lives tends to `u`.
//!
//! Owns: the record ([`DecayedUse`]) and the rule that brings it forward.
//! Must never: read a clock (time is the latest event time `apply` saw),
//! or change quota usage; it only remembers it.

use crate::quota_gpus::QuotaGpus;
use gpusched_model::Timestamp;
use serde::{Deserialize, Serialize};

/// A tenant's decayed GPU use, per flavor index, as of `at`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DecayedUse {
    /// The time the record is brought up to.
    pub at: Timestamp,
    /// Decayed GPU-milliseconds per flavor index.
    pub gpu_ms: Vec<f64>,
}

/// `τ = h / ln 2` in milliseconds: the decayed GPU-ms of one GPU held forever.
pub fn mean_life_ms(half_life_ms: u64) -> f64 {
    half_life_ms as f64 / std::f64::consts::LN_2
}

impl DecayedUse {
    /// Brings the record forward to `now`, `used[f]` GPUs having been held
    /// in flavor `f` since `at`. A half-life of 0 keeps no record. A `now`
    /// before `at` (a clock behind) changes nothing.
    pub fn roll(&mut self, used: &[QuotaGpus], half_life_ms: u64, now: Timestamp) {
        if half_life_ms == 0 {
            self.gpu_ms.clear();
            self.at = now;
            return;
        }
        if self.gpu_ms.len() < used.len() {
            self.gpu_ms.resize(used.len(), 0.0);
        }
        let dt = now.millis_since(self.at);
        if dt == 0 {
            return;
        }
        let keep = 0.5f64.powf(dt as f64 / half_life_ms as f64);
        let gained = mean_life_ms(half_life_ms) * (1.0 - keep);
        for (f, v) in self.gpu_ms.iter_mut().enumerate() {
            let u = used.get(f).copied().unwrap_or_default();
            *v = *v * keep + u.as_f64() * gained;
        }
        self.at = now;
    }

    /// The record as it will be at `now` (no change to `self`).
    pub fn at_time(&self, used: &[QuotaGpus], half_life_ms: u64, now: Timestamp) -> DecayedUse {
        let mut d = self.clone();
        d.roll(used, half_life_ms, now);
        d
    }

    /// Decayed GPU-ms in flavor `f`.
    pub fn gpu_ms(&self, f: usize) -> f64 {
        self.gpu_ms.get(f).copied().unwrap_or(0.0)
    }

    /// Mean GPUs held in flavor `f`, weighted by age (`gpu_ms / τ`).
    pub fn mean_gpus(&self, f: usize, half_life_ms: u64) -> f64 {
        if half_life_ms == 0 {
            return 0.0;
        }
        self.gpu_ms(f) / mean_life_ms(half_life_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(v: &[u32]) -> Vec<QuotaGpus> {
        v.iter().copied().map(QuotaGpus::from).collect()
    }

    const HOUR: u64 = 3_600_000;

    #[test]
    fn use_held_one_half_life_then_released_halves_each_half_life() {
        let mut d = DecayedUse::default();
        d.roll(&gpus(&[8]), HOUR, Timestamp(HOUR));
        // 8 GPUs for one half-life: 8·τ·(1 − ½) = 4τ.
        assert!((d.mean_gpus(0, HOUR) - 4.0).abs() < 1e-9);
        d.roll(&gpus(&[0]), HOUR, Timestamp(2 * HOUR));
        assert!((d.mean_gpus(0, HOUR) - 2.0).abs() < 1e-9);
        d.roll(&gpus(&[0]), HOUR, Timestamp(4 * HOUR));
        assert!((d.mean_gpus(0, HOUR) - 0.5).abs() < 1e-9);
    }

    #[test]
    fn held_for_many_half_lives_the_mean_tends_to_what_is_held() {
        let mut d = DecayedUse::default();
        d.roll(&gpus(&[0, 16]), HOUR, Timestamp(40 * HOUR));
        assert!((d.mean_gpus(1, HOUR) - 16.0).abs() < 1e-6);
        assert_eq!(d.mean_gpus(0, HOUR), 0.0);
    }

    #[test]
    fn rolling_in_steps_equals_rolling_at_once() {
        let mut steps = DecayedUse::default();
        for k in 1..=10 {
            steps.roll(&gpus(&[4]), HOUR, Timestamp(k * HOUR / 3));
        }
        let once = DecayedUse::default().at_time(&gpus(&[4]), HOUR, Timestamp(10 * HOUR / 3));
        assert!((steps.gpu_ms(0) - once.gpu_ms(0)).abs() / once.gpu_ms(0) < 1e-12);
    }

    #[test]
    fn a_clock_behind_changes_nothing_and_no_half_life_keeps_nothing() {
        let mut d = DecayedUse::default();
        d.roll(&gpus(&[2]), HOUR, Timestamp(HOUR));
        let before = d.clone();
        d.roll(&gpus(&[9]), HOUR, Timestamp(HOUR / 2));
        assert_eq!(d, before);
        d.roll(&gpus(&[2]), 0, Timestamp(2 * HOUR));
        assert!(d.gpu_ms.is_empty());
        assert_eq!(d.at, Timestamp(2 * HOUR));
    }
}
