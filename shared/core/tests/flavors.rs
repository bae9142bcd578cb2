//! Which flavor a job that may use several is charged in
//! (`quota::choose_flavor`): of the flavors whose quota admits it, the one
//! where it can run soonest and cheapest, in this order: a flavor whose
//! nodes could never hold the gang goes last; then one where it borrows
//! nothing beats one where it borrows; then one with room for the gang now
//! beats one without; then the order the job listed them. Worked examples,
//! each of which fails if its rule breaks.

mod common;

use common::{job, tenant, Driver};
use gpusched_core::Phase;
use gpusched_events::Event;
use gpusched_model::JobId;

/// A job of tenant `t`, 1 worker × `gpw` GPUs, that may use `flavors` in
/// that order of preference.
fn may_use(d: &mut Driver, gpw: u32, flavors: &[&str]) -> JobId {
    let mut spec = job("t", 1, gpw, "node");
    spec.flavors = flavors.iter().map(|f| f.to_string()).collect();
    d.submit(spec)
}

/// The flavor the job was charged in.
fn charged_in(d: &Driver, j: JobId) -> &str {
    let f = d.job(j).flavor.expect("admitted");
    d.state.flavor_name(f)
}

/// Flavors `a` and `b`, two 8-GPU nodes each; tenant `t` has 16 GPUs of
/// each.
fn two_flavors() -> Driver {
    let mut d = Driver::default();
    d.cluster(1, 1, 2, 8, "a");
    d.add_node("r0", "b9", 8, "b");
    d.add_node("r0", "b9", 8, "b");
    d.tenant(tenant("t").quota("a", 16).quota("b", 16));
    d
}

#[test]
fn where_both_are_alike_the_first_listed_wins() {
    // Given two flavors with room and quota, when a job lists b before a,
    // then it goes to b; listing a first, to a.
    let mut d = two_flavors();
    let b_first = may_use(&mut d, 8, &["b", "a"]);
    let a_first = may_use(&mut d, 8, &["a", "b"]);
    d.run_until_quiet();
    assert_eq!(charged_in(&d, b_first), "b");
    assert_eq!(charged_in(&d, a_first), "a");
}

#[test]
fn a_flavor_with_room_now_beats_an_earlier_one_without() {
    // Given both of a's nodes busy (t's own jobs there, 16 of the 24 GPUs
    // of a it owns), when a job lists a before b, then it goes to b, which
    // has room now.
    let mut d = two_flavors();
    d.tenant(tenant("t").quota("a", 24).quota("b", 16));
    let busy = may_use(&mut d, 8, &["a"]);
    let busy2 = may_use(&mut d, 8, &["a"]);
    d.run_until_quiet();
    assert_eq!(d.phase(busy), Phase::Bound);
    assert_eq!(d.phase(busy2), Phase::Bound);
    let j = may_use(&mut d, 8, &["a", "b"]);
    d.run_until_quiet();
    assert_eq!(charged_in(&d, j), "b");
    assert_eq!(d.phase(j), Phase::Bound);
}

/// Tenant `t` in cohort `c` owns 16 GPUs of `a` and none of `b`; lender
/// `l` owns 16 of `b`. Two 8-GPU nodes of each.
fn owner_of_a_only() -> Driver {
    let mut d = Driver::default();
    d.cluster(1, 1, 2, 8, "a");
    d.add_node("r0", "b9", 8, "b");
    d.add_node("r0", "b9", 8, "b");
    d.tenant(tenant("t").cohort("c").quota("a", 16).quota("b", 0));
    d.tenant(tenant("l").cohort("c").quota("a", 0).quota("b", 16));
    d
}

#[test]
fn a_flavor_where_it_borrows_nothing_beats_an_earlier_one_where_it_borrows() {
    // Given t owns a and must borrow b, when a job lists b before a, then
    // it goes to a, borrowing nothing.
    let mut d = owner_of_a_only();
    let j = may_use(&mut d, 8, &["b", "a"]);
    d.run_until_quiet();
    assert_eq!(charged_in(&d, j), "a");
    assert_eq!(d.job(j).borrowed, 0);
}

