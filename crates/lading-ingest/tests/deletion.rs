//! Deletion only when approved, on real storage nodes (a SeaweedFS primary and replica): one
//! admin's request stays a request; a second admin's approval removes every copy on every
//! node but the bytes a later version still uses, and the tombstone says who, when, why and
//! what; the fixity checker expects nothing deleted; a deleted version cannot be read; a
//! deposit after a deletion carries nothing over from it. On both stores.

#[macro_use]
mod common;

use common::bags::*;
use common::nodes::*;
use common::{Backend, World};
use lading_ingest::Ingest;
use lading_ingest::deletion::{self, Deletion, DeletionError, Status};
use lading_ingest::nodes::{DELETION_MARK, Node};
use lading_ingest::stages::StoredVersion;
use lading_testkit::seaweed::Weed;
use std::sync::Arc;

/// Deposits bag `rb` of `files` (from folder `dir`) and waits until the replica holds its
/// version and the inventory its copies there.
async fn deposit(
    w: &World,
    ingest: &Arc<Ingest>,
    replica: &Node,
    dir: &str,
    files: &[(&str, &[u8])],
) -> StoredVersion {
    let d = make_bag(
        &w.dir.path().join(dir),
        "rb",
        files,
        &[
            "--md5",
            "--sha256",
            "--source-organization",
            "Example University",
        ],
    );
    aptrust_info(&d, "Title: Deleted\nAccess: Institution\n");
    let tar = w
        .file(&format!("{dir}/rb.tar"), &serialize(&d, "rb", "rb.tar"))
        .0;
    let b = w.submit_as(ingest, "bags", "depositor", &tar, "bag").await;
    let run = w.run_all(ingest);
    w.completes(&b).await;
    let s = w.store_record(&w.first_job(&b).await).await.unwrap();
    let (ark, v) = (s.ark.clone(), s.version);
    lading_testkit::poll::until_true("the replica's copies recorded", common::WAIT, async || {
        let a = ark.clone();
        let on_replica = ingest
            .inventory
            .run(move |i| i.version_copies(&a, v))
            .await
            .unwrap()
            .iter()
            .any(|(n, _)| *n == 9502);
        on_replica
            && replica
                .head(&ark, v, "system/lading-version.json")
                .await
                .unwrap()
                .is_some()
    })
    .await;
    run.stop().await;
    s
}

/// Whether each node holds `rel` of version `v`.
async fn held(nodes: &[&Node], ark: &str, v: u32, rel: &str) -> Vec<bool> {
    let mut out = Vec::new();
    for n in nodes {
        out.push(n.head(ark, v, rel).await.unwrap().is_some());
    }
    out
}

on_both_backends!(
    a_deletion_needs_a_second_admin_and_then_removes_every_copy_but_what_a_later_version_uses
);

