//! Fair share that remembers: where a cohort keeps use with a half-life,
//! borrowers are served lowest decayed use per weight first (docs/architecture.md,
//! "Fair share with a half-life"). Each test would fail if the rule broke.

mod common;

use common::{job, tenant, Driver, FLAVOR};
use gpusched_core::{explain, quota, ApplyError, Phase};
use gpusched_events::Event;
use gpusched_model::{CohortSpec, JobId};

const HOUR_S: u64 = 3_600;

fn cohort(d: &mut Driver, half_life_s: u64) {
    let at = d.now;
    d.apply(Event::CohortConfigured {
        spec: CohortSpec {
            name: "c".into(),
            usage_half_life_s: half_life_s,
        },
        at,
    });
}

/// Borrowers `a` and `b` (nominal 0) and an idle lender `l` (16 GPUs) on 16
/// GPUs. `a` alone held all 16 for two hours, an hour ago. Then `a` and `b`
/// each ask for all 16: the pool has room for one.
fn a_used_more_lately(half_life_s: u64) -> (Driver, JobId, JobId) {
    let mut d = Driver::default();
    d.cluster(1, 1, 2, 8, FLAVOR);
    cohort(&mut d, half_life_s);
    d.tenant(tenant("a").cohort("c").quota(FLAVOR, 0));
    d.tenant(tenant("b").cohort("c").quota(FLAVOR, 0));
    d.tenant(tenant("l").cohort("c").quota(FLAVOR, 16));
    let past = d.submit(job("a", 2, 8, "block"));
    d.run_until_quiet();
    d.start_bound();
    d.advance(2 * HOUR_S);
    d.finish(past);
    d.advance(HOUR_S);
    // a submits first and has the lower tenant index: only its past can put b first.
    let ja = d.submit(job("a", 2, 8, "block"));
    let jb = d.submit(job("b", 2, 8, "block"));
    d.run_until_quiet();
    (d, ja, jb)
}

#[test]
fn with_a_half_life_the_borrower_that_used_more_lately_waits() {
    let (d, ja, jb) = a_used_more_lately(HOUR_S);
    assert_eq!(d.phase(jb), Phase::Bound);
    assert_eq!(d.phase(ja), Phase::Queued);
    // 16 GPUs for two half-lives, then one half-life idle: 16·(1 − ¼)·½ = 6.
    let used = d.state.decayed_use(0, d.now).mean_gpus(0, HOUR_S * 1000);
    assert!((used - 6.0).abs() < 1e-9, "a's decayed use {used}");
    assert_eq!(
        d.state.decayed_use(1, d.now).mean_gpus(0, HOUR_S * 1000),
        0.0
    );
    // Explain says why a waits: its use, its weight and its place in line.
    let reason = explain::pending_reason(&d.state, ja);
    let standing = explain::fair_share_standing(&d.state, ja, reason.as_ref(), d.now)
        .expect("a waits on quota");
    assert!(
        standing.contains("half-life of 1 h: a has used 6.0 h100 GPUs")
            && standing.contains("weight 1, 3rd of 3 in line"),
        "{standing}"
    );
    assert_eq!(
        quota::borrower_order(&d.state, 0, d.now)
            .iter()
            .map(|(t, _)| *t)
            .collect::<Vec<_>>(),
        vec![1, 2, 0],
        "b (its job only just admitted) and l have used nothing yet, by index; then a"
    );
}

#[test]
fn without_a_half_life_only_the_share_borrowed_now_counts() {
    // Both borrow nothing now: a tie, broken by tenant order.
    let (d, ja, jb) = a_used_more_lately(0);
    assert_eq!(d.phase(ja), Phase::Bound);
    assert_eq!(d.phase(jb), Phase::Queued);
    assert!(d.state.tenant(0).decayed.gpu_ms.is_empty());
}

#[test]
fn a_cycle_shares_borrowable_quota_rather_than_giving_it_to_whoever_was_lowest() {
    let mut d = Driver::default();
    d.cluster(1, 1, 2, 8, FLAVOR);
    cohort(&mut d, HOUR_S);
    d.tenant(tenant("a").cohort("c").quota(FLAVOR, 0).best_effort());
    d.tenant(tenant("b").cohort("c").quota(FLAVOR, 0).best_effort());
    d.tenant(tenant("l").cohort("c").quota(FLAVOR, 16));
    let a: Vec<JobId> = (0..4).map(|_| d.submit(job("a", 1, 4, "node"))).collect();
    let b: Vec<JobId> = (0..4).map(|_| d.submit(job("b", 1, 4, "node"))).collect();
    d.cycle(); // validation
    d.cycle(); // quota and placement
    let admitted = |ids: &[JobId]| ids.iter().filter(|&&j| d.phase(j) != Phase::Queued).count();
    assert_eq!((admitted(&a), admitted(&b)), (2, 2));
}

