//! The deployment files, checked without a cluster or a container engine.
//!
//! - Each Kubernetes overlay (`deploy/k8s/overlays/*`) is rendered with
//!   `kubectl kustomize` and every object parsed into the typed Kubernetes
//!   API (`k8s-openapi`), refusing any field the API does not have.
//! - Every gpusched container, there and in `docker-compose.yml` (through
//!   `docker-compose config`), runs a binary of this workspace with flags
//!   and environment variables its `--help` lists; its probes ask the port
//!   it listens on, for paths its code serves.
//! - The objects fit together: every Secret, ConfigMap and volume claim a
//!   pod names exists (or, in prod, the overlay says how to create it),
//!   every Service selects pods with its target port, every leased service
//!   runs a leader and a standby under a disruption budget, and only the
//!   gateway takes traffic from outside the namespace.

mod stack;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PersistentVolumeClaim, PodTemplateSpec, Probe, Secret, Service,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// Environment variables gpusched containers set that no `--help` lists,
/// with who reads them.
const READ_OUTSIDE_CLAP: [(&str, &str); 3] = [
    (
        "RUST_LOG",
        "tracing's log filter (gpusched_runtime::init_tracing)",
    ),
    ("NVIDIA_VISIBLE_DEVICES", "the NVIDIA container runtime"),
    ("NVIDIA_DRIVER_CAPABILITIES", "the NVIDIA container runtime"),
];

/// The leased services: (binary, subcommand).
const LEASED: [(&str, Option<&str>); 5] = [
    ("gpusched-admission", None),
    ("gpusched-quota", None),
    ("gpusched-placement", None),
    ("gpusched-preemption", None),
    ("gpusched-agent", Some("relay")),
];

// ------------------------------------------------------------- rendering --

fn kubectl() -> String {
    let ok = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "kubectl (1.21 or later, for `kubectl kustomize`) is not on PATH: run scripts/test-deps \
         as root, or install it: https://kubernetes.io/docs/tasks/tools/#kubectl"
    );
    "kubectl".into()
}

fn yaml_docs(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).expect("rendered YAML parses"))
        .filter(|v| !v.is_null())
        .collect()
}

fn render(overlay: &str) -> Vec<Value> {
    let dir = repo_root().join("deploy/k8s/overlays").join(overlay);
    let out = Command::new(kubectl())
        .arg("kustomize")
        .arg(&dir)
        .output()
        .expect("running kubectl kustomize");
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_docs(&String::from_utf8_lossy(&out.stdout))
}

// ------------------------------------------------- typed, no unknown field --

/// Where `typed` (the object after a trip through the typed API) lost or
/// changed something of `raw`: fields the API does not have.
fn lost(path: &str, raw: &Value, typed: &Value, out: &mut Vec<String>) {
    match (raw, typed) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                match b.get(k) {
                    Some(w) => lost(&format!("{path}.{k}"), v, w, out),
                    None if v.is_null() => {}
                    None => out.push(format!("{path}.{k}")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                lost(&format!("{path}[{i}]"), v, w, out);
            }
        }
        (a, b) if a == b => {}
        (a, b) => out.push(format!("{path}: {a} became {b}")),
    }
}

fn parse<T: DeserializeOwned + Serialize>(raw: &Value, what: &str) -> T {
    let t: T = serde_path_to_error::deserialize(raw.clone())
        .unwrap_or_else(|e| panic!("{what}: not a valid object: {e}"));
    let back = serde_json::to_value(&t).expect("serialising a typed object");
    let mut out = Vec::new();
    lost("", raw, &back, &mut out);
    assert!(
        out.is_empty(),
        "{what}: fields the Kubernetes API does not have: {out:?}"
    );
    t
}

/// A rendered overlay, every object typed.
#[derive(Default)]
struct Rendered {
    namespaces: Vec<Namespace>,
    config_maps: Vec<ConfigMap>,
    secrets: Vec<Secret>,
    services: Vec<Service>,
    deployments: Vec<Deployment>,
    daemon_sets: Vec<DaemonSet>,
    stateful_sets: Vec<StatefulSet>,
    budgets: Vec<PodDisruptionBudget>,
    policies: Vec<NetworkPolicy>,
    claims: Vec<PersistentVolumeClaim>,
}

