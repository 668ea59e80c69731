//! The depositors' side of the simulation: payloads on disk for the batches that go through
//! Lading's own intake and file stages, and what each object must be once stored.
//!
//! A payload is a batch manifest (one object manifest per object, each naming one to three
//! files) or a single-file batch manifest (one object per file), written under the run's
//! folder and fetched through `file://` URLs by Lading's fetcher. Some objects name a file the
//! depositor puts in place only later (its job fails until an admin requeues it after that);
//! some objects share a primary identifier, so their jobs add versions to one object, from
//! several processes at once.

use lading_core::random::{Random, Seeded};
use lading_ingest::checkm::{self, ManifestKind};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What one object of a payload must be once stored.
#[derive(Debug, Clone, Default)]
pub struct Expected {
    /// File name → sha256 of its bytes.
    pub files: BTreeMap<String, String>,
    /// The primary identifier the manifest gives it, if any.
    pub ark: Option<String>,
}

/// One batch's payload: what to submit, and a file written only later.
pub struct Payload {
    pub url: String,
    pub payload_type: &'static str,
    pub late: Option<(PathBuf, Vec<u8>)>,
}

/// Every payload of a run, and what each object (by the URL a job fetches it from) must be.
#[derive(Default)]
pub struct Payloads {
    pub expected: BTreeMap<String, Expected>,
}

/// Primary identifiers the objects of a run share (several jobs, one object, many versions).
const SHARED_ARKS: usize = 3;

fn sha256_hex(b: &[u8]) -> String {
    let mut h = lading_ingest::fetch::Hasher::new(checkm::HashAlg::Sha256);
    h.update(b);
    h.hex()
}

fn url_of(p: &Path) -> String {
    format!("file://{}", p.display())
}

impl Payloads {
    /// Writes batch `i`'s payload under `root` and records what its objects must become.
    pub fn make(&mut self, root: &Path, seed: u64, i: usize, rng: &Seeded) -> Payload {
        let dir = root.join(format!("b{i}"));
        std::fs::create_dir_all(&dir).expect("the payload folder");
        let mut late = None;
        let mut want_late = rng.below(4) == 0;
        let mut file = |name: String, late: &mut Option<(PathBuf, Vec<u8>)>| {
            let bytes = format!("{seed}/{i}/{name}\n")
                .repeat(1 + rng.below(40))
                .into_bytes();
            let p = dir.join(&name);
            if want_late {
                want_late = false;
                *late = Some((p.clone(), bytes.clone()));
            } else {
                std::fs::write(&p, &bytes).expect("a payload file");
            }
            (p, bytes)
        };
        if rng.below(3) == 0 {
            // One object per file.
            let mut rows = Vec::new();
            for f in 0..1 + rng.below(4) {
                let (p, bytes) = file(format!("s{f}.txt"), &mut late);
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                rows.push(vec![url_of(&p), name.clone()]);
                self.expected.insert(
                    url_of(&p),
                    Expected {
                        files: [(name, sha256_hex(&bytes))].into(),
                        ark: None,
                    },
                );
            }
            let m = dir.join("batch.checkm");
            let fields = [checkm::FILE_URL, checkm::FILE_NAME];
            std::fs::write(
                &m,
                checkm::write(ManifestKind::SingleFileBatch, &fields, &rows),
            )
            .expect("a manifest");
            return Payload {
                url: url_of(&m),
                payload_type: "single-file-batch-manifest",
                late,
            };
        }
        // A manifest of object manifests.
        let mut rows = Vec::new();
        for o in 0..1 + rng.below(4) {
            let mut expected = Expected::default();
            let mut object_rows = Vec::new();
            for f in 0..1 + rng.below(3) {
                let (p, bytes) = file(format!("o{o}-f{f}.bin"), &mut late);
                let sha = sha256_hex(&bytes);
                // Declared sizes and digests now and then (the download is held to them).
                let declared = rng.below(2) == 0;
                let name = format!("dir{f}/f{f}.bin");
                object_rows.push(vec![
                    url_of(&p),
                    if declared {
                        "sha256".into()
                    } else {
                        String::new()
                    },
                    if declared { sha.clone() } else { String::new() },
                    if declared {
                        bytes.len().to_string()
                    } else {
                        String::new()
                    },
                    name.clone(),
                ]);
                expected.files.insert(name, sha);
            }
            let om = dir.join(format!("o{o}.checkm"));
            std::fs::write(
                &om,
                checkm::write(ManifestKind::Object, checkm::OBJECT_FIELDS, &object_rows),
            )
            .expect("an object manifest");
            if rng.below(3) == 0 {
                expected.ark = Some(format!("ark:/99999/sim{seed}s{}", rng.below(SHARED_ARKS)));
            }
            rows.push(vec![
                url_of(&om),
                format!("o{o}.checkm"),
                expected.ark.clone().unwrap_or_default(),
            ]);
            self.expected.insert(url_of(&om), expected);
        }
        let m = dir.join("batch.checkm");
        let fields = [checkm::FILE_URL, checkm::FILE_NAME, checkm::PRIMARY_ID];
        std::fs::write(&m, checkm::write(ManifestKind::Batch, &fields, &rows)).expect("a manifest");
        Payload {
            url: url_of(&m),
            payload_type: "batch-manifest",
            late,
        }
    }
}
