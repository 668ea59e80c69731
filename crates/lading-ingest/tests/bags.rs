//! BagIt bags end to end on real parts: bags made by the Library of Congress's own `bagit.py`
//! (PyPI `bagit`, which `scripts/test` installs), served by an HTTP payload server, taken
//! through every stage into the storage folder, on SQLite and on ZooKeeper; the profiles are
//! the two `examples/bagit/` ships.

#[macro_use]
mod common;

use common::bags::*;
use common::*;
use lading_core::JobState;
use lading_ingest::checkm::{self, ManifestKind};
use std::path::Path;

/// Serves bags as `NAME` files and a bag batch manifest naming them; returns its URL.
fn serve_bags(w: &World, manifest: &str, bags: &[(String, Vec<u8>)]) -> String {
    let rows: Vec<Vec<String>> = bags
        .iter()
        .map(|(name, bytes)| {
            let (url, md5) = w.file(&format!("bags/{name}"), bytes);
            vec![url, "md5".into(), md5]
        })
        .collect();
    let text = checkm::write(
        ManifestKind::ContainerBatch,
        &[checkm::FILE_URL, checkm::HASH_ALG, checkm::HASH_VALUE],
        &rows,
    );
    w.file(manifest, text.as_bytes()).0
}

/// Valid bags of each manifest algorithm and serialization are stored file for file: the
/// payload as `producer/PATH`, the tag files under `system/bag/`, byte for byte; their tags
/// become the job's metadata.
async fn valid_bags_are_stored_byte_for_byte(w: World) {
    bag_profile(&w);
    let src = w.dir.path().join("made");
    let payload: &[(&str, &[u8])] = &[
        ("one.txt", b"one"),
        ("sub dir/two.bin", b"\x00\x01two"),
        ("notes/three.txt", b"three\n"),
    ];
    let mut bags = Vec::new();
    let mut sources = Vec::new();
    // APTrust-compatible (the default profile): tar, md5 (and sha256).
    for (name, args) in [
        ("ap-md5", &["--md5"][..]),
        ("ap-md5-sha256", &["--md5", "--sha256"][..]),
    ] {
        let args = [args, &["--source-organization", "Example University"][..]].concat();
        let d = make_bag(&src, name, payload, &args);
        aptrust_info(&d, &format!("Title: The {name} bag\nAccess: Institution\n"));
        bags.push((format!("{name}.tar"), serialize(&d, name, "x.tar")));
        sources.push((name, d));
    }
    // BTR, named in bag-info.txt: sha1 as tar.gz, sha512 as zip, sha256 as tar.
    for (name, alg, file) in [
        ("btr-sha1", "--sha1", "btr-sha1.tar.gz"),
        ("btr-sha512", "--sha512", "btr-sha512.zip"),
        ("btr-sha256", "--sha256", "btr-sha256.tar"),
    ] {
        let d = make_bag(
            &src,
            name,
            payload,
            &[
                alg,
                "--source-organization",
                "Example University",
                "--bagit-profile-identifier",
                BTR,
            ],
        );
        bags.push((file.to_string(), serialize(&d, name, file)));
        sources.push((name, d));
    }
    let url = serve_bags(&w, "valid.checkm", &bags);
    let ingest = w.ingest();
    let b = w
        .submit_as(&ingest, "bags", "depositor", &url, "bag-batch-manifest")
        .await;
    let run = w.run_all(&ingest);
    w.completes(&b).await;
    run.stop().await;
    let jobs = w.jobs_of(&b).await;
    assert_eq!(jobs.len(), bags.len());
    let mut seen = Vec::new();
    for j in &jobs {
        let info = w.engine.job(j).await.unwrap();
        let s = w.store_record(j).await.expect("stored");
        let at = Path::new(&s.path);
        let bag_tags = at.join("system/bag");
        // Which bag: its bag-info.txt, stored byte for byte, says.
        let (name, dir) = sources
            .iter()
            .find(|(_, d)| {
                std::fs::read(d.join("bag-info.txt")).ok()
                    == std::fs::read(bag_tags.join("bag-info.txt")).ok()
                    && std::fs::read(d.join("bagit.txt")).is_ok()
                    && tree(d)
                        .iter()
                        .filter(|(r, _)| !r.starts_with("data/"))
                        .all(|(r, b)| std::fs::read(bag_tags.join(r)).ok().as_ref() == Some(b))
            })
            .unwrap_or_else(|| panic!("no source bag matches {}", bag_tags.display()));
        for (rel, bytes) in tree(dir) {
            let stored_at = match rel.strip_prefix("data/") {
                Some(p) => at.join("producer").join(p),
                None => bag_tags.join(&rel),
            };
            assert_eq!(
                std::fs::read(&stored_at).ok().as_deref(),
                Some(bytes.as_slice()),
                "{name}: {rel} stored byte for byte"
            );
        }
        let files = stored_files(at);
        let payload_files = files.iter().filter(|f| f.starts_with("producer/")).count();
        assert_eq!(payload_files, payload.len(), "{name}: {files:?}");
        let md = &serde_json::to_value(&info.metadata).unwrap();
        if name.starts_with("ap-") {
            assert_eq!(md["erc_what"], format!("The {name} bag"), "{md}");
            assert_eq!(md["Access"], "Institution", "{md}");
            // Absent Storage-Option: the profile's default.
            assert_eq!(md["Storage-Option"], "Standard", "{md}");
        } else {
            assert_eq!(md["erc_who"], "Example University", "{md}");
            // bagit.py spells the label its own way; it is kept as written.
            assert_eq!(md["Bagit-Profile-Identifier"], BTR, "{md}");
        }
        assert!(
            md["erc_when"].as_str().is_some_and(|d| !d.is_empty()),
            "{md}"
        );
        let ids = &serde_json::to_value(&info.identifiers).unwrap();
        assert_eq!(ids["local_id"][0], *name, "{ids}");
        // Given back as a bag: valid by bagit.py, its tag files the deposited ones.
        let restored = restore_and_validate(&w, &ingest, &s, name).await;
        for (rel, bytes) in tree(dir) {
            let top = !rel.contains('/');
            if rel.starts_with("data/")
                || rel == "bag-info.txt"
                || (top && rel.starts_with("tagmanifest-"))
            {
                continue;
            }
            assert_eq!(
                std::fs::read(restored.join(&rel)).ok().as_deref(),
                Some(bytes.as_slice()),
                "{name}: restored {rel} byte for byte"
            );
        }
        let info_now = std::fs::read_to_string(restored.join("bag-info.txt")).unwrap();
        let info_then = std::fs::read_to_string(dir.join("bag-info.txt")).unwrap();
        for line in info_then.lines().filter(|l| !l.starts_with("Bagging-Date")) {
            assert!(
                info_now.contains(line),
                "{name}: {line:?} kept in {info_now}"
            );
        }
        seen.push(name.to_string());
    }
    seen.sort();
    assert_eq!(seen.len(), bags.len(), "every bag once: {seen:?}");
}