/// A Secret's `data` without the line breaks kustomize wraps base64 in
/// (the API server's decoder skips them; k8s-openapi's does not).
fn unwrapped(doc: &Value) -> Value {
    let mut d = doc.clone();
    if let Some(data) = d.get_mut("data").and_then(Value::as_object_mut) {
        for v in data.values_mut() {
            if let Some(s) = v.as_str() {
                *v = Value::String(s.split_whitespace().collect());
            }
        }
    }
    d
}

fn typed(docs: &[Value], overlay: &str) -> Rendered {
    let mut r = Rendered::default();
    for d in docs {
        let kind = d["kind"].as_str().unwrap_or("");
        let what = format!("{overlay}: {kind} {}", d["metadata"]["name"]);
        match kind {
            "Namespace" => r.namespaces.push(parse(d, &what)),
            "ConfigMap" => r.config_maps.push(parse(d, &what)),
            "Secret" => r.secrets.push(parse(&unwrapped(d), &what)),
            "Service" => r.services.push(parse(d, &what)),
            "Deployment" => r.deployments.push(parse(d, &what)),
            "DaemonSet" => r.daemon_sets.push(parse(d, &what)),
            "StatefulSet" => r.stateful_sets.push(parse(d, &what)),
            "PodDisruptionBudget" => r.budgets.push(parse(d, &what)),
            "NetworkPolicy" => r.policies.push(parse(d, &what)),
            "PersistentVolumeClaim" => r.claims.push(parse(d, &what)),
            other => panic!("{what}: a kind this test does not check: {other}"),
        }
    }
    r
}

fn name_of(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    m.name.clone().unwrap_or_default()
}

impl Rendered {
    /// Every workload's name, kind and pod template.
    fn workloads(&self) -> Vec<(String, &'static str, &PodTemplateSpec)> {
        let mut out = Vec::new();
        for d in &self.deployments {
            let s = d.spec.as_ref().expect("Deployment spec");
            out.push((name_of(&d.metadata), "Deployment", &s.template));
        }
        for d in &self.daemon_sets {
            let s = d.spec.as_ref().expect("DaemonSet spec");
            out.push((name_of(&d.metadata), "DaemonSet", &s.template));
        }
        for d in &self.stateful_sets {
            let s = d.spec.as_ref().expect("StatefulSet spec");
            out.push((name_of(&d.metadata), "StatefulSet", &s.template));
        }
        out
    }

    fn config_keys(&self, name: &str) -> Option<BTreeSet<String>> {
        self.config_maps
            .iter()
            .find(|c| name_of(&c.metadata) == name)
            .map(|c| c.data.iter().flatten().map(|(k, _)| k.clone()).collect())
    }

    fn secret_keys(&self, name: &str) -> Option<BTreeSet<String>> {
        self.secrets
            .iter()
            .find(|s| name_of(&s.metadata) == name)
            .map(|s| {
                let data = s.data.iter().flatten().map(|(k, _)| k.clone());
                data.chain(s.string_data.iter().flatten().map(|(k, _)| k.clone()))
                    .collect()
            })
    }
}

// ---------------------------------------------------------- the binaries --

/// `--help` of a workspace binary (and subcommands), built first.
fn help(bin: &str, path: &[String]) -> String {
    static CACHE: Mutex<BTreeMap<(String, Vec<String>), String>> = Mutex::new(BTreeMap::new());
    let key = (bin.to_string(), path.to_vec());
    if let Some(h) = CACHE.lock().expect("help cache").get(&key) {
        return h.clone();
    }
    let exe = stack::service_binaries().join(bin);
    assert!(exe.exists(), "{bin}: not a binary of this workspace");
    let out = Command::new(&exe)
        .args(path)
        .arg("--help")
        .output()
        .expect("running --help");
    assert!(out.status.success(), "{bin} {path:?} --help failed");
    let h = String::from_utf8_lossy(&out.stdout).into_owned();
    CACHE.lock().expect("help cache").insert(key, h.clone());
    h
}

