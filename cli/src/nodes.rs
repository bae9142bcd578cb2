//! `gpusched nodes`: the nodes `GET /v1/nodes` returns, summed up by
//! flavor and by topology domain, and filtered by flavor and status.
//!
//! Owns: the node filters and their checks, the summary's sums, and its
//! tables and JSON. Must never: ask the server anything (the client
//! fetches and prints) or let a hash map's order decide a row's place:
//! rows come in the order the server lists nodes (by id).

use std::collections::BTreeMap;

use serde_json::{json, Value};

/// A node status, as `GET /v1/nodes` writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Status {
    /// Takes work.
    Ready,
    /// Takes no new work.
    Cordoned,
    /// Takes no new work; emptied for maintenance.
    Drained,
    /// Gone.
    Lost,
    /// Takes no new work; its jobs are evicted for maintenance.
    Evicted,
}

impl Status {
    /// Every status, in column order.
    pub const ALL: [Status; 5] = [
        Status::Ready,
        Status::Cordoned,
        Status::Drained,
        Status::Evicted,
        Status::Lost,
    ];

    /// Its name in the API.
    pub fn name(self) -> &'static str {
        match self {
            Status::Ready => "ready",
            Status::Cordoned => "cordoned",
            Status::Drained => "drained",
            Status::Lost => "lost",
            Status::Evicted => "evicted",
        }
    }
}

fn text<'a>(n: &'a Value, k: &str) -> &'a str {
    n.get(k).and_then(Value::as_str).unwrap_or("")
}

fn num(n: &Value, k: &str) -> u64 {
    n.get(k).and_then(Value::as_u64).unwrap_or(0)
}

/// The flavors the nodes have, in the order they first appear.
pub fn flavors(nodes: &[Value]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in nodes {
        let f = text(n, "flavor");
        if !out.iter().any(|x| x == f) {
            out.push(f.to_string());
        }
    }
    out
}

/// Checks `--flavor` values against the cluster's flavors: an unknown
/// one is named with the flavors there are.
pub fn check_flavors(nodes: &[Value], wanted: &[String]) -> Result<(), String> {
    let have = flavors(nodes);
    match wanted.iter().find(|w| !have.contains(w)) {
        None => Ok(()),
        Some(w) => Err(format!(
            "--flavor: unknown flavor {w:?}; the cluster has {}",
            if have.is_empty() {
                "no nodes".to_string()
            } else {
                have.join(", ")
            }
        )),
    }
}

/// Whether a node passes the filters (an empty filter passes all).
pub fn keep(n: &Value, flavors: &[String], states: &[Status]) -> bool {
    (flavors.is_empty() || flavors.iter().any(|f| f == text(n, "flavor")))
        && (states.is_empty() || states.iter().any(|s| s.name() == text(n, "status")))
}

/// Sums over a set of nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Nodes.
    pub nodes: u64,
    /// GPUs on them.
    pub gpus: u64,
    /// GPUs allocated.
    pub used: u64,
    /// GPUs unallocated on ready nodes (what new work can get).
    pub free: u64,
    /// Nodes per status, in [`Status::ALL`] order.
    pub by_status: [u64; Status::ALL.len()],
}

impl Tally {
    fn add(&mut self, n: &Value) {
        let (gpus, used) = (num(n, "gpus"), num(n, "used"));
        self.nodes += 1;
        self.gpus += gpus;
        self.used += used;
        let status = text(n, "status");
        if let Some(i) = Status::ALL.iter().position(|s| s.name() == status) {
            self.by_status[i] += 1;
        }
        if status == Status::Ready.name() {
            self.free += gpus.saturating_sub(used);
        }
    }

    fn cells(&self) -> Vec<String> {
        let mut c = vec![
            self.nodes.to_string(),
            self.gpus.to_string(),
            self.used.to_string(),
            self.free.to_string(),
        ];
        c.extend(self.by_status.iter().map(u64::to_string));
        c
    }

