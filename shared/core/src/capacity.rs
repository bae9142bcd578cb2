//! The capacity index: free GPUs per flavor and topology domain.
//!
//! Owns: which nodes are schedulable, how many GPUs each has free, and for
//! every domain (one per flavor and topology prefix at each level, plus one
//! per node) a histogram of its nodes by free GPUs. Domains of one flavor and
//! level are kept ordered by free GPUs, so finding the fullest domain that
//! still fits an N×G gang costs O(log domains + domains probed), never a scan
//! of nodes.
//!
//! Must never: decide which job goes where (that is `placement`), or change
//! outside `State::apply`. In-cycle tentative allocations go into a
//! `CapacityOverlay`, so deciding stays a pure function of the state.

use gpusched_events::Assignment;
use gpusched_model::{Gpus, NodeId};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Index of a flavor in the state's flavor table.
pub type FlavorIdx = u16;
/// Index of a domain in the capacity index.
pub type DomainIdx = u32;

/// One topology domain of one flavor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Domain {
    /// The flavor every node in it has.
    pub flavor: FlavorIdx,
    /// Level: 0 = the flavor's whole pool, 1..=L named levels, L+1 = one node.
    pub level: u8,
    /// Path joined with `/` (`*` for the whole pool).
    pub name: String,
    /// GPUs on present (not lost) nodes.
    pub capacity: Gpus,
    /// Free GPUs on schedulable nodes.
    pub free: Gpus,
    /// `hist[k]`: schedulable nodes with exactly k free GPUs.
    hist: Vec<u32>,
    /// `cap_hist[k]`: present nodes with k GPUs in all.
    cap_hist: Vec<u32>,
    /// `buckets[k]`: the schedulable nodes with k free GPUs (empty for node domains).
    buckets: Vec<Vec<NodeId>>,
    /// Every node ever added to it, in order.
    pub nodes: Vec<NodeId>,
}

/// Places `workers` workers of `g` GPUs on `nodes` (node, free GPUs) in the
/// order given, as many per node as fit; `None` if they do not all fit.
pub fn pack_in_order(
    nodes: impl IntoIterator<Item = (NodeId, Gpus)>,
    workers: u32,
    g: Gpus,
) -> Option<Vec<Assignment>> {
    let g = g.max(1);
    let mut left = workers;
    let mut out = Vec::new();
    for (node, free) in nodes {
        if left == 0 {
            break;
        }
        let take = (free / g).min(left);
        if take > 0 {
            out.push(Assignment {
                node,
                gpus: take * g,
            });
            left -= take;
        }
    }
    (left == 0).then_some(out)
}

/// Worker slots of `g` GPUs in a histogram of nodes by GPUs.
fn slots(hist: &[u32], g: Gpus) -> u64 {
    let g = g.max(1) as usize;
    hist.iter()
        .enumerate()
        .skip(g)
        .map(|(k, &n)| n as u64 * (k / g) as u64)
        .sum()
}

fn grow<T: Clone + Default>(v: &mut Vec<T>, len: usize) {
    if v.len() < len {
        v.resize(len, T::default());
    }
}

#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
struct NodeEntry {
    flavor: FlavorIdx,
    gpus: Gpus,
    free: Gpus,
    present: bool,
    schedulable: bool,
    /// The node's domain at each level (0..=L+1).
    domains: Vec<DomainIdx>,
    /// Position in its domain's bucket at each level 0..=L.
    bucket_pos: Vec<u32>,
}

/// Free and total GPUs per flavor and domain.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
pub struct CapacityIndex {
    named_levels: usize,
    domains: Vec<Domain>,
    #[serde(with = "crate::snapshot::sorted_map")]
    domain_by_key: FxHashMap<(FlavorIdx, u8, String), DomainIdx>,
    /// `[flavor][level]`: (free, domain), ascending.
    by_free: Vec<Vec<BTreeSet<(Gpus, DomainIdx)>>>,
    /// `[flavor][level]`: (capacity, domain), ascending.
    by_capacity: Vec<Vec<BTreeSet<(Gpus, DomainIdx)>>>,
    nodes: Vec<NodeEntry>,
}