/// The subcommands a `--help` lists.
fn subcommands(help: &str) -> Vec<String> {
    help.split("Commands:")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .unwrap_or("")
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

fn lists_flag(help: &str, flag: &str) -> bool {
    let needle = format!("--{flag}");
    help.match_indices(&needle).any(|(i, _)| {
        !help[i + needle.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
    })
}

fn lists_env(help: &str, name: &str) -> bool {
    // `[env: NAME=default]`, or `[env: NAME]` for a hidden value.
    help.contains(&format!("[env: {name}=")) || help.contains(&format!("[env: {name}]"))
}

/// A container of ours as the checks see it, from Kubernetes or compose.
#[derive(Debug, Default)]
struct Run {
    what: String,
    bin: String,
    /// The first subcommand (`relay`, `node`, `migrate`).
    sub: Option<String>,
    /// Every subcommand, outermost first (`tenants apply`).
    path: Vec<String>,
    flags: Vec<String>,
    env: BTreeMap<String, Option<String>>,
}

impl Run {
    fn from_command(what: String, argv: &[String]) -> Run {
        let (bin, rest) = argv
            .split_first()
            .unwrap_or_else(|| panic!("{what}: no command"));
        let mut path = Vec::new();
        for arg in rest.iter().take_while(|a| !a.starts_with('-')) {
            if !subcommands(&help(bin, &path)).contains(arg) {
                break;
            }
            path.push(arg.clone());
        }
        Run {
            what,
            bin: bin.clone(),
            sub: path.first().cloned(),
            flags: rest[path.len()..]
                .iter()
                .filter_map(|a| a.strip_prefix("--"))
                .map(|f| f.split('=').next().unwrap_or(f).to_string())
                .collect(),
            env: BTreeMap::new(),
            path,
        }
    }

    /// The `--help` its flags and variables must be in. A tool container
    /// (`gpusched --help`, the subcommand given at `run` time) may set
    /// what any of its subcommands reads.
    fn help(&self) -> String {
        let top = help(&self.bin, &self.path);
        if !self.path.is_empty() || self.flags != ["help"] {
            return top;
        }
        let all = subcommands(&top).into_iter().map(|c| help(&self.bin, &[c]));
        std::iter::once(top.clone())
            .chain(all)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Every flag and variable is one the binary has.
    fn check_arguments(&self) {
        let help = self.help();
        for f in &self.flags {
            assert!(
                lists_flag(&help, f),
                "{}: {} has no flag --{f}",
                self.what,
                self.bin
            );
        }
        for name in self.env.keys() {
            if READ_OUTSIDE_CLAP.iter().any(|(n, _)| n == name) {
                continue;
            }
            assert!(
                lists_env(&help, name),
                "{}: `{} {}` reads no variable {name} (not in its --help)",
                self.what,
                self.bin,
                self.path.join(" ")
            );
        }
    }

    fn is_leased(&self) -> bool {
        LEASED.contains(&(self.bin.as_str(), self.sub.as_deref()))
    }

    /// The address its probes are served on.
    fn listen(&self) -> Option<SocketAddr> {
        let var = if self.bin == "gpusched-gateway" {
            "GPUSCHED_LISTEN"
        } else {
            "GPUSCHED_HEALTH_LISTEN"
        };
        let v = self.env.get(var)?.as_deref()?;
        Some(
            v.parse()
                .unwrap_or_else(|e| panic!("{}: {var}={v}: {e}", self.what)),
        )
    }
}

/// Whether the code of `run`'s binary answers `path` (not 404 or 405).
fn serves(run: &Run, path: &str) -> bool {
    if run.bin == "gpusched-gateway" {
        let doc = gpusched_gateway::openapi();
        return doc
            .paths
            .paths
            .contains_key(path.split('?').next().unwrap_or(path));
    }
    let router = match run.sub.as_deref() {
        Some("node") => gpusched_agent::node_health::node_router("n", Arc::default()),
        _ => gpusched_runtime::health_router("s", Arc::default()),
    };
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, router).await });
        let code = reqwest::get(format!("http://{addr}{path}"))
            .await
            .expect("GET the probe path")
            .status()
            .as_u16();
        code != 404 && code != 405
    })
}

// ------------------------------------------------------------ Kubernetes --

/// A container that runs one of this workspace's binaries.
fn is_ours(c: &Container) -> bool {
    let image = c.image.as_deref().and_then(|i| i.rsplit('/').next());
    let bin = c.command.as_ref().and_then(|c| c.first());
    image.is_some_and(|n| n.starts_with("gpusched:"))
        && bin.is_some_and(|b| b.starts_with("gpusched"))
}

