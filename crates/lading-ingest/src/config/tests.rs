//! Unit tests of the configuration: profiles loaded, bad ones named.

use super::*;

#[test]
fn profiles_load_and_bad_ones_are_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("oac.toml"),
        "collection = \"oac\"\npriority = 3\nnotification = [\"a@example.org\"]\n\
         [max_attempts]\ndownloading = 2\n",
    )
    .unwrap();
    let p = Profile::load(dir.path(), "oac").unwrap();
    assert_eq!(p.collection, "oac");
    assert_eq!(p.priority, Some(3));
    assert_eq!(p.max_attempts["downloading"], 2);
    let e = Profile::load(dir.path(), "nope").unwrap_err();
    assert!(e.to_string().starts_with("unknown profile \"nope\""), "{e}");
    assert!(matches!(
        Profile::load(dir.path(), "../oac"),
        Err(ConfigError::BadProfileName(_))
    ));
    std::fs::write(
        dir.path().join("bad.toml"),
        "collection = \"x\"\ncolour = 1\n",
    )
    .unwrap();
    let e = Profile::load(dir.path(), "bad").unwrap_err().to_string();
    assert!(e.contains("colour"), "{e}");
}

#[test]
fn a_wait_limit_per_kind_of_dependency_is_taken_and_an_unknown_kind_is_named() {
    use lading_engine::deps::Dependency;
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("lading.toml");
    std::fs::write(
        &f,
        "[dependencies]\nmax_wait_h = 72\nmax_wait_h_by_kind = { smtp = 240, \"storage-node\" = 24 }\n",
    )
    .unwrap();
    let s = Config::load(Some(&f)).unwrap().dependencies.settings();
    let dep = |kind: &str| Dependency {
        kind: kind.into(),
        name: "x".into(),
        address: String::new(),
    };
    let h = |n: u64| Duration::from_secs(n * 3600);
    assert_eq!(s.max_wait_for(&dep("smtp")), h(240));
    assert_eq!(s.max_wait_for(&dep("storage-node")), h(24));
    assert_eq!(
        s.max_wait_for(&dep("callback")),
        h(72),
        "the default elsewhere"
    );
    let since = 1_000;
    let at = |hours: u64| since + hours * 3_600_000;
    assert!(!s.waited_too_long(&dep("storage-node"), since, at(24)));
    assert!(s.waited_too_long(&dep("storage-node"), since, at(24) + 1));
    assert!(!s.waited_too_long(&dep("smtp"), since, at(100)));
    std::fs::write(&f, "[dependencies]\nmax_wait_h_by_kind = { smpt = 1 }\n").unwrap();
    let e = Config::load(Some(&f)).unwrap_err().to_string();
    assert!(
        e.contains("\"smpt\"") && e.contains("storage-node, smtp"),
        "{e}"
    );
}

#[test]
fn the_fixity_audit_period_is_bounded_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("lading.toml");
    std::fs::write(&f, "[fixity]\naudit_every_s = 600\n").unwrap();
    let c = Config::load(Some(&f)).unwrap();
    assert_eq!(c.fixity.audit_every_s, 600);
    assert_eq!(c.fixity.every_days, 90, "the rest keeps its default");
    assert_eq!(Config::default().fixity.audit_every_s, 3600);
    for bad in ["0", "86401"] {
        std::fs::write(&f, format!("[fixity]\naudit_every_s = {bad}\n")).unwrap();
        let e = Config::load(Some(&f)).unwrap_err().to_string();
        assert!(
            e.contains("audit_every_s must be 1..=86400") && e.contains(bad),
            "{e}"
        );
    }
    assert_eq!(c.fixity.abort_uploads_after_s, 86_400);
    for (text, want) in [("0", 0), ("60", 60)] {
        std::fs::write(&f, format!("[fixity]\nabort_uploads_after_s = {text}\n")).unwrap();
        assert_eq!(
            Config::load(Some(&f)).unwrap().fixity.abort_uploads_after_s,
            want
        );
    }
    std::fs::write(&f, "[fixity]\nabort_uploads_after_s = 59\n").unwrap();
    let e = Config::load(Some(&f)).unwrap_err().to_string();
    assert!(
        e.contains("abort_uploads_after_s must be 0 (never) or at least 60") && e.contains("59"),
        "{e}"
    );
}

#[test]
fn the_cleanup_period_is_bounded_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("lading.toml");
    assert_eq!(Config::default().cleanup_every_s, 3600);
    std::fs::write(&f, "cleanup_every_s = 60\nretention_hours = 0\n").unwrap();
    let c = Config::load(Some(&f)).unwrap();
    assert_eq!(c.cleanup_every_s, 60);
    assert_eq!(c.retention(), std::time::Duration::ZERO);
    for bad in ["0", "86401"] {
        std::fs::write(&f, format!("cleanup_every_s = {bad}\n")).unwrap();
        let e = Config::load(Some(&f)).unwrap_err().to_string();
        assert!(
            e.contains("cleanup_every_s must be 1..=86400") && e.contains(bad),
            "{e}"
        );
    }
    let mut c = Config::default();
    c.apply_env(|k| (k == "LADING_CLEANUP_EVERY_S").then(|| "120".to_string()))
        .unwrap();
    assert_eq!(c.cleanup_every_s, 120);
    let e = c
        .apply_env(|k| (k == "LADING_CLEANUP_EVERY_S").then(|| "0".to_string()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("LADING_CLEANUP_EVERY_S") && e.contains("must be 1..=86400"),
        "{e}"
    );
    assert_eq!(c.cleanup_every_s, 120, "a refused value changes nothing");
}

#[test]
fn environment_overrides_the_file() {
    let mut c: Config = toml::from_str("data_dir = \"/srv/lading\"\nsmtp_port = 2525\n").unwrap();
    c.apply_env(|k| (k == "LADING_SMTP_PORT").then(|| "2600".to_string()))
        .unwrap();
    assert_eq!(c.smtp_port, 2600);
    assert_eq!(c.work_dir(), PathBuf::from("/srv/lading/work"));
    let e = c
        .apply_env(|k| (k == "LADING_RESERVE_BYTES").then(|| "lots".to_string()))
        .unwrap_err();
    assert!(e.to_string().contains("LADING_RESERVE_BYTES"), "{e}");
}