/// Tentative allocations made earlier in the same cycle.
#[derive(Clone, Debug, Default)]
pub struct CapacityOverlay {
    node_free: FxHashMap<NodeId, Gpus>,
    domains: FxHashMap<DomainIdx, (Gpus, Vec<u32>)>,
    touched: FxHashMap<(FlavorIdx, u8), Vec<DomainIdx>>,
}

impl CapacityIndex {
    /// An empty index for `named_levels` topology levels between pool and node.
    pub fn new(named_levels: usize) -> Self {
        CapacityIndex {
            named_levels,
            ..Default::default()
        }
    }

    /// Number of levels including pool (0) and node (L+1).
    pub fn level_count(&self) -> usize {
        self.named_levels + 2
    }

    /// The node level's number.
    pub fn node_level(&self) -> u8 {
        (self.named_levels + 1) as u8
    }

    /// A domain by index.
    pub fn domain(&self, d: DomainIdx) -> &Domain {
        &self.domains[d as usize]
    }

    /// Number of domains.
    pub fn domain_count(&self) -> usize {
        self.domains.len()
    }

    /// Free GPUs on a node (zero unless schedulable).
    pub fn node_free(&self, n: NodeId) -> Gpus {
        self.nodes
            .get(n.index())
            .map_or(0, |e| if e.schedulable { e.free } else { 0 })
    }

    /// Free GPUs on a node whether or not it is schedulable.
    pub fn node_raw_free(&self, n: NodeId) -> Gpus {
        self.nodes.get(n.index()).map_or(0, |e| e.free)
    }

    /// GPUs allocated on a node (whether or not it is schedulable).
    pub fn node_used(&self, n: NodeId) -> Gpus {
        self.nodes.get(n.index()).map_or(0, |e| e.gpus - e.free)
    }

    /// The node's domain at a level.
    pub fn node_domain(&self, n: NodeId, level: u8) -> Option<DomainIdx> {
        self.nodes
            .get(n.index())
            .and_then(|e| e.domains.get(level as usize).copied())
    }

    /// Whether the node takes new work.
    pub fn is_schedulable(&self, n: NodeId) -> bool {
        self.nodes.get(n.index()).is_some_and(|e| e.schedulable)
    }

    /// Free GPUs of a flavor on schedulable nodes.
    pub fn flavor_free(&self, f: FlavorIdx) -> Gpus {
        self.pool(f).map_or(0, |d| self.domains[d as usize].free)
    }

    /// GPUs of a flavor on present nodes.
    pub fn flavor_capacity(&self, f: FlavorIdx) -> Gpus {
        self.pool(f)
            .map_or(0, |d| self.domains[d as usize].capacity)
    }

    fn pool(&self, f: FlavorIdx) -> Option<DomainIdx> {
        self.by_capacity
            .get(f as usize)
            .and_then(|lv| lv.first())
            .and_then(|s| s.iter().next().map(|&(_, d)| d))
    }

    fn domain_for(&mut self, flavor: FlavorIdx, level: u8, name: String) -> DomainIdx {
        let key = (flavor, level, name);
        if let Some(&d) = self.domain_by_key.get(&key) {
            return d;
        }
        let d = self.domains.len() as DomainIdx;
        self.domains.push(Domain {
            flavor,
            level,
            name: key.2.clone(),
            capacity: 0,
            free: 0,
            hist: Vec::new(),
            cap_hist: Vec::new(),
            buckets: Vec::new(),
            nodes: Vec::new(),
        });
        self.domain_by_key.insert(key, d);
        let levels = self.level_count();
        grow(&mut self.by_free, flavor as usize + 1);
        grow(&mut self.by_capacity, flavor as usize + 1);
        grow(&mut self.by_free[flavor as usize], levels);
        grow(&mut self.by_capacity[flavor as usize], levels);
        self.by_free[flavor as usize][level as usize].insert((0, d));
        self.by_capacity[flavor as usize][level as usize].insert((0, d));
        d
    }