/// An object that was not deposited as a bag is given back as one too (md5 and sha256).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_not_deposited_as_a_bag_is_restored_as_a_valid_bag() {
    let w = World::new().await;
    let (ingest, b) = w
        .submit_object(&[("a.txt", b"alpha"), ("dir/b.bin", b"\x00beta")])
        .await;
    let ingest2 = ingest.clone();
    w.runs_to_completion(&ingest2, &b).await;
    let j = w.first_job(&b).await;
    let s = w.store_record(&j).await.unwrap();
    let name = format!("{}_v1", lading_ingest::restore::bag_name_of(&s.ark));
    let bag = restore_and_validate(&w, &ingest, &s, &name).await;
    assert_eq!(
        std::fs::read(bag.join("data/dir/b.bin")).unwrap(),
        b"\x00beta"
    );
    assert!(bag.join("manifest-md5.txt").is_file());
}

/// Each kind of invalid bag fails its own job once, fatally, in Processing, naming the
/// problem; nothing of it is stored.
async fn invalid_bags_fail_once_naming_every_problem_and_store_nothing(w: World) {
    bag_profile(&w);
    let src = w.dir.path().join("made");
    let payload: &[(&str, &[u8])] = &[("a.txt", b"alpha"), ("b.txt", b"beta")];
    let good = |name: &str| {
        let d = make_bag(
            &src,
            name,
            payload,
            &["--md5", "--source-organization", "Example University"],
        );
        aptrust_info(&d, "Title: T\nAccess: Consortia\n");
        d
    };
    let mut bags: Vec<(String, Vec<u8>)> = Vec::new();
    let mut expect: Vec<(String, Vec<&str>)> = Vec::new();
    let mut add = |file: &str, top: &str, d: &Path, wants: Vec<&'static str>| {
        bags.push((file.to_string(), serialize(d, top, file)));
        expect.push((file.to_string(), wants));
    };
    let d = good("wrong-digest");
    std::fs::write(d.join("data/a.txt"), b"ALPHA").unwrap();
    add(
        "wrong-digest.tar",
        "wrong-digest",
        &d,
        vec!["data/a.txt: md5 in manifest-md5.txt is", "the file's is"],
    );
    let d = good("missing-file");
    std::fs::remove_file(d.join("data/b.txt")).unwrap();
    add(
        "missing-file.tar",
        "missing-file",
        &d,
        vec!["data/b.txt is listed in manifest-md5.txt but is not in the bag"],
    );
    let d = good("extra-file");
    std::fs::write(d.join("data/c.txt"), b"gamma").unwrap();
    add(
        "extra-file.tar",
        "extra-file",
        &d,
        vec!["data/c.txt is in the payload but not in manifest-md5.txt"],
    );
    let d = good("wrong-oxum");
    let info = std::fs::read_to_string(d.join("bag-info.txt")).unwrap();
    let info = info.replace("Payload-Oxum: 9.2", "Payload-Oxum: 10.2");
    std::fs::write(d.join("bag-info.txt"), info).unwrap();
    add(
        "wrong-oxum.tar",
        "wrong-oxum",
        &d,
        vec!["Payload-Oxum is 10.2", "holds 9.2"],
    );
    let d = good("no-title");
    aptrust_info(&d, "Access: Consortia\n");
    add(
        "no-title.tar",
        "no-title",
        &d,
        vec!["aptrust-info.txt: tag Title is missing"],
    );
    let d = good("with-fetch");
    std::fs::write(d.join("fetch.txt"), "http://example.org/x 5 data/x.txt\n").unwrap();
    add(
        "with-fetch.tar",
        "with-fetch",
        &d,
        vec!["fetch.txt is present but the BagIt profile"],
    );
    let d = good("other-folder");
    add(
        "named-otherwise.tar",
        "other-folder",
        &d,
        vec!["unpacks to a folder named \"other-folder\", not \"named-otherwise\""],
    );
    let d = good("escaping");
    let mut m = std::fs::read_to_string(d.join("manifest-md5.txt")).unwrap();
    m.push_str("d41d8cd98f00b204e9800998ecf8427e  data/../../etc/passwd\n");
    std::fs::write(d.join("manifest-md5.txt"), m).unwrap();
    add(
        "escaping.tar",
        "escaping",
        &d,
        vec!["\"data/../../etc/passwd\" escapes the bag"],
    );
    // Two problems in one bag: both are named.
    let d = good("two-problems");
    std::fs::write(d.join("data/a.txt"), b"ALPHA").unwrap();
    aptrust_info(&d, "Title: T\nAccess: Everyone\n");
    add(
        "two-problems.tar",
        "two-problems",
        &d,
        vec![
            "(2 problems)",
            "data/a.txt: md5",
            "tag Access is \"Everyone\", not one of Consortia, Institution, Restricted",
        ],
    );
    let url = serve_bags(&w, "invalid.checkm", &bags);
    let ingest = w.ingest();
    let b = w
        .submit_as(&ingest, "bags", "depositor", &url, "bag-batch-manifest")
        .await;
    let run = w.run_all(&ingest);
    w.batch_ends(&b).await;
    run.stop().await;
    let jobs = w.jobs_of(&b).await;
    assert_eq!(jobs.len(), expect.len());
    let mut matched = 0;
    for j in &jobs {
        let info = w.engine.job(j).await.unwrap();
        let st = &info.status;
        assert_eq!(st.status, JobState::Failed, "{j}: {st:?}");
        assert_eq!(st.last_successful_status, Some(JobState::Downloading));
        let msg = st.message.clone().unwrap_or_default();
        let file = info.configuration.raw()["file"]["name"]
            .as_str()
            .unwrap()
            .to_string();
        let (_, wants) = expect
            .iter()
            .find(|(f, _)| *f == file)
            .unwrap_or_else(|| panic!("which bag is {file}?"));
        for want in wants {
            assert!(msg.contains(want), "{file}: {want:?} not in {msg:?}");
        }
        // Failed once: fatal, no attempt retried.
        let history = w.engine.job(j).await.unwrap().status.extra;
        let failed = history
            .get("failed_attempts")
            .and_then(|v| v.as_u64())
            .unwrap_or(1);
        assert!(failed <= 1, "{file}: {history:?}");
        assert!(w.store_record(j).await.is_none(), "{file} stored nothing");
        matched += 1;
    }
    assert_eq!(matched, expect.len());
    // Nothing reached the storage root.
    let root = w.cfg.storage_root();
    let objects = std::fs::read_dir(&root).map(|d| d.count()).unwrap_or(0);
    assert_eq!(objects, 0, "nothing stored under {}", root.display());
}