#[test]
fn borrowing_counts_before_room_now() {
    // Given a's two nodes busy with t's own jobs (16 of the 24 GPUs of a
    // it owns), when a job lists b before a, then it is charged
    // in a, where it borrows nothing though it must wait for room, not in
    // b, where it would borrow and could run now.
    let mut d = Driver::default();
    d.cluster(1, 1, 2, 8, "a");
    d.add_node("r0", "b9", 8, "b");
    d.tenant(tenant("t").cohort("c").quota("a", 24).quota("b", 0));
    d.tenant(tenant("l").cohort("c").quota("a", 0).quota("b", 16));
    for _ in 0..2 {
        may_use(&mut d, 8, &["a"]);
    }
    d.run_until_quiet();
    let j = may_use(&mut d, 8, &["b", "a"]);
    d.run_until_quiet();
    assert_eq!(charged_in(&d, j), "a");
    assert_eq!(d.phase(j), Phase::Admitted, "admitted, waiting for room");
}

#[test]
fn a_flavor_whose_nodes_could_never_hold_the_gang_goes_last_even_behind_borrowing() {
    // Given t owns 16 GPUs of a, whose nodes have 4 GPUs each, and must
    // borrow b, when a 1×8 job lists a first, then it goes to b: charged
    // in a, it would wait forever.
    let mut d = Driver::default();
    d.cluster(1, 1, 4, 4, "a");
    d.add_node("r0", "b9", 8, "b");
    d.tenant(tenant("t").cohort("c").quota("a", 16).quota("b", 0));
    d.tenant(tenant("l").cohort("c").quota("a", 0).quota("b", 16));
    let j = may_use(&mut d, 8, &["a", "b"]);
    d.run_until_quiet();
    assert_eq!(charged_in(&d, j), "b");
    assert_eq!(d.job(j).borrowed, 8);
}

#[test]
fn a_flavor_with_no_nodes_yet_is_not_one_that_could_never_hold_the_gang() {
    // Given flavor b's nodes have 4 GPUs each and flavor a has no nodes at
    // all (they may join), when a 1×8 job lists b first, then it is
    // charged in a: b can never hold it, a may.
    let mut d = Driver::default();
    d.cluster(1, 1, 2, 4, "b");
    d.tenant(tenant("t").quota("b", 16).quota("a", 16));
    let j = may_use(&mut d, 8, &["b", "a"]);
    d.run_until_quiet();
    assert_eq!(charged_in(&d, j), "a");
    assert_eq!(d.phase(j), Phase::Admitted);
}

#[test]
fn a_flavor_that_lost_the_nodes_that_could_hold_the_gang_goes_last() {
    // Given t owns 16 GPUs of a (two 4-GPU nodes and one 8-GPU node) and
    // must borrow b, a 1×8 job listing a first is accepted; when a's 8-GPU
    // node is lost before quota is charged, then it goes to b: a can no
    // longer hold it.
    let mut d = Driver::default();
    d.cluster(1, 1, 2, 4, "a");
    let big = d.add_node("r0", "b1", 8, "a");
    d.add_node("r0", "b9", 8, "b");
    d.tenant(tenant("t").cohort("c").quota("a", 16).quota("b", 0));
    d.tenant(tenant("l").cohort("c").quota("a", 0).quota("b", 16));
    let j = may_use(&mut d, 8, &["a", "b"]);
    d.apply(Event::JobAccepted { job: j });
    assert_eq!(d.job(j).flavors.len(), 2);
    let at = d.now;
    d.apply(Event::NodeLost { node: big, at });
    d.run_until_quiet();
    assert_eq!(charged_in(&d, j), "b");
    assert_eq!(d.job(j).borrowed, 8);
}