    /// Registers a new node (schedulable, all GPUs free). `id` must be the
    /// next node id and `path` must have one entry per named level.
    pub fn add_node(&mut self, id: NodeId, flavor: FlavorIdx, gpus: Gpus, path: &[String]) {
        debug_assert_eq!(id.index(), self.nodes.len());
        let mut domains = Vec::with_capacity(self.level_count());
        domains.push(self.domain_for(flavor, 0, "*".to_string()));
        let mut prefix = String::new();
        for (i, p) in path.iter().enumerate() {
            if i > 0 {
                prefix.push('/');
            }
            prefix.push_str(p);
            domains.push(self.domain_for(flavor, (i + 1) as u8, prefix.clone()));
        }
        let node_level = self.node_level();
        domains.push(self.domain_for(flavor, node_level, format!("#{}", id.0)));
        for &d in &domains {
            self.domains[d as usize].nodes.push(id);
        }
        self.nodes.push(NodeEntry {
            flavor,
            gpus,
            free: gpus,
            present: false,
            schedulable: false,
            domains,
            bucket_pos: vec![0; self.named_levels + 1],
        });
        self.set_present(id, true);
        self.set_schedulable(id, true);
    }

    fn reposition(
        &mut self,
        f: FlavorIdx,
        level: u8,
        d: DomainIdx,
        old: Gpus,
        new: Gpus,
        cap: bool,
    ) {
        let sets = if cap {
            &mut self.by_capacity
        } else {
            &mut self.by_free
        };
        let set = &mut sets[f as usize][level as usize];
        set.remove(&(old, d));
        set.insert((new, d));
    }

    fn set_present(&mut self, n: NodeId, present: bool) {
        let e = &mut self.nodes[n.index()];
        if e.present == present {
            return;
        }
        e.present = present;
        let (gpus, flavor) = (e.gpus as usize, e.flavor);
        let doms = e.domains.clone();
        for d in doms {
            let dom = &mut self.domains[d as usize];
            let old = dom.capacity;
            grow(&mut dom.cap_hist, gpus + 1);
            if present {
                dom.cap_hist[gpus] += 1;
                dom.capacity += gpus as Gpus;
            } else {
                dom.cap_hist[gpus] -= 1;
                dom.capacity -= gpus as Gpus;
            }
            let (level, new) = (dom.level, dom.capacity);
            self.reposition(flavor, level, d, old, new, true);
        }
    }

    /// Takes a node in or out of scheduling (cordon, drain, loss).
    pub fn set_schedulable(&mut self, n: NodeId, on: bool) {
        let e = &self.nodes[n.index()];
        if e.schedulable == on || (on && !e.present) {
            return;
        }
        if on {
            self.nodes[n.index()].schedulable = true;
            let free = self.nodes[n.index()].free;
            self.hist_insert(n, free);
        } else {
            let free = self.nodes[n.index()].free;
            self.hist_remove(n, free);
            self.nodes[n.index()].schedulable = false;
        }
    }

    /// Marks a node lost: it leaves scheduling and capacity for good.
    pub fn remove_node(&mut self, n: NodeId) {
        self.set_schedulable(n, false);
        self.set_present(n, false);
    }

    /// Counts a removed node's capacity again (it is not schedulable until
    /// [`Self::set_schedulable`] says so).
    pub fn restore_node(&mut self, n: NodeId) {
        self.set_present(n, true);
    }

    /// A node's flavor and its domains, one per level from the top.
    fn flavor_and_domains(&self, n: NodeId) -> (FlavorIdx, Vec<DomainIdx>) {
        let e = &self.nodes[n.index()];
        (e.flavor, e.domains.clone())
    }