/// What a Kubernetes container runs, its environment resolved against the
/// rendered objects; panics on a reference to nothing.
fn k8s_run(r: &Rendered, external: &BTreeSet<String>, what: String, c: &Container) -> Run {
    let argv: Vec<String> = c
        .command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .cloned()
        .collect();
    let mut run = Run::from_command(what.clone(), &argv);
    for e in c.env.iter().flatten() {
        let from = e.value_from.as_ref();
        if let Some(s) = from.and_then(|f| f.secret_key_ref.as_ref()) {
            check_key(
                r.secret_keys(&s.name),
                external,
                &what,
                "Secret",
                &s.name,
                &s.key,
            );
        }
        if let Some(m) = from.and_then(|f| f.config_map_key_ref.as_ref()) {
            check_key(
                r.config_keys(&m.name),
                external,
                &what,
                "ConfigMap",
                &m.name,
                &m.key,
            );
        }
        run.env.insert(e.name.clone(), e.value.clone());
    }
    for src in c.env_from.iter().flatten() {
        let m = src
            .config_map_ref
            .as_ref()
            .expect("envFrom: configMapRef only");
        let keys = r.config_keys(&m.name).unwrap_or_else(|| {
            panic!(
                "{what}: envFrom names a ConfigMap {} that is not rendered",
                m.name
            )
        });
        let cm = r
            .config_maps
            .iter()
            .find(|c| name_of(&c.metadata) == m.name);
        for k in keys {
            let v = cm
                .and_then(|c| c.data.as_ref())
                .and_then(|d| d.get(&k))
                .cloned();
            run.env.entry(k).or_insert(v);
        }
    }
    run
}

fn check_key(
    keys: Option<BTreeSet<String>>,
    external: &BTreeSet<String>,
    what: &str,
    kind: &str,
    name: &str,
    key: &str,
) {
    match keys {
        Some(k) => assert!(k.contains(key), "{what}: {kind} {name} has no key {key}"),
        None => assert!(
            external.iter().any(|e| name.starts_with(e.as_str())),
            "{what}: {kind} {name} is neither rendered nor one the overlay says to create"
        ),
    }
}

fn probe_port(c: &Container, p: &Probe, what: &str) -> (u16, String) {
    let get = p
        .http_get
        .as_ref()
        .unwrap_or_else(|| panic!("{what}: an HTTP probe"));
    let port = match &get.port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => {
            c.ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name))
                .unwrap_or_else(|| panic!("{what}: probe port {name} is not a container port"))
                .container_port
        }
    };
    (port as u16, get.path.clone().unwrap_or_default())
}

/// The container's probes ask what it serves, where it listens.
fn check_probes(run: &Run, c: &Container) {
    let probes = [
        ("startupProbe", &c.startup_probe),
        ("livenessProbe", &c.liveness_probe),
        ("readinessProbe", &c.readiness_probe),
    ];
    let listen = run.listen();
    for (which, p) in probes {
        let Some(p) = p else { continue };
        let what = format!("{} {which}", run.what);
        let (port, path) = probe_port(c, p, &what);
        let addr = listen.unwrap_or_else(|| panic!("{what}: the container sets no listen address"));
        assert_eq!(
            addr.port(),
            port,
            "{what}: probes port {port}, serves on {addr}"
        );
        assert!(
            addr.ip().is_unspecified(),
            "{what}: {addr} is not reachable from the kubelet"
        );
        assert!(
            serves(run, &path),
            "{what}: {} does not serve {path}",
            run.bin
        );
    }
    if run.bin != "gpusched" {
        for (which, p) in [
            ("livenessProbe", &c.liveness_probe),
            ("readinessProbe", &c.readiness_probe),
        ] {
            assert!(p.is_some(), "{}: no {which}", run.what);
        }
    }
}