on_both_backends!(
    valid_bags_are_stored_byte_for_byte,
    invalid_bags_fail_once_naming_every_problem_and_store_nothing,
    a_bag_of_a_known_name_is_its_objects_next_version,
);

/// A bag whose name is already an object of the collection becomes that object's next
/// version; the job's record counts the files new, changed, unchanged and deleted, and the
/// version holds just the new bag's payload.
async fn a_bag_of_a_known_name_is_its_objects_next_version(w: World) {
    bag_profile(&w);
    let ingest = w.ingest();
    let deposit = |dir: &str, files: &'static [(&'static str, &'static [u8])]| {
        let src = w.dir.path().join(dir);
        let d = make_bag(
            &src,
            "rb",
            files,
            &["--md5", "--source-organization", "Example University"],
        );
        aptrust_info(&d, "Title: Reingested\nAccess: Institution\n");
        w.file(&format!("{dir}/rb.tar"), &serialize(&d, "rb", "rb.tar"))
            .0
    };
    let first = deposit(
        "v1",
        &[("a.txt", b"alpha"), ("b.txt", b"beta"), ("c.txt", b"gamma")],
    );
    let b1 = w
        .submit_as(&ingest, "bags", "depositor", &first, "bag")
        .await;
    w.runs_to_completion(&ingest, &b1).await;
    let j1 = w.first_job(&b1).await;
    let s1 = w.store_record(&j1).await.unwrap();
    let second = deposit(
        "v2",
        &[("a.txt", b"alpha"), ("b.txt", b"BETA"), ("d.txt", b"delta")],
    );
    let b2 = w
        .submit_as(&ingest, "bags", "depositor", &second, "bag")
        .await;
    w.runs_to_completion(&ingest, &b2).await;
    let j2 = w.first_job(&b2).await;
    let s2 = w.store_record(&j2).await.unwrap();
    assert_eq!(s2.ark, s1.ark, "the same object");
    assert_eq!(s2.version, 2);
    let node = w
        .engine
        .tree()
        .get(&lading_core::layout::job_node(&j2, "inventory"))
        .await
        .unwrap()
        .unwrap();
    let inv: serde_json::Value = serde_json::from_slice(&node.data.unwrap()).unwrap();
    assert_eq!(
        inv["bag"]["reingest"],
        serde_json::json!({"from_version": 1, "new": 1, "changed": 1, "unchanged": 1, "deleted": 1}),
        "{inv}"
    );
    let files: Vec<String> = stored_files(Path::new(&s2.path))
        .into_iter()
        .filter(|f| f.starts_with("producer/"))
        .collect();
    assert_eq!(
        files,
        vec!["producer/a.txt", "producer/b.txt", "producer/d.txt"]
    );
}