    fn hist_insert(&mut self, n: NodeId, free: Gpus) {
        let node_level = self.node_level();
        let (flavor, doms) = self.flavor_and_domains(n);
        for (lvl, d) in doms.into_iter().enumerate() {
            let dom = &mut self.domains[d as usize];
            grow(&mut dom.hist, free as usize + 1);
            dom.hist[free as usize] += 1;
            let old = dom.free;
            dom.free += free;
            if (lvl as u8) < node_level {
                grow(&mut dom.buckets, free as usize + 1);
                let b = &mut dom.buckets[free as usize];
                let pos = b.len() as u32;
                b.push(n);
                self.nodes[n.index()].bucket_pos[lvl] = pos;
            }
            let new = self.domains[d as usize].free;
            self.reposition(flavor, lvl as u8, d, old, new, false);
        }
    }

    fn hist_remove(&mut self, n: NodeId, free: Gpus) {
        let node_level = self.node_level();
        let (flavor, doms) = self.flavor_and_domains(n);
        for (lvl, d) in doms.into_iter().enumerate() {
            let dom = &mut self.domains[d as usize];
            dom.hist[free as usize] -= 1;
            let old = dom.free;
            dom.free -= free;
            if (lvl as u8) < node_level {
                let pos = self.nodes[n.index()].bucket_pos[lvl] as usize;
                let b = &mut dom.buckets[free as usize];
                b.swap_remove(pos);
                if let Some(&moved) = b.get(pos) {
                    self.nodes[moved.index()].bucket_pos[lvl] = pos as u32;
                }
            }
            let new = self.domains[d as usize].free;
            self.reposition(flavor, lvl as u8, d, old, new, false);
        }
    }

    /// Sets a node's free GPUs (after an allocation or a release).
    pub fn set_node_free(&mut self, n: NodeId, free: Gpus) {
        let e = &self.nodes[n.index()];
        debug_assert!(free <= e.gpus);
        let old = e.free;
        if old == free {
            return;
        }
        if e.schedulable {
            self.hist_remove(n, old);
            self.nodes[n.index()].free = free;
            self.hist_insert(n, free);
        } else {
            self.nodes[n.index()].free = free;
        }
    }

    /// Total GPUs on a node.
    pub fn node_gpus(&self, n: NodeId) -> Gpus {
        self.nodes.get(n.index()).map_or(0, |e| e.gpus)
    }

    /// The most worker slots of `g` GPUs that one domain of this flavor and
    /// level could hold with all present nodes idle; probes domains from the
    /// largest down and stops at the first that holds `workers`.
    pub fn max_domain_slots(&self, f: FlavorIdx, level: u8, workers: u32, g: Gpus) -> u64 {
        let Some(set) = cell(&self.by_capacity, f as usize, level as usize) else {
            return 0;
        };
        let mut best = 0;
        for &(cap, d) in set.iter().rev() {
            if (cap as u64) < best * g as u64 {
                break;
            }
            let s = slots(&self.domains[d as usize].cap_hist, g);
            best = best.max(s);
            if best >= workers as u64 {
                break;
            }
        }
        best
    }

    /// Whether the flavor has any present node.
    pub fn has_nodes(&self, f: FlavorIdx) -> bool {
        self.flavor_capacity(f) > 0
    }

    /// Free GPUs of a domain counting tentative allocations.
    pub fn dom_free(&self, ov: &CapacityOverlay, d: DomainIdx) -> Gpus {
        ov.domains
            .get(&d)
            .map_or(self.domains[d as usize].free, |(f, _)| *f)
    }

