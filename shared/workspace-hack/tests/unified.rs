//! One feature set per dependency, whatever is built: for every workspace
//! member, the third-party crates its own build needs (`cargo tree -p
//! MEMBER -e normal,build`) have exactly the features they have in the
//! whole workspace's test build (`cargo tree --workspace -e all`). When
//! this fails, a member added a dependency or a feature: run `cargo hakari
//! generate` (and `cargo hakari manage-deps` for a new member), after
//! `cargo install cargo-hakari --locked`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

type Features = BTreeMap<String, BTreeSet<String>>;

fn cargo(args: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(cargo)
        .args(args)
        .current_dir(root)
        .output()
        .unwrap_or_else(|e| panic!("cargo {args:?}: {e}"));
    assert!(
        out.status.success(),
        "cargo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Third-party crate (`name vX.Y.Z`) → its features, from a `cargo tree`.
fn features(selection: &[&str], edges: &str) -> Features {
    let mut args = vec!["tree", "--locked", "--prefix", "none", "-f", "{p}|{f}"];
    args.extend_from_slice(selection);
    args.extend_from_slice(&["-e", edges]);
    let mut map = Features::new();
    for line in cargo(&args).lines() {
        let Some((package, features)) = line.split_once('|') else {
            continue;
        };
        // Workspace members print their path; the rest are third-party.
        if package.contains(" (") {
            continue;
        }
        let entry = map.entry(package.trim().to_string()).or_default();
        entry.extend(
            features
                .trim_end_matches(" (*)")
                .split(',')
                .filter(|f| !f.is_empty())
                .map(str::to_string),
        );
    }
    map
}

fn members() -> Vec<String> {
    let meta = cargo(&["metadata", "--locked", "--no-deps", "--format-version", "1"]);
    let v: serde_json::Value = serde_json::from_str(&meta).expect("cargo metadata's JSON");
    v["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn every_member_builds_its_dependencies_with_the_workspaces_features() {
    let all = features(&["--workspace"], "all");
    assert!(all.len() > 100, "cargo tree listed {} crates", all.len());
    let mut stale = Vec::new();
    for member in members() {
        for (package, wanted) in features(&["-p", &member], "normal,build") {
            match all.get(&package) {
                Some(have) if *have == wanted => {}
                have => stale.push(format!(
                    "{member}: {package} with [{}], the workspace with [{}]",
                    wanted.iter().cloned().collect::<Vec<_>>().join(","),
                    have.map(|h| h.iter().cloned().collect::<Vec<_>>().join(","))
                        .unwrap_or_default()
                )),
            }
        }
    }
    assert!(
        stale.is_empty(),
        "feature sets differ, so builds of these members recompile them \
         (run `cargo hakari generate`):\n{}",
        stale.join("\n")
    );
}
