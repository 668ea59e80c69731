//! No two modules of a crate import each other, directly or through others: a module's
//! `crate::NAME` paths (outside its tests) name the top-level modules it uses, and those
//! edges must form no cycle. The crate's root (`lib.rs`) is the hub that declares the
//! modules and is not counted. And the test fixtures are no normal dependency of any crate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module → the sources that make it up (`m.rs` and `m/**.rs`).
fn modules(src: &Path) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in lading_testkit::files_under(src) {
        let Some(rel) = f.strip_prefix(src).ok().and_then(|r| r.to_str()) else {
            continue;
        };
        let Some(rel) = rel.strip_suffix(".rs") else {
            continue;
        };
        let top = rel.split('/').next().unwrap_or(rel);
        if top == "lib" || top == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        out.entry(top.to_string()).or_default().push(text);
    }
    out
}

/// The names a source reaches through `crate::NAME` or `crate::{A, B::…}`, tests and
/// comments left out.
fn crate_paths(text: &str) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    let mut out = BTreeSet::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or("");
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for part in group[..end].split(',') {
                    let name: String = part
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    out.insert(name);
                }
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                out.insert(name);
            }
        }
    }
    out
}

/// A cycle in `edges`, if there is one (depth-first search).
fn cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for n in edges.keys() {
        if let Some(c) = visit(n, edges, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

fn edges_of(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules(src);
    let names: BTreeSet<String> = mods.keys().cloned().collect();
    mods.iter()
        .map(|(m, texts)| {
            let used = texts
                .iter()
                .flat_map(|t| crate_paths(t))
                .filter(|n| names.contains(n) && n != m)
                .collect();
            (m.clone(), used)
        })
        .collect()
}

#[test]
fn no_crate_has_modules_that_import_each_other() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    for e in std::fs::read_dir(&crates).unwrap() {
        let src = e.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        checked += 1;
        if let Some(c) = cycle(&edges_of(&src)) {
            panic!(
                "{}: modules import each other: {}",
                src.display(),
                c.join(" → ")
            );
        }
    }
    assert!(
        checked >= 10,
        "only {checked} crates found under {}",
        crates.display()
    );
}

/// The check finds a cycle where there is one.
#[test]
fn a_cycle_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::write(src.join("lib.rs"), "mod a; mod b; mod c;").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::b::X;").unwrap();
    std::fs::create_dir(src.join("b")).unwrap();
    std::fs::write(src.join("b.rs"), "mod inner;").unwrap();
    std::fs::write(src.join("b/inner.rs"), "use crate::{c::Y, Ingest};").unwrap();
    std::fs::write(
        src.join("c.rs"),
        "// crate::b in a comment\nfn f() { crate::a::g() }",
    )
    .unwrap();
    let c = cycle(&edges_of(src)).expect("a → b → c → a");
    assert_eq!(c.len(), 4, "{c:?}");
    std::fs::write(src.join("c.rs"), "// crate::a::g in a comment\n").unwrap();
    assert_eq!(cycle(&edges_of(src)), None);
}

/// The names under a manifest's `[dependencies]` table (not dev- or build-dependencies).
fn normal_dependencies(manifest: &str) -> Vec<String> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[dependencies]";
        } else if inside && let Some((name, _)) = line.split_once(['=', '.']) {
            let name = name.trim();
            if !name.is_empty() && !name.starts_with('#') {
                out.push(name.to_string());
            }
        }
    }
    out
}

/// The test fixtures ship in no binary: `lading-testkit` and `lading-store-tests` are
/// dev-dependencies only, and every Lading crate a crate depends on normally is named in its
/// own code (one only its tests use belongs under `[dev-dependencies]`).
#[test]
fn test_crates_are_dev_dependencies_and_every_lading_dependency_is_used() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    for e in std::fs::read_dir(&crates).unwrap() {
        let dir = e.unwrap().path();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let text: String = lading_testkit::files_under(&dir.join("src"))
            .iter()
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .collect();
        for dep in normal_dependencies(&manifest) {
            if !dep.starts_with("lading-") {
                continue;
            }
            checked += 1;
            assert!(
                dep != "lading-testkit" && dep != "lading-store-tests",
                "{}: {dep} is a normal dependency; test fixtures are dev-dependencies only",
                dir.display()
            );
            assert!(
                text.contains(&dep.replace('-', "_")),
                "{}: depends on {dep} but its code never names it; move it to [dev-dependencies]",
                dir.display()
            );
        }
    }
    assert!(checked >= 20, "only {checked} dependencies checked");
}

/// Where a process's services may be put on a supervisor: `lading_node::node` (every
/// process: serve, worker, the demo, the benches, `lading jobs`, the simulator's), and
/// `lading_ingest::start`, the stages' part of it that `Node` calls (with `lading_ingest::run`
/// on it, for the tests of the crates `Node` is built on). The supervisor's own tests are its.
const ASSEMBLERS: [&str; 3] = [
    "lading-node/src/node.rs",
    "lading-ingest/src/lib.rs",
    "lading-worker/src/services.rs",
];

/// The places in `text` that make a supervisor, put a service on one, or start the event
/// hub (whose feeders are services: a program that started one itself ran them unsupervised,
/// as the simulator's event host did).
fn assembles(text: &str) -> usize {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .filter(|l| {
            l.contains("Supervisor::new(")
                || l.contains(", Phase::")
                || l.contains("EventHub::start")
        })
        .count()
}

/// No service is started outside `Node` (issue 61): every source and test of every crate is
/// read, and a supervisor made, or a service spawned on one, anywhere but the assemblers
/// fails this test, naming the file.
#[test]
fn services_are_started_only_where_a_process_is_assembled() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = BTreeMap::new();
    for e in std::fs::read_dir(&crates).unwrap() {
        let dir = e.unwrap().path();
        for sub in ["src", "tests", "benches"] {
            for f in lading_testkit::files_under(&dir.join(sub)) {
                if f.extension().is_some_and(|x| x == "rs")
                    && let Ok(text) = std::fs::read_to_string(&f)
                {
                    let n = assembles(&text);
                    if n > 0 {
                        let rel = f.strip_prefix(&crates).unwrap().display().to_string();
                        found.insert(rel, n);
                    }
                }
            }
        }
    }
    let outside: Vec<&String> = found
        .keys()
        .filter(|f| !ASSEMBLERS.contains(&f.as_str()) && !f.ends_with("tests/layering.rs"))
        .collect();
    assert!(
        outside.is_empty(),
        "services started outside lading_node::Node: {outside:?} (start a process through \
         Node::start_in or Node::start_jobs, with what it needs in a NodeEnv)"
    );
    // The scan sees the assembly itself, so it is not looking at nothing.
    assert!(
        found
            .get("lading-node/src/node.rs")
            .is_some_and(|n| *n >= 5),
        "{found:?}"
    );
}