fn selects(sel: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn template_labels(t: &PodTemplateSpec) -> BTreeMap<String, String> {
    t.metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default()
}

/// Every check of one rendered overlay; returns the runs it found.
fn check_overlay(overlay: &str, external: &BTreeSet<String>) -> (Rendered, Vec<Run>) {
    let r = typed(&render(overlay), overlay);
    assert_eq!(r.namespaces.len(), 1, "{overlay}: one namespace");
    let mut runs = Vec::new();
    for (name, kind, t) in r.workloads() {
        let spec = t.spec.as_ref().expect("pod spec");
        let containers = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers);
        for c in containers.filter(|c| is_ours(c)) {
            let what = format!("{overlay}: {kind} {name}, container {}", c.name);
            let run = k8s_run(&r, external, what, c);
            run.check_arguments();
            check_probes(&run, c);
            runs.push(run);
        }
        for v in spec.volumes.iter().flatten() {
            if let Some(s) = &v.secret {
                let n = s.secret_name.clone().unwrap_or_default();
                assert!(
                    r.secret_keys(&n).is_some()
                        || external.iter().any(|e| n.starts_with(e.as_str())),
                    "{overlay}: {name} mounts a Secret {n} nobody creates"
                );
            }
            if let Some(c) = &v.persistent_volume_claim {
                assert!(
                    r.claims
                        .iter()
                        .any(|p| name_of(&p.metadata) == c.claim_name),
                    "{overlay}: {name} mounts a claim {} that is not rendered",
                    c.claim_name
                );
            }
        }
    }
    check_leased(&r, &runs, overlay);
    check_services(&r, overlay);
    check_network(&r, overlay);
    (r, runs)
}

/// Each leased service: a Deployment of two or more (leader and standby),
/// a unique lease holder per pod, a budget keeping one.
fn check_leased(r: &Rendered, runs: &[Run], overlay: &str) {
    for (bin, sub) in LEASED {
        let d = r
            .deployments
            .iter()
            .find(|d| {
                let t = &d.spec.as_ref().expect("spec").template;
                t.spec
                    .as_ref()
                    .expect("pod spec")
                    .containers
                    .iter()
                    .any(|c| {
                        c.command.as_deref().is_some_and(|cmd| {
                            cmd.first().map(String::as_str) == Some(bin)
                                && cmd.get(1).map(String::as_str) == sub
                        })
                    })
            })
            .unwrap_or_else(|| panic!("{overlay}: no Deployment runs {bin} {sub:?}"));
        let spec = d.spec.as_ref().expect("spec");
        assert!(
            spec.replicas.unwrap_or(1) >= 2,
            "{overlay}: {bin} runs no standby"
        );
        let labels = template_labels(&spec.template);
        let budget = r.budgets.iter().find(|b| {
            let sel = b.spec.as_ref().and_then(|s| s.selector.as_ref());
            selects(
                &sel.and_then(|s| s.match_labels.clone()).unwrap_or_default(),
                &labels,
            )
        });
        let min = budget
            .and_then(|b| b.spec.as_ref())
            .and_then(|s| s.min_available.clone())
            .unwrap_or_else(|| panic!("{overlay}: no disruption budget covers {bin}"));
        assert_eq!(
            min,
            IntOrString::Int(1),
            "{overlay}: {bin}'s budget keeps one"
        );
        let pod = spec.template.spec.as_ref().expect("pod spec");
        let c = &pod.containers[0];
        let holder = c
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "GPUSCHED_INSTANCE");
        let by_pod = holder
            .and_then(|e| e.value_from.as_ref())
            .and_then(|f| f.field_ref.as_ref())
            .is_some_and(|f| f.field_path == "metadata.name");
        assert!(
            by_pod,
            "{overlay}: {bin}: GPUSCHED_INSTANCE must be the pod's name"
        );
    }
    let leased = runs.iter().filter(|r| r.is_leased()).count();
    assert_eq!(
        leased,
        LEASED.len(),
        "{overlay}: one container per leased service"
    );
}

/// Every Service selects pods that have its target port.
fn check_services(r: &Rendered, overlay: &str) {
    let workloads = r.workloads();
    for s in &r.services {
        let name = name_of(&s.metadata);
        let spec = s.spec.as_ref().expect("Service spec");
        let sel = spec.selector.clone().unwrap_or_default();
        let (_, _, t) = workloads
            .iter()
            .find(|(_, _, t)| selects(&sel, &template_labels(t)))
            .unwrap_or_else(|| panic!("{overlay}: Service {name} selects no pods"));
        let pod = t.spec.as_ref().expect("pod spec");
        for p in spec.ports.iter().flatten() {
            let ok = match p.target_port.as_ref() {
                Some(IntOrString::String(n)) => pod.containers.iter().any(|c| {
                    c.ports
                        .iter()
                        .flatten()
                        .any(|cp| cp.name.as_deref() == Some(n.as_str()))
                }),
                Some(IntOrString::Int(n)) => pod
                    .containers
                    .iter()
                    .any(|c| c.ports.iter().flatten().any(|cp| cp.container_port == *n)),
                None => true,
            };
            assert!(
                ok,
                "{overlay}: Service {name}: no pod port {:?}",
                p.target_port
            );
        }
    }
    let gw = r.services.iter().any(|s| name_of(&s.metadata) == "gateway");
    assert!(gw, "{overlay}: a Service for the gateway");
}