/// A second admin approves `d1` (v1 of `s2`'s object): v1's own files go from both nodes,
/// but a.txt, which v2 lists as stored under v1, stays; the checker expects nothing deleted,
/// v1 cannot be read and v2 can, and v1 cannot be asked for again.
async fn approved_by_a_second_admin(
    w: &World,
    ingest: &Arc<Ingest>,
    both: &[&Node; 2],
    s2: &StoredVersion,
    d1: Deletion,
) {
    let ark = s2.ark.clone();
    let d1 = deletion::approve(ingest, &d1.id, "bob").await.unwrap();
    assert_eq!(d1.status, Status::Deleted, "{:?}", d1.waiting);
    let tomb = deletion::get(ingest, &d1.id).await.unwrap();
    assert_eq!(tomb, d1, "the tombstone is what approval returned");
    assert_eq!(
        (
            tomb.requested_by.as_str(),
            tomb.decided_by.as_deref(),
            tomb.reason.as_str()
        ),
        ("alice", Some("bob"), "withdrawn by the depositor")
    );
    assert!(tomb.deleted_at.is_some());
    let gone: Vec<(&str, &str, &[u32])> = tomb
        .files
        .iter()
        .filter(|f| f.path.starts_with("producer/"))
        .map(|f| (f.path.as_str(), f.sha256.as_str(), f.nodes.as_slice()))
        .collect();
    let (beta, gamma) = (sha256(b"beta"), sha256(b"gamma"));
    assert_eq!(
        gone,
        [
            ("producer/b.txt", beta.as_str(), &[9501u32, 9502][..]),
            ("producer/c.txt", gamma.as_str(), &[9501, 9502][..])
        ]
    );
    assert!(
        tomb.kept.iter().any(|f| f.path == "producer/a.txt"),
        "{:?}",
        tomb.kept
    );
    for f in &tomb.files {
        assert_eq!(
            held(both, &ark, 1, &f.path).await,
            [false, false],
            "{}",
            f.path
        );
    }
    assert_eq!(held(both, &ark, 1, "producer/a.txt").await, [true, true]);
    assert_eq!(held(both, &ark, 1, DELETION_MARK).await, [true, true]);
    assert_eq!(held(both, &ark, 2, "producer/b.txt").await, [true, true]);

    // Nothing deleted is expected by the checker, and everything left is good.
    let audit = lading_ingest::fixity::check(ingest, None, None, None)
        .await
        .unwrap();
    assert!(audit.checked > 0);
    assert_eq!(audit.findings, []);
    // v1 cannot be read; v2 can, a.txt's bytes read from where v1 keeps them.
    let refused = lading_ingest::access::source(ingest, &ark, 1, None).await;
    let why = refused.err().expect("v1 is deleted");
    assert!(why.contains("was deleted") && why.contains(&d1.id), "{why}");
    let bag = restore_and_validate(w, ingest, s2, "rb").await;
    assert_eq!(std::fs::read(bag.join("data/a.txt")).unwrap(), b"alpha");
    std::fs::remove_dir_all(w.dir.path().join("restored")).unwrap();
    let twice = deletion::request(ingest, &ark, Some(1), "again", "carol").await;
    assert!(
        matches!(twice, Err(DeletionError::Deleted { .. })),
        "{twice:?}"
    );
}