#[test]
fn weight_divides_decayed_use() {
    // a used as much as b lately but weighs 4: a first.
    let mut d = Driver::default();
    d.cluster(1, 1, 2, 8, FLAVOR);
    cohort(&mut d, HOUR_S);
    d.tenant(tenant("a").cohort("c").weight(4.0).quota(FLAVOR, 0));
    d.tenant(tenant("b").cohort("c").quota(FLAVOR, 0));
    d.tenant(tenant("l").cohort("c").quota(FLAVOR, 16));
    let pa = d.submit(job("a", 1, 8, "node"));
    let pb = d.submit(job("b", 1, 8, "node"));
    d.run_until_quiet();
    d.start_bound();
    d.advance(HOUR_S);
    d.finish(pa);
    d.finish(pb);
    let jb = d.submit(job("b", 2, 8, "block"));
    let ja = d.submit(job("a", 2, 8, "block"));
    d.run_until_quiet();
    assert_eq!(d.phase(ja), Phase::Bound);
    assert_eq!(d.phase(jb), Phase::Queued);
}

#[test]
fn changing_the_half_life_keeps_what_was_used_until_then_and_replay_agrees() {
    let (mut d, _, _) = a_used_more_lately(HOUR_S);
    let before = d.state.decayed_use(0, d.now).gpu_ms(0);
    cohort(&mut d, 2 * HOUR_S);
    assert_eq!(d.state.tenant(0).decayed.gpu_ms(0), before);
    assert_eq!(d.state.cohort(0).usage_half_life_s, 2 * HOUR_S);
    d.advance(2 * HOUR_S);
    // Now it halves in two hours (a holds nothing now).
    let later = d.state.decayed_use(0, d.now).gpu_ms(0);
    assert!((later - before / 2.0).abs() / before < 1e-12);
    // Off: the record goes.
    cohort(&mut d, 0);
    assert!(d.state.tenant(0).decayed.gpu_ms.is_empty());
    let replayed = d.replay();
    assert_eq!(replayed.state_hash(), d.state.state_hash());
    assert!(replayed == d.state);
}

#[test]
fn a_cohort_configured_before_its_members_keeps_their_use_from_when_they_join() {
    let mut d = Driver::default();
    d.cluster(1, 1, 2, 8, FLAVOR);
    cohort(&mut d, HOUR_S);
    assert_eq!(d.state.cohorts().len(), 1);
    d.tenant(tenant("a").cohort("c").quota(FLAVOR, 16));
    let j = d.submit(job("a", 1, 8, "node"));
    d.run_until_quiet();
    d.start_bound();
    d.advance(HOUR_S);
    d.finish(j);
    let used = d.state.decayed_use(0, d.now).mean_gpus(0, HOUR_S * 1000);
    assert!(
        (used - 4.0).abs() < 1e-9,
        "8 GPUs for one half-life: {used}"
    );
}

#[test]
fn a_bad_cohort_configuration_is_refused_naming_the_field() {
    let mut d = Driver::default();
    for (name, half_life, field) in [(" ", 0, "name"), ("c", 316_224_001, "usage_half_life_s")] {
        let at = d.now;
        let err = d
            .try_apply(Event::CohortConfigured {
                spec: CohortSpec {
                    name: name.into(),
                    usage_half_life_s: half_life,
                },
                at,
            })
            .expect_err("refused");
        match err {
            ApplyError::Invalid(e) => assert_eq!(e.field, field),
            other => panic!("{other}"),
        }
    }
    assert!(d.state.cohorts().is_empty());
}

#[test]
fn shares_are_use_over_the_pool_divided_by_weight() {
    // With a half-life of 1 h: a's decayed use is 6 GPUs (see above) of a
    // pool of 16 that l lends: 6/16 = 0.375; b's job was only just
    // admitted: 0. At weight 2, a's share halves.
    let (mut d, _, _) = a_used_more_lately(HOUR_S);
    let shares = |d: &Driver| quota::borrower_order(&d.state, 0, d.now);
    assert_eq!(shares(&d), vec![(1, 0.0), (2, 0.0), (0, 0.375)]);
    d.tenant(tenant("a").cohort("c").weight(2.0).quota(FLAVOR, 0));
    assert_eq!(shares(&d), vec![(1, 0.0), (2, 0.0), (0, 0.1875)]);
    // Without one: what each borrows now over the pool. a borrows all 16
    // (its job ran first); b and l borrow nothing.
    let (mut d, _, _) = a_used_more_lately(0);
    assert_eq!(shares(&d), vec![(1, 0.0), (2, 0.0), (0, 1.0)]);
    d.tenant(tenant("a").cohort("c").weight(2.0).quota(FLAVOR, 0));
    assert_eq!(shares(&d), vec![(1, 0.0), (2, 0.0), (0, 0.5)]);
}

#[test]
fn a_flavor_the_cohort_lends_none_of_counts_for_nothing_in_a_share() {
    // a held 16 borrowed GPUs for two half-lives, then l stopped lending:
    // the pool is empty, and a's decayed use is a share of nothing: 0, not
    // infinite.
    let (mut d, _, _) = a_used_more_lately(HOUR_S);
    d.tenant(tenant("l").cohort("c").quota(FLAVOR, 16).lending(0));
    assert_eq!(d.state.cohort(0).capacity(0), 0);
    assert!(d.state.decayed_use(0, d.now).mean_gpus(0, HOUR_S * 1000) > 0.0);
    let shares = quota::borrower_order(&d.state, 0, d.now);
    assert_eq!(shares, vec![(0, 0.0), (1, 0.0), (2, 0.0)]);
}