/// Only the gateway's pods admit traffic from outside the namespace, and
/// every pod is covered by a policy.
fn check_network(r: &Rendered, overlay: &str) {
    for (name, _, t) in r.workloads() {
        let labels = template_labels(t);
        let mut covered = false;
        let mut open = false;
        for p in &r.policies {
            let spec = p.spec.as_ref().expect("policy spec");
            let sel = spec
                .pod_selector
                .clone()
                .unwrap_or_default()
                .match_labels
                .unwrap_or_default();
            if !(sel.is_empty() || selects(&sel, &labels)) {
                continue;
            }
            covered = true;
            for rule in spec.ingress.iter().flatten() {
                let from = rule.from.clone().unwrap_or_default();
                let outside = from.is_empty()
                    || from
                        .iter()
                        .any(|f| f.namespace_selector.is_some() || f.ip_block.is_some());
                open |= outside;
            }
        }
        assert!(covered, "{overlay}: no NetworkPolicy covers {name}");
        let gateway = labels.get("app.kubernetes.io/name").map(String::as_str) == Some("gateway");
        assert_eq!(
            open, gateway,
            "{overlay}: {name} reachable from outside the namespace: {open}"
        );
    }
}

/// The Secrets an overlay says to create (`create secret generic NAME`).
fn documented_secrets(overlay: &str) -> BTreeSet<String> {
    let path = repo_root()
        .join("deploy/k8s/overlays")
        .join(overlay)
        .join("kustomization.yaml");
    let text = std::fs::read_to_string(&path).expect("reading the overlay");
    text.split("create secret generic ")
        .skip(1)
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

fn url_host_port(url: &str) -> (String, u16) {
    let rest = url.split("://").nth(1).expect("a URL");
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    let host_port = authority.rsplit('@').next().unwrap_or(authority);
    let (h, p) = host_port.rsplit_once(':').expect("host:port");
    (h.to_string(), p.parse().expect("a port"))
}

#[test]
fn the_dev_overlay_runs_everything_in_the_namespace() {
    let (r, runs) = check_overlay("dev", &BTreeSet::new());
    // Postgres and NATS as StatefulSets with volumes, named by the URLs.
    for name in ["postgres", "nats"] {
        let s = r
            .stateful_sets
            .iter()
            .find(|s| name_of(&s.metadata) == name);
        let spec = s
            .and_then(|s| s.spec.as_ref())
            .unwrap_or_else(|| panic!("a {name} StatefulSet"));
        assert!(
            spec.volume_claim_templates
                .as_ref()
                .is_some_and(|v| !v.is_empty()),
            "{name}: a volume"
        );
    }
    let nats = r
        .stateful_sets
        .iter()
        .find(|s| name_of(&s.metadata) == "nats")
        .expect("nats");
    let cmd = nats
        .spec
        .as_ref()
        .expect("spec")
        .template
        .spec
        .as_ref()
        .expect("pod")
        .containers[0]
        .command
        .clone()
        .unwrap_or_default();
    assert!(
        cmd.contains(&"-js".to_string()),
        "NATS runs JetStream: {cmd:?}"
    );
    let db = r
        .secrets
        .iter()
        .find(|s| name_of(&s.metadata).starts_with("gpusched-database"))
        .expect("database Secret");
    let url = db
        .string_data
        .as_ref()
        .and_then(|d| d.get("DATABASE_URL"))
        .cloned()
        .or_else(|| {
            db.data
                .as_ref()
                .and_then(|d| d.get("DATABASE_URL"))
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        });
    let nats_url = r
        .config_maps
        .iter()
        .find(|c| name_of(&c.metadata).starts_with("gpusched-endpoints"))
        .and_then(|c| c.data.as_ref()?.get("NATS_URL").cloned());
    for (url, service) in [(url, "postgres"), (nats_url, "nats")] {
        let (host, port) = url_host_port(&url.unwrap_or_else(|| panic!("a URL for {service}")));
        let svc = r.services.iter().find(|s| name_of(&s.metadata) == host);
        let svc = svc.unwrap_or_else(|| panic!("{service}'s URL names no Service: {host}"));
        let ports = svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.clone())
            .unwrap_or_default();
        assert!(
            ports.iter().any(|p| p.port == i32::from(port)),
            "{service}: port {port}"
        );
    }
    // Fake GPUs: no GPU node needed.
    let agent = runs
        .iter()
        .find(|r| r.sub.as_deref() == Some("node"))
        .expect("an agent");
    assert!(agent.env.contains_key("GPUSCHED_GPUS") && agent.env.contains_key("GPUSCHED_FLAVOR"));
}

