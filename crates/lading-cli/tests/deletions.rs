//! Deletion through a real `lading serve` and the command line: a submitter can neither ask
//! nor approve; the admin who asked cannot approve; without a server the command refuses
//! (no token, no name); a second admin's approval removes the stored files from the storage
//! root, after which a download is 410 naming the deletion and the tombstone is readable.
//! Each refusal leaves the stored files as they were.

mod common;

use common::serve::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

const CAROL: &str = "carol-token-0123456789abcdef";

/// `lading admin ARGS` through the server with `token`: exit code, stdout, stderr.
fn admin(s: &Serve, token: &str, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lading"))
        .args(["--server", &s.base, "--token", token, "admin"])
        .args(args)
        .env_remove("LADING_STORE")
        .current_dir(s.dir.path())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_needs_two_admins_and_then_a_download_is_gone() {
    let s = serve(
        &[],
        &format!("[[tokens]]\nname = \"carol\"\ntoken = \"{CAROL}\"\nrole = \"admin\"\n"),
    );
    let (st, v) = s
        .upload(ALICE, "profile=alpha", "kept.txt", b"to be deleted\n")
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let b = s.finished(v["id"].as_str().unwrap()).await;
    assert_eq!(b["status"]["status"], "Completed", "{b}");
    let job = s.only_job(&b).await;
    let jid = job["id"].as_str().unwrap().to_string();
    let (_, files) = s.get(ADMIN, &format!("/api/v1/jobs/{jid}/files")).await;
    let ark = files["stored"][0]["ark"].as_str().unwrap().to_string();
    let stored = s.stored_files();
    assert!(!stored.is_empty());
    let download = format!("/api/v1/jobs/{jid}/download");
    let (st, _) = s.get(ALICE, &download).await;
    assert_eq!(st, StatusCode::OK);

    // A submitter may neither ask nor see.
    let ask = json!({"ark": ark, "version": 1, "reason": "mine"});
    let (st, v) = s.post(ALICE, "/api/v1/deletions", ask.clone()).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{v}");
    let (st, _) = s.get(ALICE, "/api/v1/deletions").await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    // Without a server there is no name to record: refused.
    let store = format!("sqlite:{}", s.dir.path().join("lading.db").display());
    let local = std::process::Command::new(env!("CARGO_BIN_EXE_lading"))
        .args(["--store", &store, "--config", "lading.toml"])
        .args(["admin", "object", "deletions"])
        .env_remove("LADING_STORE")
        .env_remove("LADING_SERVER")
        .current_dir(s.dir.path())
        .output()
        .unwrap();
    assert!(!local.status.success());
    assert!(
        String::from_utf8_lossy(&local.stderr).contains("through a server"),
        "{local:?}"
    );

    // The root admin asks, from the command line; it cannot approve its own request.
    let (code, out, err) = admin(
        &s,
        ADMIN,
        &["object", "delete", &ark, "--reason", "consent withdrawn"],
    );
    assert_eq!(code, 0, "{out}{err}");
    let id = out.split_whitespace().next().unwrap().to_string();
    assert!(id.starts_with("del") && out.contains("requested"), "{out}");
    let (code, _, err) = admin(&s, ADMIN, &["object", "approve-deletion", &id]);
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("second admin"), "{err}");
    let (st, v) = s
        .post(ALICE, &format!("/api/v1/deletions/{id}/approve"), json!({}))
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{v}");
    assert_eq!(s.stored_files(), stored, "a refusal changes nothing stored");
    let (st, _) = s.get(ALICE, &download).await;
    assert_eq!(st, StatusCode::OK, "a request alone deletes nothing");

    // Carol approves: the files go, the download is 410 naming the deletion.
    let (code, out, err) = admin(&s, CAROL, &["object", "approve-deletion", &id]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("deleted") && out.contains("decided by carol"),
        "{out}"
    );
    let left: Vec<_> = s
        .stored_files()
        .into_iter()
        .filter(|p| p.ends_with("kept.txt"))
        .collect();
    let (_, t) = s.get(ADMIN, &format!("/api/v1/deletions/{id}")).await;
    assert_eq!(left, Vec::<std::path::PathBuf>::new(), "{t}");
    let (st, v) = s.get(ALICE, &download).await;
    assert_eq!(st, StatusCode::GONE, "{v}");
    let msg = v["error"].as_str().unwrap_or_default().to_string();
    assert!(msg.contains(&id) && !msg.contains("carol"), "{msg}");
    let (st, v) = s
        .post(ADMIN, "/api/v1/access", json!({"ark": ark, "version": 1}))
        .await;
    assert_eq!(st, StatusCode::GONE, "{v}");

    // The tombstone: who, when, why, what (with digests).
    let (code, out, err) = admin(&s, CAROL, &["object", "deletion", &id]);
    assert_eq!(code, 0, "{err}");
    let t: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(t["status"], "deleted");
    assert_eq!(t["requested_by"], "root");
    assert_eq!(t["decided_by"], "carol");
    assert_eq!(t["reason"], "consent withdrawn");
    let f = t["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "producer/kept.txt")
        .unwrap_or_else(|| panic!("kept.txt in {t}"));
    assert_eq!(f["size"], 14);
    assert_eq!(f["sha256"].as_str().unwrap().len(), 64);
    let (code, out, _) = admin(&s, ADMIN, &["object", "deletions"]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 1, "{out}");
}
