//! The docs say what the program does, word for word: every fenced `sh` block of the README
//! and `docs/` is run by a test or says why not; every config key is in `docs/CONFIG.md` and
//! every key its examples set is one the config knows; every command and option of `lading
//! --help` is in `docs/CLI.md`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The README and every page of `docs/`.
fn pages() -> Vec<(String, String)> {
    let mut out = vec![(
        "README.md".to_string(),
        std::fs::read_to_string(repo().join("README.md")).unwrap(),
    )];
    let mut docs: Vec<_> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    for p in docs {
        let name = format!("docs/{}", p.file_name().unwrap().to_string_lossy());
        out.push((name, std::fs::read_to_string(&p).unwrap()));
    }
    out
}

/// The blocks a test runs as they stand (`tests/getting_started.rs`), by their marker.
const RUN: &[&str] = &["getting-started", "serve", "checkm-five-minutes"];

#[test]
fn every_sh_block_is_run_by_a_test_or_says_why_not() {
    let mut problems = Vec::new();
    let mut run = BTreeSet::new();
    for (page, text) in pages() {
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.trim() != "```sh" {
                continue;
            }
            let marker = lines[..i]
                .iter()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(|l| l.trim())
                .unwrap_or("");
            let name = marker
                .strip_prefix("<!-- ")
                .and_then(|m| m.strip_suffix(" -->"));
            match name {
                Some(n) if RUN.contains(&n) => {
                    run.insert(n.to_string());
                }
                Some(n) if n.starts_with("not run: ") && n.len() > "not run: ".len() + 10 => {}
                _ => problems.push(format!(
                    "{page}:{}: a sh block with neither a marker a test runs ({}) nor \
                     `<!-- not run: WHY -->` before it",
                    i + 1,
                    RUN.join(", ")
                )),
            }
        }
    }
    for n in RUN {
        if !run.contains(*n) {
            problems.push(format!(
                "no page has the block marked {n:?} that a test runs"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The fields serde names for a table that does not know `zzz_unknown`.
fn known_fields<T: serde::de::DeserializeOwned + std::fmt::Debug>(toml_text: &str) -> Vec<String> {
    let e = toml::from_str::<T>(toml_text).expect_err("an unknown key is refused");
    let msg = e.to_string();
    let list = msg
        .split("expected one of")
        .nth(1)
        .unwrap_or_else(|| panic!("no field list in {msg}"));
    list.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, f)| f.to_string())
        .collect()
}

/// Every key of every config table and of a profile.
fn config_keys() -> Vec<(String, Vec<String>)> {
    use lading_ingest::config::{Config, Profile};
    vec![
        (
            "service config".into(),
            known_fields::<Config>("zzz_unknown = 1\n"),
        ),
        (
            "[stages.NAME]".into(),
            known_fields::<Config>("[stages.storing]\nzzz_unknown = 1\n"),
        ),
        (
            "[[tokens]]".into(),
            known_fields::<Config>("[[tokens]]\nzzz_unknown = 1\n"),
        ),
        (
            "[payload]".into(),
            known_fields::<Config>("[payload]\nzzz_unknown = 1\n"),
        ),
        (
            "[http]".into(),
            known_fields::<Config>("[http]\nzzz_unknown = 1\n"),
        ),
        (
            "[fixity]".into(),
            known_fields::<Config>("[fixity]\nzzz_unknown = 1\n"),
        ),
        (
            "[dependencies]".into(),
            known_fields::<Config>("[dependencies]\nzzz_unknown = 1\n"),
        ),
        (
            "[[storage_nodes]]".into(),
            known_fields::<Config>("[[storage_nodes]]\nzzz_unknown = 1\n"),
        ),
        (
            "profile".into(),
            known_fields::<Profile>("zzz_unknown = 1\n"),
        ),
    ]
}

#[test]
fn every_config_key_is_in_config_md_and_every_key_its_examples_set_is_known() {
    let doc = std::fs::read_to_string(repo().join("docs/CONFIG.md")).unwrap();
    let mut problems = Vec::new();
    // Known but undocumented.
    for (table, keys) in config_keys() {
        assert!(keys.len() > 2, "{table}: {keys:?}");
        for k in keys {
            let named = [
                format!("`{k}`"),
                format!("\n{k} ="),
                format!("[{k}]"),
                format!("[[{k}]]"),
                format!("[{k}."),
            ];
            if !named.iter().any(|n| doc.contains(n.as_str())) {
                problems.push(format!("{table} key {k:?} is not in docs/CONFIG.md"));
            }
        }
    }
    // Documented but unknown: every toml block is a profile or (part of) a service config.
    let blocks = doc.split("```toml\n").skip(1);
    let mut n = 0;
    for b in blocks {
        n += 1;
        let text = &b[..b.find("```").unwrap()];
        let as_config = toml::from_str::<lading_ingest::config::Config>(text);
        let as_profile = toml::from_str::<lading_ingest::config::Profile>(text);
        if let (Err(c), Err(p)) = (&as_config, &as_profile) {
            problems.push(format!(
                "docs/CONFIG.md toml block {n} is neither a service config ({c}) nor a profile ({p}):\n{text}"
            ));
        }
    }
    assert!(n >= 2, "docs/CONFIG.md has its toml examples");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_lading"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "lading {args:?} --help: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// A help text's subcommands and long options.
fn parse_help(text: &str) -> (Vec<String>, Vec<String>) {
    let (mut commands, mut options) = (Vec::new(), Vec::new());
    let mut section = "";
    for line in text.lines() {
        if !line.starts_with(' ') && line.ends_with(':') {
            section = line.trim_end_matches(':');
            continue;
        }
        let t = line.trim_start();
        if section == "Commands" && line.starts_with("  ") && !line.starts_with("   ") {
            if let Some(c) = t.split_whitespace().next()
                && c != "help"
            {
                commands.push(c.to_string());
            }
        } else if section.ends_with("Options") || section == "Arguments" {
            for w in t.split([' ', ',']) {
                if let Some(o) = w.strip_prefix("--")
                    && !o.is_empty()
                    && !matches!(o, "help" | "version")
                {
                    let o = o.split(['=', '<', '[']).next().unwrap_or(o);
                    options.push(format!("--{o}"));
                    break;
                }
            }
        }
    }
    (commands, options)
}

#[test]
fn every_command_and_option_of_lading_help_is_in_cli_md() {
    let doc = std::fs::read_to_string(repo().join("docs/CLI.md")).unwrap();
    let mut problems = Vec::new();
    let mut todo: Vec<Vec<String>> = vec![vec![]];
    let mut seen = 0;
    while let Some(path) = todo.pop() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let (commands, options) = parse_help(&help(&args));
        seen += 1;
        let shown = if path.is_empty() {
            "lading".to_string()
        } else {
            format!("lading {}", path.join(" "))
        };
        for o in options {
            if !doc.contains(&o) {
                problems.push(format!("{shown}: option {o} is not in docs/CLI.md"));
            }
        }
        for c in commands {
            let full = format!("{shown} {c}");
            // A verb may follow its command's row after a `·`: `… · \`show [--json]\``.
            if !doc.contains(&full) && !doc.contains(&format!("· `{c}")) {
                problems.push(format!("command `{full}` is not in docs/CLI.md"));
            }
            let mut next = path.clone();
            next.push(c);
            todo.push(next);
        }
    }
    assert!(seen > 10, "walked {seen} help texts");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