    fn to_json(&self) -> Value {
        let mut v = json!({
            "nodes": self.nodes,
            "gpus": self.gpus,
            "used": self.used,
            "free": self.free,
        });
        if let Some(o) = v.as_object_mut() {
            for (s, n) in Status::ALL.iter().zip(self.by_status) {
                o.insert(s.name().to_string(), json!(n));
            }
        }
        v
    }
}

/// Rows keyed by a name, in the order the names first appear.
#[derive(Debug, Default)]
struct Rows {
    index: BTreeMap<Vec<String>, usize>,
    rows: Vec<(Vec<String>, Tally)>,
}

impl Rows {
    fn add(&mut self, key: Vec<String>, n: &Value) {
        let i = match self.index.get(&key) {
            Some(i) => *i,
            None => {
                self.index.insert(key.clone(), self.rows.len());
                self.rows.push((key, Tally::default()));
                self.rows.len() - 1
            }
        };
        self.rows[i].1.add(n);
    }
}

/// The nodes summed up: in all, per flavor, and per topology domain (the
/// path's first `depth` levels) and flavor.
#[derive(Debug)]
pub struct Summary {
    /// Every node.
    pub total: Tally,
    /// Per flavor.
    pub by_flavor: Vec<(String, Tally)>,
    /// Per domain and flavor: (domain, flavor, sums).
    pub by_domain: Vec<(String, String, Tally)>,
}

/// Sums `nodes` up; `depth` levels of their topology path name a domain.
pub fn summarize<'a>(nodes: impl IntoIterator<Item = &'a Value>, depth: usize) -> Summary {
    let (mut total, mut by_flavor, mut by_domain) =
        (Tally::default(), Rows::default(), Rows::default());
    for n in nodes {
        total.add(n);
        let flavor = text(n, "flavor").to_string();
        let path: Vec<&str> = n
            .get("path")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).take(depth).collect())
            .unwrap_or_default();
        let domain = if path.is_empty() {
            "-".to_string()
        } else {
            path.join("/")
        };
        by_flavor.add(vec![flavor.clone()], n);
        by_domain.add(vec![domain, flavor], n);
    }
    let first = |k: &[String], i: usize| k.get(i).cloned().unwrap_or_default();
    Summary {
        total,
        by_flavor: by_flavor
            .rows
            .into_iter()
            .map(|(k, t)| (first(&k, 0), t))
            .collect(),
        by_domain: by_domain
            .rows
            .into_iter()
            .map(|(k, t)| (first(&k, 0), first(&k, 1), t))
            .collect(),
    }
}

const SUMS: [&str; 9] = [
    "NODES", "GPUS", "USED", "FREE", "READY", "CORDONED", "DRAINED", "EVICTED", "LOST",
];

impl Summary {
    /// Two tables: per flavor with a TOTAL row, then per domain.
    pub fn to_text(&self) -> String {
        let mut header = vec!["FLAVOR"];
        header.extend(SUMS);
        let mut rows: Vec<Vec<String>> = self
            .by_flavor
            .iter()
            .map(|(f, t)| {
                let mut r = vec![f.clone()];
                r.extend(t.cells());
                r
            })
            .collect();
        let mut total = vec!["TOTAL".to_string()];
        total.extend(self.total.cells());
        rows.push(total);
        let flavors = crate::client::table(&header, &rows);

        let mut header = vec!["TOPOLOGY", "FLAVOR"];
        header.extend(SUMS);
        let rows: Vec<Vec<String>> = self
            .by_domain
            .iter()
            .map(|(d, f, t)| {
                let mut r = vec![d.clone(), f.clone()];
                r.extend(t.cells());
                r
            })
            .collect();
        let domains = crate::client::table(&header, &rows);
        format!("{flavors}\n\n{domains}")
    }