#[test]
fn the_prod_overlay_names_what_it_needs_and_runs_agents_on_gpu_nodes() {
    let external = documented_secrets("prod");
    let want: BTreeSet<String> = ["gpusched-database", "gpusched-admin", "gpusched-tokens"]
        .map(String::from)
        .into();
    assert_eq!(
        external, want,
        "the Secrets the prod overlay says to create"
    );
    let (r, runs) = check_overlay("prod", &external);
    assert!(
        r.stateful_sets.is_empty(),
        "prod runs no database or bus of its own"
    );
    assert!(r.secrets.is_empty(), "prod carries no Secret");
    let gw = runs
        .iter()
        .find(|r| r.bin == "gpusched-gateway")
        .expect("a gateway");
    assert!(
        gw.env.contains_key("GPUSCHED_TOKENS_FILE"),
        "prod reads tenant tokens from a file"
    );
    let ds = r.daemon_sets.first().expect("the agent DaemonSet");
    let pod = ds
        .spec
        .as_ref()
        .expect("spec")
        .template
        .spec
        .as_ref()
        .expect("pod");
    assert!(
        pod.node_selector.as_ref().is_some_and(|s| !s.is_empty()),
        "agents on chosen nodes"
    );
    assert!(
        pod.tolerations.as_ref().is_some_and(|t| !t.is_empty()),
        "agents tolerate GPU taints"
    );
    let agent = runs
        .iter()
        .find(|r| r.sub.as_deref() == Some("node"))
        .expect("an agent");
    assert!(
        !agent.env.contains_key("GPUSCHED_GPUS"),
        "prod finds GPUs through NVML"
    );
    let mounts: HashMap<_, _> = pod.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| (m.mount_path.clone(), m.name.clone()))
        .collect();
    for var in ["GPUSCHED_STATE_DIR", "GPUSCHED_CHECKPOINT_DIR"] {
        let dir = agent
            .env
            .get(var)
            .cloned()
            .flatten()
            .unwrap_or_else(|| panic!("{var}"));
        assert!(
            mounts.contains_key(&dir),
            "{var}={dir} is not a mounted volume"
        );
    }
    let rwx = r.claims.iter().any(|c| {
        c.spec
            .as_ref()
            .and_then(|s| s.access_modes.as_ref())
            .is_some_and(|m| m.iter().any(|m| m == "ReadWriteMany"))
    });
    assert!(
        rwx,
        "the checkpoint volume is shared by every node (ReadWriteMany)"
    );
}

#[test]
fn an_unknown_field_is_refused() {
    let raw: Value = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {"replicas": 2, "selector": {}, "template": {"spec": {"containers": [
            {"name": "c", "image": "gpusched:dev", "livenessprobe": {}}
        ]}}}
    });
    let r = std::panic::catch_unwind(|| parse::<Deployment>(&raw, "x"));
    let msg = r
        .err()
        .and_then(|e| e.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    assert!(msg.contains("livenessprobe"), "{msg}");
    assert!(lists_flag("  --gpus <GPUS>", "gpus") && !lists_flag("  --gpus-x", "gpus"));
}

// --------------------------------------------------------------- compose --

