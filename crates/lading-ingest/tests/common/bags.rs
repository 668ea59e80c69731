//! Bags for the tests: made by the Library of Congress's own `bagit.py` (PyPI `bagit`, which
//! `scripts/test` installs), serialized, checked back with it; the profile `bags`.

use super::World;
use lading_ingest::stages::StoredVersion;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `bagit.py`, on PATH or where `pip install --user` puts it.
pub fn bagit_py() -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_default();
    let mut places: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    places.push(Path::new(&home).join(".local/bin"));
    places
        .into_iter()
        .map(|d| d.join("bagit.py"))
        .find(|p| p.is_file())
        .expect("bagit.py (PyPI bagit) is missing: scripts/test installs it")
}

/// Makes folder `root/name` of `files` into a bag with `bagit.py ARGS`.
pub fn make_bag(root: &Path, name: &str, files: &[(&str, &[u8])], args: &[&str]) -> PathBuf {
    let dir = root.join(name);
    for (rel, bytes) in files {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
    let out = Command::new(bagit_py())
        .arg("--quiet")
        .args(args)
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "bagit.py: {out:?}");
    dir
}

/// Every file under `dir`, relative, with its bytes.
pub fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// `dir` serialized as `file` (`.tar`, `.tar.gz` or `.zip`), holding one folder `top`.
pub fn serialize(dir: &Path, top: &str, file: &str) -> Vec<u8> {
    let entries: Vec<(String, Vec<u8>)> = tree(dir)
        .into_iter()
        .map(|(rel, b)| (format!("{top}/{rel}"), b))
        .collect();
    if file.ends_with(".zip") {
        let refs: Vec<(&str, &[u8])> = entries
            .iter()
            .map(|(n, b)| (n.as_str(), b.as_slice()))
            .collect();
        return lading_testkit::zip_bytes(&refs);
    }
    let mut t = tar::Builder::new(Vec::new());
    for (name, bytes) in &entries {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        t.append_data(&mut h, name, bytes.as_slice()).unwrap();
    }
    let tar = t.into_inner().unwrap();
    if file.ends_with(".tar.gz") {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).unwrap();
        return gz.finish().unwrap();
    }
    tar
}

pub const BTR: &str = "https://raw.githubusercontent.com/dpscollaborative/btr_bagit_profile/master/btr-bagit-profile.json";

/// A Lading profile `bags` holding bags to the shipped APTrust-compatible profile (the
/// default) and the BTR profile.
pub fn bag_profile(w: &World) {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/bagit");
    let to = w.cfg.profiles_dir().join("bagit");
    std::fs::create_dir_all(&to).unwrap();
    for f in ["aptrust-v2.2.json", "btr-v1.0.json"] {
        std::fs::copy(examples.join(f), to.join(f)).unwrap();
    }
    w.profile(
        "bags",
        "collection = \"bags\"\n\
         bag_profiles = [\"bagit/aptrust-v2.2.json\", \"bagit/btr-v1.0.json\"]\n",
    );
}

pub fn aptrust_info(dir: &Path, text: &str) {
    std::fs::write(dir.join("aptrust-info.txt"), text).unwrap();
}

/// Restores stored version `s` as a bag (`lading admin restore --format bag` and the access
/// queue's `format: bag` both write it so), untars it, checks that bagit.py finds it valid,
/// and returns the bag's folder.
pub async fn restore_and_validate(
    w: &World,
    ingest: &lading_ingest::Ingest,
    s: &StoredVersion,
    name: &str,
) -> PathBuf {
    let src = lading_ingest::access::source(ingest, &s.ark, s.version, Some(s))
        .await
        .unwrap();
    let out = w.dir.path().join("restored").join(format!("{name}.tar"));
    let r = lading_ingest::restore::bag_to_file(&src, &s.ark, s.version, 1_800_000_000_000, &out)
        .await
        .unwrap();
    assert_eq!(r.name, name);
    let into = w.dir.path().join("restored").join(format!("{name}.d"));
    tar::Archive::new(std::fs::File::open(&out).unwrap())
        .unpack(&into)
        .unwrap();
    let entries: Vec<_> = std::fs::read_dir(&into).unwrap().collect();
    assert_eq!(entries.len(), 1, "one folder in {name}.tar");
    let bag = into.join(name);
    let v = Command::new(bagit_py())
        .args(["--validate", "--quiet"])
        .arg(&bag)
        .output()
        .unwrap();
    assert!(
        v.status.success(),
        "bagit.py --validate {name}: {}",
        String::from_utf8_lossy(&v.stderr)
    );
    let info = std::fs::read_to_string(bag.join("bag-info.txt")).unwrap();
    assert!(info.contains("Bagging-Date: 2027-01-15"), "{info}");
    assert!(bag.join("manifest-sha256.txt").is_file());
    bag
}