    /// Most free GPUs in one domain of this flavor and level.
    pub fn largest_free(&self, ov: &CapacityOverlay, f: FlavorIdx, level: u8) -> Gpus {
        let Some(set) = cell(&self.by_free, f as usize, level as usize) else {
            return 0;
        };
        let untouched = set
            .iter()
            .rev()
            .find(|(_, d)| !ov.domains.contains_key(d))
            .map_or(0, |&(free, _)| free);
        let touched = ov
            .touched
            .get(&(f, level))
            .into_iter()
            .flatten()
            .map(|&d| self.dom_free(ov, d))
            .max()
            .unwrap_or(0);
        untouched.max(touched)
    }

    /// The fullest domain of this flavor and level with room for `workers`
    /// workers of `g` GPUs each, counting tentative allocations in `ov`.
    /// `probes` counts the domains examined.
    pub fn find_domain(
        &self,
        ov: &CapacityOverlay,
        f: FlavorIdx,
        level: u8,
        workers: u32,
        g: Gpus,
        probes: &mut u64,
    ) -> Option<DomainIdx> {
        let set = self.by_free.get(f as usize)?.get(level as usize)?;
        let need = workers.saturating_mul(g);
        let mut best: Option<(Gpus, DomainIdx)> = None;
        for &d in ov.touched.get(&(f, level)).into_iter().flatten() {
            *probes += 1;
            let (free, hist) = &ov.domains[&d];
            if *free >= need && slots(hist, g) >= workers as u64 {
                let cand = (*free, d);
                if best.is_none_or(|b| cand < b) {
                    best = Some(cand);
                }
            }
        }
        for &(free, d) in set.range((need, 0)..) {
            if best.is_some_and(|b| (free, d) >= b) {
                break;
            }
            if ov.domains.contains_key(&d) {
                continue;
            }
            *probes += 1;
            if slots(&self.domains[d as usize].hist, g) >= workers as u64 {
                best = Some((free, d));
                break;
            }
        }
        best.map(|(_, d)| d)
    }

    /// Worker slots of `g` GPUs in a domain's schedulable nodes, counting
    /// tentative allocations in `ov`, with some nodes' free GPUs replaced by
    /// `overrides` (node, free now as `free_with` reads it, free after).
    pub fn domain_slots_with(
        &self,
        ov: &CapacityOverlay,
        d: DomainIdx,
        g: Gpus,
        overrides: &[(NodeId, Gpus, Gpus)],
    ) -> u64 {
        let hist = ov
            .domains
            .get(&d)
            .map_or(&self.domains[d as usize].hist, |(_, h)| h);
        let base = slots(hist, g);
        let g = g.max(1) as u64;
        let minus: u64 = overrides.iter().map(|&(_, now, _)| now as u64 / g).sum();
        let plus: u64 = overrides
            .iter()
            .map(|&(_, _, after)| after as u64 / g)
            .sum();
        (base + plus).saturating_sub(minus)
    }