    /// `{"total", "by_flavor": [{"flavor", ...}], "by_domain": [{"domain",
    /// "flavor", ...}]}`; each with nodes, gpus, used, free and a count per
    /// status.
    pub fn to_json(&self) -> Value {
        let with = |mut v: Value, keys: &[(&str, &str)]| {
            if let Some(o) = v.as_object_mut() {
                for (k, x) in keys {
                    o.insert((*k).to_string(), json!(x));
                }
            }
            v
        };
        json!({
            "total": self.total.to_json(),
            "by_flavor": self.by_flavor.iter()
                .map(|(f, t)| with(t.to_json(), &[("flavor", f)]))
                .collect::<Vec<_>>(),
            "by_domain": self.by_domain.iter()
                .map(|(d, f, t)| with(t.to_json(), &[("domain", d), ("flavor", f)]))
                .collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, flavor: &str, path: &[&str], status: &str, gpus: u64, used: u64) -> Value {
        json!({"name": name, "flavor": flavor, "path": path, "status": status,
               "gpus": gpus, "used": used, "jobs": [], "reserved_for": null})
    }

    fn cluster() -> Vec<Value> {
        vec![
            node("h0", "h100", &["rack-0", "block-0"], "ready", 8, 8),
            node("h1", "h100", &["rack-0", "block-1"], "ready", 8, 2),
            node("h2", "h100", &["rack-1", "block-0"], "cordoned", 8, 0),
            node("a0", "a100", &["rack-0", "block-0"], "ready", 4, 0),
            node("a1", "a100", &["rack-0", "block-0"], "lost", 4, 0),
        ]
    }

    #[test]
    fn sums_by_flavor_and_domain_add_up_to_the_cluster() {
        let nodes = cluster();
        let s = summarize(&nodes, 1);
        assert_eq!(
            s.total,
            Tally {
                nodes: 5,
                gpus: 32,
                used: 10,
                // Cordoned and lost nodes' GPUs are not free.
                free: 6 + 4,
                by_status: [3, 1, 0, 0, 1],
            }
        );
        let names: Vec<&str> = s.by_flavor.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(names, ["h100", "a100"]);
        assert_eq!(s.by_flavor[0].1.gpus + s.by_flavor[1].1.gpus, 32);
        let domains: Vec<(&str, &str, u64)> = s
            .by_domain
            .iter()
            .map(|(d, f, t)| (d.as_str(), f.as_str(), t.nodes))
            .collect();
        assert_eq!(
            domains,
            [
                ("rack-0", "h100", 2),
                ("rack-1", "h100", 1),
                ("rack-0", "a100", 2)
            ]
        );
        let deeper = summarize(&nodes, 2);
        assert_eq!(deeper.by_domain[0].0, "rack-0/block-0");
        assert_eq!(deeper.by_domain.len(), 4);
        let v = s.to_json();
        assert_eq!(v["total"]["gpus"], 32);
        assert_eq!(v["total"]["lost"], 1);
        assert_eq!(v["by_domain"][2]["flavor"], "a100");
        let t = s.to_text();
        assert!(t.starts_with("FLAVOR"), "{t}");
        assert!(
            t.lines()
                .any(|l| l.starts_with("TOTAL") && l.contains(" 32 ")),
            "{t}"
        );
    }

    #[test]
    fn filters_keep_the_flavors_and_statuses_asked() {
        let nodes = cluster();
        let kept: Vec<&str> = nodes
            .iter()
            .filter(|n| keep(n, &["h100".into()], &[Status::Ready]))
            .map(|n| text(n, "name"))
            .collect();
        assert_eq!(kept, ["h0", "h1"]);
        assert_eq!(nodes.iter().filter(|n| keep(n, &[], &[])).count(), 5);
        assert_eq!(
            nodes
                .iter()
                .filter(|n| keep(n, &[], &[Status::Lost, Status::Cordoned]))
                .count(),
            2
        );
    }

    #[test]
    fn an_unknown_flavor_is_named_with_the_ones_there_are() {
        let nodes = cluster();
        assert!(check_flavors(&nodes, &["a100".into()]).is_ok());
        assert_eq!(
            check_flavors(&nodes, &["b200".into()]).unwrap_err(),
            "--flavor: unknown flavor \"b200\"; the cluster has h100, a100"
        );
    }
}