fn compose_config() -> Value {
    let have = Command::new("docker-compose")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        have,
        "docker-compose is not on PATH: run scripts/test-deps as root, or install it \
         (Debian: apt-get install -y docker-compose)"
    );
    let file = repo_root().join("docker-compose.yml");
    let mut cmd = Command::new("docker-compose");
    cmd.arg("-f").arg(&file).arg("config");
    for (k, _) in std::env::vars() {
        if k.starts_with("GPUSCHED_") || k == "POSTGRES_PASSWORD" {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .env("GPUSCHED_ADMIN_TOKEN", "compose-test-token")
        .output()
        .expect("docker-compose config");
    assert!(
        out.status.success(),
        "docker-compose config: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_docs(&String::from_utf8_lossy(&out.stdout)).remove(0)
}

/// A compose volume's (source, target), short (`src:dst[:mode]`) or long.
fn compose_volume(v: &Value) -> Option<(String, String)> {
    match v {
        Value::String(s) => {
            let mut parts = s.split(':');
            Some((parts.next()?.to_string(), parts.next()?.to_string()))
        }
        Value::Object(o) => Some((
            o.get("source")?.as_str()?.to_string(),
            o.get("target")?.as_str()?.to_string(),
        )),
        _ => None,
    }
}

fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::Array(a) => a
            .iter()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect(),
        Value::String(s) => s.split_whitespace().map(str::to_string).collect(),
        _ => Vec::new(),
    }
}

#[test]
fn the_compose_stack_runs_standbys_and_real_agents() {
    let cfg = compose_config();
    let services = cfg["services"].as_object().expect("services");
    let mut runs = Vec::new();
    for (name, s) in services {
        if !s["image"].as_str().is_some_and(|i| i.contains("gpusched")) {
            continue;
        }
        let argv: Vec<String> = strings(&s["entrypoint"])
            .into_iter()
            .chain(strings(&s["command"]))
            .collect();
        let mut run = Run::from_command(format!("compose service {name}"), &argv);
        for (k, v) in s["environment"].as_object().into_iter().flatten() {
            run.env.insert(k.clone(), v.as_str().map(str::to_string));
        }
        run.check_arguments();
        let replicas = s["deploy"]["replicas"].as_u64().unwrap_or(1);
        if run.is_leased() {
            assert!(
                replicas >= 2,
                "{name}: a leader and a standby (deploy.replicas)"
            );
            assert!(
                !run.env.contains_key("GPUSCHED_INSTANCE"),
                "{name}: replicas need their own lease names"
            );
        }
        if let Some(test) = s["healthcheck"]["test"].as_array() {
            let url = test
                .iter()
                .filter_map(Value::as_str)
                .find(|a| a.starts_with("http://"));
            if let Some(url) = url {
                let (_, port) = url_host_port(url);
                let path = format!(
                    "/{}",
                    url.split("://")
                        .nth(1)
                        .and_then(|r| r.split_once('/'))
                        .map_or("", |(_, p)| p)
                );
                let addr = run
                    .listen()
                    .unwrap_or_else(|| panic!("{name}: a healthcheck but no listen address"));
                assert_eq!(
                    addr.port(),
                    port,
                    "{name}: the healthcheck asks another port"
                );
                assert!(
                    serves(&run, &path),
                    "{name}: {} does not serve {path}",
                    run.bin
                );
            }
        }
        runs.push((name.clone(), s.clone(), run));
    }
    for (bin, sub) in LEASED {
        assert!(
            runs.iter()
                .any(|(_, _, r)| r.bin == bin && r.sub.as_deref() == sub),
            "compose runs no {bin} {sub:?}"
        );
    }
    // Process agents with fake GPUs, one checkpoint volume for all.
    let agents: Vec<_> = runs
        .iter()
        .filter(|(_, _, r)| r.sub.as_deref() == Some("node"))
        .collect();
    assert!(
        agents.len() >= 2,
        "two or more node agents, found {}",
        agents.len()
    );
    let mut names = BTreeSet::new();
    let mut shared = BTreeSet::new();
    for (name, s, run) in &agents {
        let node = run.env.get("GPUSCHED_NODE_NAME").cloned().flatten();
        assert!(
            names.insert(node.clone()),
            "{name}: node name {node:?} used twice"
        );
        assert!(
            run.env.contains_key("GPUSCHED_GPUS"),
            "{name}: fake GPUs by index"
        );
        let dir = run
            .env
            .get("GPUSCHED_CHECKPOINT_DIR")
            .cloned()
            .flatten()
            .expect("a checkpoint dir");
        let source = s["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|v| compose_volume(v).filter(|(_, target)| *target == dir))
            .map(|(source, _)| source)
            .unwrap_or_else(|| panic!("{name}: {dir} is no volume"));
        let named = cfg["volumes"].get(&source).is_some();
        assert!(named, "{name}: {source} is not a named volume");
        shared.insert(source);
    }
    assert_eq!(
        shared.len(),
        1,
        "every agent mounts the same checkpoint volume: {shared:?}"
    );
}