    /// Domains of a flavor and level, most free GPUs first.
    pub fn domains_by_free_desc(
        &self,
        f: FlavorIdx,
        level: u8,
    ) -> impl Iterator<Item = DomainIdx> + '_ {
        let by_free = cell(&self.by_free, f as usize, level as usize);
        by_free
            .into_iter()
            .flat_map(|s| s.iter().rev().map(|&(_, d)| d))
    }

    /// Free GPUs of a node counting tentative allocations.
    pub fn free_with(&self, ov: &CapacityOverlay, n: NodeId) -> Gpus {
        ov.node_free
            .get(&n)
            .copied()
            .unwrap_or_else(|| self.node_free(n))
    }

    /// Picks nodes in domain `d` for `workers` workers of `g` GPUs, fullest
    /// nodes first (least free GPUs that still hold a worker), so large holes
    /// stay whole. Returns `None` if the domain cannot hold them.
    pub fn choose_nodes(
        &self,
        ov: &CapacityOverlay,
        d: DomainIdx,
        workers: u32,
        g: Gpus,
    ) -> Option<Vec<Assignment>> {
        let dom = &self.domains[d as usize];
        let mut left = workers;
        let mut out = Vec::new();
        let mut take = |n: NodeId, free: Gpus, left: &mut u32| {
            let w = (free / g).min(*left);
            if w > 0 {
                out.push(Assignment {
                    node: n,
                    gpus: w * g,
                });
                *left -= w;
            }
        };
        if dom.level == self.node_level() {
            let n = NodeId(
                dom.name
                    .strip_prefix('#')
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(u32::MAX),
            );
            take(n, self.free_with(ov, n), &mut left);
        } else {
            let lvl = dom.level as usize;
            let mut touched: Vec<(Gpus, NodeId)> = ov
                .node_free
                .iter()
                .filter(|(n, _)| self.nodes[n.index()].domains[lvl] == d)
                .map(|(&n, &free)| (free, n))
                .collect();
            touched.sort_unstable();
            let mut ti = touched.partition_point(|&(free, _)| free < g);
            for k in g as usize..dom.buckets.len() {
                while ti < touched.len() && touched[ti].0 as usize == k && left > 0 {
                    take(touched[ti].1, touched[ti].0, &mut left);
                    ti += 1;
                }
                for &n in &dom.buckets[k] {
                    if left == 0 {
                        break;
                    }
                    if !ov.node_free.contains_key(&n) {
                        take(n, k as Gpus, &mut left);
                    }
                }
                if left == 0 {
                    break;
                }
            }
            while ti < touched.len() && left > 0 {
                take(touched[ti].1, touched[ti].0, &mut left);
                ti += 1;
            }
        }
        (left == 0).then_some(out)
    }

    /// Records a tentative allocation in the overlay.
    pub fn take(&self, ov: &mut CapacityOverlay, assignments: &[Assignment]) {
        for a in assignments {
            let old = self.free_with(ov, a.node);
            let new = old - a.gpus;
            ov.node_free.insert(a.node, new);
            let e = &self.nodes[a.node.index()];
            for &d in &e.domains {
                let dom = &self.domains[d as usize];
                if !ov.domains.contains_key(&d) {
                    ov.touched
                        .entry((dom.flavor, dom.level))
                        .or_default()
                        .push(d);
                    ov.domains.insert(d, (dom.free, dom.hist.clone()));
                }
                let Some(entry) = ov.domains.get_mut(&d) else {
                    continue;
                };
                entry.0 -= a.gpus;
                entry.1[old as usize] -= 1;
                grow(&mut entry.1, new as usize + 1);
                entry.1[new as usize] += 1;
            }
        }
    }

    /// Recomputes every domain's totals from the nodes and compares; for tests.
    pub fn check_consistency(&self) -> Result<(), String> {
        let mut free = vec![0u64; self.domains.len()];
        let mut cap = vec![0u64; self.domains.len()];
        for (i, e) in self.nodes.iter().enumerate() {
            for &d in &e.domains {
                if e.present {
                    cap[d as usize] += e.gpus as u64;
                }
                if e.schedulable {
                    free[d as usize] += e.free as u64;
                }
            }
            if e.free > e.gpus {
                return Err(format!("node {i} has more free than GPUs"));
            }
        }
        for (i, dom) in self.domains.iter().enumerate() {
            if dom.free as u64 != free[i] || dom.capacity as u64 != cap[i] {
                return Err(format!("domain {} totals drifted", dom.name));
            }
            let set = &self.by_free[dom.flavor as usize][dom.level as usize];
            if !set.contains(&(dom.free, i as DomainIdx)) {
                return Err(format!("domain {} missing from the free order", dom.name));
            }
            for (k, b) in dom.buckets.iter().enumerate() {
                if b.len() as u32 != dom.hist.get(k).copied().unwrap_or(0) {
                    return Err(format!("domain {} bucket {k} drifted", dom.name));
                }
            }
        }
        Ok(())
    }
}

