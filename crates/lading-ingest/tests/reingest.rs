//! A reingest on a real storage node (SeaweedFS, seen through a counting proxy): an updated
//! bag sends only its changed and new files, its version lists the unchanged ones where an
//! earlier version stores them, a restore of it is a valid bag, and depositing that bag again
//! sends no payload file at all; the fixity checker finds every copy where it is. On the
//! storage root an unchanged file is a hard link to the earlier version's. On both stores.

#[macro_use]
mod common;

use common::bags::*;
use common::nodes::*;
use common::{Backend, World};
use lading_ingest::{Config, Ingest};
use lading_testkit::proxy::HoldingProxy;
use lading_testkit::seaweed::Weed;
use std::path::Path;
use std::sync::Arc;

/// The payload files (`producer/…`) version `version` sent to the node, by name, in the
/// request lines the proxy saw from `from` on (a PUT or a multipart upload's start).
fn payload_sent(proxy: &HoldingProxy, from: usize, version: u32) -> Vec<String> {
    let mut out: Vec<String> = proxy.requests()[from..]
        .iter()
        .filter(|r| r.starts_with("PUT ") || r.starts_with("POST "))
        .map(|r| {
            r.replace("%7C", "|")
                .replace("%7c", "|")
                .replace("%2F", "/")
                .replace("%2f", "/")
        })
        .filter_map(|r| {
            let at = r.find(&format!("|{version}|producer/"))?;
            let name = &r[at..];
            let name = name.split_once("producer/")?.1;
            Some(name.split(['?', ' ']).next()?.to_string())
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

on_both_backends!(an_updated_bag_sends_only_what_changed_and_a_round_trip_sends_no_payload);

/// v1 (a, b, c) is stored; v2 (a the same, b changed, d new, c gone) sends b and d only, and
/// lists a as stored under v1; v2 restored as a bag is valid and holds a's bytes; that bag
/// deposited again is v3 and sends no payload file. The checker then finds every copy good.
async fn an_updated_bag_sends_only_what_changed_and_a_round_trip_sends_no_payload(w: World) {
    let weed = Weed::start().expect("SeaweedFS");
    weed.bucket("primary").unwrap();
    let target: std::net::SocketAddr = weed
        .endpoint()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    // Holds nothing: no request line has this in it.
    let proxy = HoldingProxy::start(target, "\u{1}").unwrap();
    bag_profile(&w);
    w.profile(
        "bags",
        "collection = \"bags\"\n\
         bag_profiles = [\"bagit/aptrust-v2.2.json\", \"bagit/btr-v1.0.json\"]\n\
         storage_nodes = [9501]\n",
    );
    let cfg = Config {
        storage_nodes: vec![node_at(9501, proxy.endpoint(), "primary")],
        ..w.cfg.clone()
    };
    let ingest: Arc<Ingest> = Ingest::try_new_env(w.engine.clone(), cfg, env).unwrap();
    let deposit = |dir: &str, files: &[(&str, &[u8])]| {
        let src = w.dir.path().join(dir);
        let d = make_bag(
            &src,
            "rb",
            files,
            &[
                "--md5",
                "--sha256",
                "--source-organization",
                "Example University",
            ],
        );
        aptrust_info(&d, "Title: Reingested\nAccess: Institution\n");
        w.file(&format!("{dir}/rb.tar"), &serialize(&d, "rb", "rb.tar"))
            .0
    };
    let big: Vec<u8> = (0..6 << 20).map(|i| (i * 7 % 251) as u8).collect();
    let first = deposit(
        "v1",
        &[("a.bin", &big), ("b.txt", b"beta"), ("c.txt", b"gamma")],
    );
    let b1 = w
        .submit_as(&ingest, "bags", "depositor", &first, "bag")
        .await;
    w.runs_to_completion(&ingest, &b1).await;
    let s1 = w.store_record(&w.first_job(&b1).await).await.unwrap();
    assert_eq!(
        payload_sent(&proxy, 0, 1),
        vec!["a.bin", "b.txt", "c.txt"],
        "v1 sends every payload file"
    );

    let seen = proxy.requests().len();
    let second = deposit(
        "v2",
        &[("a.bin", &big), ("b.txt", b"BETA"), ("d.txt", b"delta")],
    );
    let b2 = w
        .submit_as(&ingest, "bags", "depositor", &second, "bag")
        .await;
    w.runs_to_completion(&ingest, &b2).await;
    let s2 = w.store_record(&w.first_job(&b2).await).await.unwrap();
    assert_eq!((s2.ark.as_str(), s2.version), (s1.ark.as_str(), 2));
    assert_eq!(
        payload_sent(&proxy, seen, 2),
        vec!["b.txt", "d.txt"],
        "v2 sends only the changed and the new file"
    );
    let node = ingest.nodes.get(9501).unwrap();
    let record = lading_ingest::stages::read_node_version(node, &s2.ark, 2)
        .await
        .unwrap()
        .expect("v2's record on the node");
    let payload: Vec<(String, Option<u32>)> = record
        .files
        .iter()
        .filter(|f| f.path.starts_with("producer/"))
        .map(|f| (f.path.clone(), f.from.as_ref().map(|o| o.version)))
        .collect();
    assert_eq!(
        payload,
        vec![
            ("producer/a.bin".to_string(), Some(1)),
            ("producer/b.txt".to_string(), None),
            ("producer/d.txt".to_string(), None),
        ]
    );
    let (ark, inv) = (s2.ark.clone(), ingest.inventory.clone());
    let listed = inv.run(move |i| i.version_files(&ark, 2)).await.unwrap();
    let names: Vec<&str> = listed
        .iter()
        .map(|(p, _)| p.as_str())
        .filter(|p| p.starts_with("producer/"))
        .collect();
    assert_eq!(
        names,
        ["producer/a.bin", "producer/b.txt", "producer/d.txt"]
    );

    // v2 given back as a bag: valid, and a's bytes read from where v1 stores them.
    let bag = restore_and_validate(&w, &ingest, &s2, "rb").await;
    assert_eq!(std::fs::read(bag.join("data/a.bin")).unwrap(), big);
    assert_eq!(std::fs::read(bag.join("data/b.txt")).unwrap(), b"BETA");
    assert!(!bag.join("data/c.txt").exists());

    // The restored bag deposited again: the next version, no payload file sent.
    let seen = proxy.requests().len();
    let again = w
        .file("v3/rb.tar", &serialize(Path::new(&bag), "rb", "rb.tar"))
        .0;
    let b3 = w
        .submit_as(&ingest, "bags", "depositor", &again, "bag")
        .await;
    w.runs_to_completion(&ingest, &b3).await;
    let s3 = w.store_record(&w.first_job(&b3).await).await.unwrap();
    assert_eq!(s3.version, 3);
    assert_eq!(
        payload_sent(&proxy, seen, 3),
        Vec::<String>::new(),
        "a round trip sends no payload file"
    );
    std::fs::remove_dir_all(w.dir.path().join("restored")).unwrap();
    let bag3 = restore_and_validate(&w, &ingest, &s3, "rb").await;
    assert_eq!(std::fs::read(bag3.join("data/a.bin")).unwrap(), big);

    // Every copy is where the inventory says; nothing missing, nothing bad.
    let audit = lading_ingest::fixity::check(&ingest, None, None, None)
        .await
        .unwrap();
    assert!(audit.checked > 0);
    assert_eq!(audit.findings.len(), 0, "{:?}", audit.findings);
}

on_both_backends!(
    on_the_storage_root_an_unchanged_file_is_stored_once_and_outlives_a_deleted_version
);

/// On the storage root (a profile without nodes) a new version's unchanged files are hard
/// links to the earlier version's: stored once. Deleting v1 then leaves v2 whole and valid.
async fn on_the_storage_root_an_unchanged_file_is_stored_once_and_outlives_a_deleted_version(
    w: World,
) {
    use std::os::unix::fs::MetadataExt;
    bag_profile(&w);
    w.profile(
        "bags",
        "collection = \"bags\"\n\
         bag_profiles = [\"bagit/aptrust-v2.2.json\", \"bagit/btr-v1.0.json\"]\n",
    );
    let ingest = w.ingest();
    let deposit = async |dir: &str, files: &[(&str, &[u8])]| {
        let src = w.dir.path().join(dir);
        let d = make_bag(
            &src,
            "rb",
            files,
            &[
                "--md5",
                "--sha256",
                "--source-organization",
                "Example University",
            ],
        );
        aptrust_info(&d, "Title: Root\nAccess: Institution\n");
        let tar = w
            .file(&format!("{dir}/rb.tar"), &serialize(&d, "rb", "rb.tar"))
            .0;
        let b = w.submit_as(&ingest, "bags", "depositor", &tar, "bag").await;
        w.runs_to_completion(&ingest, &b).await;
        w.store_record(&w.first_job(&b).await).await.unwrap()
    };
    let big: Vec<u8> = (0..1 << 20).map(|i| (i * 13 % 251) as u8).collect();
    let s1 = deposit("v1", &[("a.bin", &big), ("b.txt", b"beta")]).await;
    let s2 = deposit("v2", &[("a.bin", &big), ("b.txt", b"BETA")]).await;
    assert_eq!((s2.ark.as_str(), s2.version), (s1.ark.as_str(), 2));
    let inode = |s: &lading_ingest::stages::StoredVersion, rel: &str| {
        std::fs::metadata(Path::new(&s.path).join(rel))
            .unwrap()
            .ino()
    };
    assert_eq!(
        inode(&s1, "producer/a.bin"),
        inode(&s2, "producer/a.bin"),
        "the unchanged file is stored once"
    );
    assert_ne!(inode(&s1, "producer/b.txt"), inode(&s2, "producer/b.txt"));

    let d = lading_ingest::deletion::request(&ingest, &s1.ark, Some(1), "superseded", "alice")
        .await
        .unwrap();
    let d = lading_ingest::deletion::approve(&ingest, &d.id, "bob")
        .await
        .unwrap();
    assert_eq!(d.status, lading_ingest::deletion::Status::Deleted);
    assert!(!Path::new(&s1.path).join("producer/a.bin").exists());
    let bag = restore_and_validate(&w, &ingest, &s2, "rb").await;
    assert_eq!(std::fs::read(bag.join("data/a.bin")).unwrap(), big);
    let audit = lading_ingest::fixity::check(&ingest, None, None, None)
        .await
        .unwrap();
    assert!(audit.checked > 0);
    assert_eq!(audit.findings, []);
}