async fn a_deletion_needs_a_second_admin_and_then_removes_every_copy_but_what_a_later_version_uses(
    w: World,
) {
    let (a, b) = (Weed::start().unwrap(), Weed::start().unwrap());
    a.bucket("primary").unwrap();
    b.bucket("replica").unwrap();
    let settings = vec![node(9501, &a, "primary"), node(9502, &b, "replica")];
    bag_profile(&w);
    w.profile(
        "bags",
        "collection = \"bags\"\n\
         bag_profiles = [\"bagit/aptrust-v2.2.json\", \"bagit/btr-v1.0.json\"]\n\
         storage_nodes = [9501, 9502]\n",
    );
    let ingest = ingest_with(&w, settings.clone()).unwrap();
    let primary = Node::open(&settings[0], env).unwrap();
    let replica = Node::open(&settings[1], env).unwrap();
    let both = [&primary, &replica];

    let s1 = deposit(
        &w,
        &ingest,
        &replica,
        "v1",
        &[("a.txt", b"alpha"), ("b.txt", b"beta"), ("c.txt", b"gamma")],
    )
    .await;
    let ark = s1.ark.clone();
    let s2 = deposit(
        &w,
        &ingest,
        &replica,
        "v2",
        &[("a.txt", b"alpha"), ("b.txt", b"BETA"), ("d.txt", b"delta")],
    )
    .await;
    assert_eq!((s2.ark.as_str(), s2.version), (ark.as_str(), 2));

    // One admin's request stays a request: the requester cannot approve it.
    let r = deletion::request(&ingest, &ark, Some(1), "  ", "alice").await;
    assert!(matches!(r, Err(DeletionError::Reason)), "{r:?}");
    let d1 = deletion::request(
        &ingest,
        &ark,
        Some(1),
        "withdrawn by the depositor",
        "alice",
    )
    .await
    .unwrap();
    assert_eq!(d1.status, Status::Requested);
    let again = deletion::request(&ingest, &ark, None, "all of it", "carol").await;
    assert!(
        matches!(again, Err(DeletionError::Open { .. })),
        "{again:?}"
    );
    let own = deletion::approve(&ingest, &d1.id, "alice").await;
    assert!(
        matches!(own, Err(DeletionError::SameAdmin { .. })),
        "{own:?}"
    );
    assert_eq!(
        deletion::get(&ingest, &d1.id).await.unwrap().status,
        Status::Requested
    );
    assert_eq!(held(&both, &ark, 1, "producer/b.txt").await, [true, true]);

    approved_by_a_second_admin(&w, &ingest, &both, &s2, d1).await;

    // The whole object, asked by bob and approved by alice: a.txt goes with v2, its last user.
    let d2 = deletion::request(&ingest, &ark, None, "takedown", "bob")
        .await
        .unwrap();
    let cancelled = deletion::cancel(&ingest, &d2.id, "carol").await.unwrap();
    assert_eq!(cancelled.status, Status::Cancelled);
    let late = deletion::approve(&ingest, &d2.id, "alice").await;
    assert!(
        matches!(late, Err(DeletionError::NotRequested { .. })),
        "{late:?}"
    );
    let d2 = deletion::request(&ingest, &ark, None, "takedown", "bob")
        .await
        .unwrap();
    let d2 = deletion::approve(&ingest, &d2.id, "alice").await.unwrap();
    assert_eq!(d2.status, Status::Deleted, "{:?}", d2.waiting);
    assert!(d2.kept.is_empty(), "{:?}", d2.kept);
    assert!(
        d2.files
            .iter()
            .any(|f| (f.version, f.path.as_str()) == (1, "producer/a.txt"))
    );
    for (v, rel) in [
        (1, "producer/a.txt"),
        (2, "producer/b.txt"),
        (2, "producer/d.txt"),
    ] {
        assert_eq!(
            held(&both, &ark, v, rel).await,
            [false, false],
            "v{v} {rel}"
        );
    }
    assert_eq!(held(&both, &ark, 2, DELETION_MARK).await, [true, true]);
    let (a2, inv) = (ark.clone(), ingest.inventory.clone());
    let left = inv.run(move |i| i.copies(None, Some(&a2))).await.unwrap();
    assert_eq!(left, [], "the checker expects no copy of a deleted object");
    let audit = lading_ingest::fixity::check(&ingest, None, None, None)
        .await
        .unwrap();
    assert_eq!(audit.findings, []);

    // Deposited again, the bag is the next version and carries nothing over from the deleted
    // ones (v2's record would name a.txt under v1, whose bytes are gone): every file is sent.
    let s3 = deposit(
        &w,
        &ingest,
        &replica,
        "v3",
        &[("a.txt", b"alpha"), ("b.txt", b"BETA")],
    )
    .await;
    assert_eq!((s3.ark.as_str(), s3.version), (ark.as_str(), 3));
    assert_eq!(held(&both, &ark, 3, "producer/a.txt").await, [true, true]);
    let bag = restore_and_validate(&w, &ingest, &s3, "rb").await;
    assert_eq!(std::fs::read(bag.join("data/a.txt")).unwrap(), b"alpha");
    let audit = lading_ingest::fixity::check(&ingest, None, None, None)
        .await
        .unwrap();
    assert!(audit.checked > 0);
    assert_eq!(audit.findings, []);
    let listed = deletion::list(&ingest, Some(&ark)).await.unwrap();
    let states: Vec<Status> = listed.iter().map(|d| d.status).collect();
    assert_eq!(listed.len(), 3);
    assert_eq!(
        states.iter().filter(|s| **s == Status::Deleted).count(),
        2,
        "{states:?}"
    );
}