/// The cell at `row`, `col` of a table kept as a vector of rows, if the
/// table reaches it (rows grow only as they are written).
pub(crate) fn cell<T>(table: &[Vec<T>], row: usize, col: usize) -> Option<&T> {
    table.get(row).and_then(|r| r.get(col))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(blocks: usize, nodes_per_block: usize, gpus: Gpus) -> CapacityIndex {
        let mut ix = CapacityIndex::new(2);
        let mut id = 0;
        for b in 0..blocks {
            for _ in 0..nodes_per_block {
                ix.add_node(NodeId(id), 0, gpus, &["r0".into(), format!("b{b}")]);
                id += 1;
            }
        }
        ix
    }

    #[test]
    fn slots_count_whole_workers() {
        let hist = vec![0, 0, 0, 1, 0, 0, 0, 0, 2]; // one node with 3 free, two with 8
        assert_eq!(slots(&hist, 4), 4);
        assert_eq!(slots(&hist, 3), 5);
        assert_eq!(slots(&hist, 8), 2);
    }

    #[test]
    fn prefers_the_fullest_domain_that_fits() {
        let mut ix = index(2, 2, 8);
        // block 0 loses 6 GPUs: 10 free; block 1 keeps 16.
        ix.set_node_free(NodeId(0), 2);
        let ov = CapacityOverlay::default();
        let mut probes = 0;
        let d = ix.find_domain(&ov, 0, 2, 1, 8, &mut probes).unwrap();
        assert_eq!(ix.domain(d).name, "r0/b0");
        let d = ix.find_domain(&ov, 0, 2, 2, 8, &mut probes).unwrap();
        assert_eq!(ix.domain(d).name, "r0/b1");
        assert!(ix.find_domain(&ov, 0, 2, 3, 8, &mut probes).is_none());
        ix.check_consistency().unwrap();
    }

    #[test]
    fn overlay_counts_tentative_allocations() {
        let ix = index(1, 2, 8);
        let mut ov = CapacityOverlay::default();
        let mut probes = 0;
        let d = ix.find_domain(&ov, 0, 2, 2, 8, &mut probes).unwrap();
        let a = ix.choose_nodes(&ov, d, 2, 8).unwrap();
        assert_eq!(a.len(), 2);
        ix.take(&mut ov, &a);
        assert!(ix.find_domain(&ov, 0, 2, 1, 1, &mut probes).is_none());
        assert_eq!(ix.largest_free(&ov, 0, 2), 0);
    }

    #[test]
    fn packs_onto_the_fullest_node() {
        let mut ix = index(1, 3, 8);
        ix.set_node_free(NodeId(1), 2);
        ix.set_node_free(NodeId(2), 5);
        let ov = CapacityOverlay::default();
        let mut probes = 0;
        let d = ix.find_domain(&ov, 0, 2, 1, 2, &mut probes).unwrap();
        let a = ix.choose_nodes(&ov, d, 1, 2).unwrap();
        assert_eq!(
            a,
            vec![Assignment {
                node: NodeId(1),
                gpus: 2
            }]
        );
        let a = ix.choose_nodes(&ov, d, 3, 2).unwrap();
        // node 1 takes one worker, node 2 takes two (5 free → 2 workers of 2).
        assert_eq!(a[0].node, NodeId(1));
        assert_eq!(
            a[1],
            Assignment {
                node: NodeId(2),
                gpus: 4
            }
        );
        ix.set_schedulable(NodeId(2), false);
        ix.check_consistency().unwrap();
        assert_eq!(ix.domain(d).free, 10);
    }

    #[test]
    fn max_domain_slots_ignores_load() {
        let mut ix = index(2, 4, 8);
        ix.set_node_free(NodeId(0), 0);
        assert_eq!(ix.max_domain_slots(0, 2, 4, 8), 4);
        assert_eq!(ix.max_domain_slots(0, 0, 8, 8), 8);
        assert_eq!(ix.max_domain_slots(0, 3, 1, 8), 1);
    }
}