/// A BagIt profile (the specification's JSON) that allows `fetch.txt`.
const FETCHING: &str = "https://example.org/lading-test/fetching.json";

/// A bag holding some payload files by reference (`fetch.txt`, under a profile that allows
/// it) is completed from their URLs, under the depositor's URL policy, checked against its
/// manifests as any payload, and stored whole; a bag whose fetched file does not match its
/// manifest, whose fetch.txt names a file outside the payload, or whose URL the policy
/// refuses fails once, naming the problem, and stores nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bags_fetch_txt_is_fetched_when_its_profile_allows_it() {
    let w = World::on(Backend::Sqlite).await;
    let to = w.cfg.profiles_dir().join("bagit");
    std::fs::create_dir_all(&to).unwrap();
    let profile = serde_json::json!({
        "BagIt-Profile-Info": {
            "BagIt-Profile-Identifier": FETCHING,
            "Source-Organization": "Lading tests",
            "Version": "1.0"
        },
        "Allow-Fetch.txt": true,
        "Manifests-Required": ["md5"],
        "Accept-Serialization": ["application/tar"],
        "Accept-BagIt-Version": ["0.97", "1.0"]
    });
    std::fs::write(to.join("fetching.json"), profile.to_string()).unwrap();
    w.profile(
        "fetching",
        "collection = \"fetching\"\nbag_profiles = [\"bagit/fetching.json\"]\n",
    );
    let big = vec![7u8; 200_000];
    let (big_url, _) = w.file("elsewhere/big.bin", &big);
    let (wrong_url, _) = w.file("elsewhere/wrong.bin", b"not what the manifest says");
    let src = w.dir.path().join("made");
    // Made whole by bagit.py, then one file taken out and listed in fetch.txt instead.
    let by_reference = |name: &str, fetch: &str| {
        let d = make_bag(
            &src,
            name,
            &[("small.txt", b"small"), ("big.bin", &big)],
            &["--md5", "--bagit-profile-identifier", FETCHING],
        );
        std::fs::remove_file(d.join("data/big.bin")).unwrap();
        std::fs::write(d.join("fetch.txt"), fetch).unwrap();
        let (url, _) = w.file(&format!("bags/{name}.tar"), &serialize(&d, name, "x.tar"));
        (url, d)
    };
    let (good, _) = by_reference("fetched", &format!("{big_url} 200000 data/big.bin\n"));
    let (mismatch, _) = by_reference("mismatch", &format!("{wrong_url} - data/big.bin\n"));
    let (outside, _) = by_reference("outside", &format!("{big_url} - bag-info.txt\n"));
    let (refused, _) = by_reference("refused", "ftp://example.org/big.bin 200000 data/big.bin\n");
    let ingest = w.ingest();
    let ok = w
        .submit_as(&ingest, "fetching", "depositor", &good, "bag")
        .await;
    w.runs_to_completion(&ingest, &ok).await;
    let j = w.first_job(&ok).await;
    let s = w.store_record(&j).await.expect("stored");
    let at = Path::new(&s.path);
    assert_eq!(std::fs::read(at.join("producer/big.bin")).unwrap(), big);
    assert_eq!(
        std::fs::read(at.join("producer/small.txt")).unwrap(),
        b"small"
    );
    assert!(
        at.join("system/bag/fetch.txt").is_file(),
        "its tag files kept"
    );
    for (url, want) in [
        (&mismatch, "data/big.bin: md5"),
        (
            &outside,
            "\"bag-info.txt\" is not a payload file (under data/)",
        ),
        (&refused, "fetch.txt: "),
    ] {
        let b = w
            .submit_as(&ingest, "fetching", "depositor", url, "bag")
            .await;
        let run = w.run_all(&ingest);
        w.batch_ends(&b).await;
        run.stop().await;
        let j = w.first_job(&b).await;
        let st = w.engine.job(&j).await.unwrap().status;
        assert_eq!(st.status, JobState::Failed, "{url}: {st:?}");
        let msg = st.message.clone().unwrap_or_default();
        assert!(msg.contains(want), "{url}: {want:?} not in {msg:?}");
        assert!(
            !msg.contains(&w.dir.path().display().to_string()),
            "no server path: {msg}"
        );
        let failed = st.extra.get("failed_attempts").and_then(|v| v.as_u64());
        assert!(failed.unwrap_or(1) <= 1, "fatal, once: {st:?}");
        assert!(w.store_record(&j).await.is_none(), "{url}: nothing stored");
    }
    // More than the working storage has free, declared: the job waits for space (no attempt
    // spent, nothing fetched) rather than filling the disk.
    let (huge, _) = by_reference(
        "huge",
        &format!("{big_url} 1000000000000000 data/big.bin\n"),
    );
    let mut cfg = w.cfg.clone();
    cfg.payload.max_unpacked_bytes = u64::MAX / 4;
    let roomy = lading_ingest::Ingest::new(w.engine.clone(), cfg);
    let b = w
        .submit_as(&roomy, "fetching", "depositor", &huge, "bag")
        .await;
    let run = w.run_all(&roomy);
    let j = w.first_job(&b).await;
    lading_testkit::poll::until_true("the job to wait for space", common::WAIT, async || {
        let st = w.engine.job(&j).await.unwrap().status;
        st.message
            .as_deref()
            .is_some_and(|m| m.contains("fetch.txt lists 1000000000000000 bytes"))
    })
    .await;
    run.stop().await;
    let st = w.engine.job(&j).await.unwrap().status;
    assert_eq!(st.status, JobState::Processing, "{st:?}");
    assert!(st.extra.get("failed_attempts").is_none(), "{st:?}");
    assert!(w.store_record(&j).await.is_none());
}
