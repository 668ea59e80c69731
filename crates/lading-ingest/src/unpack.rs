//! Unpacking containers (zip, tar, tar.gz) into the object's files, refusing any entry that
//! would land outside it.

use crate::checkm::check_relative_path;
use lading_worker::Outcome;
use std::io::Read;
use std::path::Path;

fn io(what: &str, p: &Path, e: std::io::Error) -> Outcome {
    crate::files::io_err(what, p, e)
}

/// Bounds on what one job's containers may unpack to (from `[payload]`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_bytes: u64,
    pub max_entries: u64,
    /// Unpacked bytes per byte of container.
    pub max_ratio: u64,
}

impl From<&crate::config::PayloadSettings> for Limits {
    fn from(p: &crate::config::PayloadSettings) -> Limits {
        Limits {
            max_bytes: p.max_unpacked_bytes,
            max_entries: p.max_unpacked_entries,
            max_ratio: p.max_unpack_ratio,
        }
    }
}

/// What unpacking has written so far, against the limits: every byte is counted as it is
/// written, so entries that share one compressed stream count as often as they are written.
struct Budget {
    limits: Limits,
    /// The most bytes allowed: the smaller of the byte limit and ratio × container bytes.
    max_bytes: u64,
    bytes: u64,
    entries: u64,
}

impl Budget {
    fn entry(&mut self, container: &str) -> Result<(), Outcome> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(Outcome::fatal(format!(
                "container {container}: more than {} entries (payload.max_unpacked_entries)",
                self.limits.max_entries
            )));
        }
        Ok(())
    }

    fn too_large(&self, container: &str) -> Outcome {
        Outcome::fatal(format!(
            "container {container} unpacks to more than {} bytes (payload.max_unpacked_bytes, \
             or payload.max_unpack_ratio = {} times the containers' size)",
            self.max_bytes, self.limits.max_ratio
        ))
    }

    /// Copies `r` into `out`, refusing the byte past the budget.
    fn copy(
        &mut self,
        r: &mut impl Read,
        out: &mut std::fs::File,
        container: &str,
        dest: &Path,
    ) -> Result<(), Outcome> {
        let left = self.max_bytes - self.bytes;
        let n = std::io::copy(&mut r.take(left + 1), out).map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof => {
                Outcome::fatal(format!("container {container}: {e}"))
            }
            _ => io("writing", dest, e),
        })?;
        if n > left {
            return Err(self.too_large(container));
        }
        self.bytes += n;
        Ok(())
    }
}

/// Unpacks every container in `containers` into `producer` (through a temporary folder
/// renamed at the end, so a half-unpacked object is never taken for a whole one), within
/// `limits`; returns the bytes unpacked.
pub fn unpack_all(containers: &Path, producer: &Path, limits: &Limits) -> Result<u64, Outcome> {
    let tmp = producer.with_extension("unpacking");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| io("removing", &tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| io("creating", &tmp, e))?;
    let mut entries: Vec<_> = std::fs::read_dir(containers)
        .map_err(|e| io("reading", containers, e))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    entries.sort();
    if entries.is_empty() {
        return Err(Outcome::fatal("no container was downloaded"));
    }
    let packed: u64 = entries
        .iter()
        .filter_map(|c| std::fs::metadata(c).ok())
        .map(|m| m.len())
        .sum();
    let mut budget = Budget {
        limits: *limits,
        max_bytes: limits
            .max_bytes
            .min(packed.max(1).saturating_mul(limits.max_ratio)),
        bytes: 0,
        entries: 0,
    };
    for c in entries {
        if let Err(o) = unpack(&c, &tmp, &mut budget) {
            // Nothing half-unpacked stays behind to fill the disk.
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(o);
        }
    }
    if producer.exists() {
        std::fs::remove_dir_all(producer).map_err(|e| io("removing", producer, e))?;
    }
    std::fs::rename(&tmp, producer).map_err(|e| io("renaming", producer, e))?;
    Ok(budget.bytes)
}

fn unpack(container: &Path, into: &Path, budget: &mut Budget) -> Result<(), Outcome> {
    let name = container
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut magic = [0u8; 262];
    let n = std::fs::File::open(container)
        .and_then(|mut f| f.read(&mut magic))
        .map_err(|e| io("reading", container, e))?;
    let magic = &magic[..n];
    let file = std::fs::File::open(container).map_err(|e| io("reading", container, e))?;
    if magic.starts_with(b"PK\x03\x04") || magic.starts_with(b"PK\x05\x06") {
        unzip(file, into, &name, budget)
    } else if magic.starts_with(&[0x1f, 0x8b]) {
        untar(flate2::read::GzDecoder::new(file), into, &name, budget)
    } else if magic.len() >= 262 && &magic[257..262] == b"ustar" {
        untar(file, into, &name, budget)
    } else {
        Err(Outcome::fatal(format!(
            "container {name} is not a zip, tar or tar.gz file"
        )))
    }
}

fn unzip(file: std::fs::File, into: &Path, name: &str, budget: &mut Budget) -> Result<(), Outcome> {
    let bad = |e: zip::result::ZipError| Outcome::fatal(format!("container {name}: {e}"));
    let mut zip = zip::ZipArchive::new(file).map_err(bad)?;
    for i in 0..zip.len() {
        budget.entry(name)?;
        let mut entry = zip.by_index(i).map_err(bad)?;
        let entry_name = entry.name().map_err(bad)?.to_string();
        let rel = entry
            .enclosed_name()
            .filter(|p| check_relative_path(&p.to_string_lossy().replace('\\', "/")).is_ok())
            .ok_or_else(|| {
                Outcome::fatal(format!(
                    "container {name}: entry {entry_name:?} would be written outside the object"
                ))
            })?;
        let dest = into.join(rel);
        if entry.is_dir() {
            std::fs::create_dir_all(&dest).map_err(|e| io("creating", &dest, e))?;
            continue;
        }
        if let Some(p) = dest.parent() {
            std::fs::create_dir_all(p).map_err(|e| io("creating", p, e))?;
        }
        let mut out = std::fs::File::create(&dest).map_err(|e| io("creating", &dest, e))?;
        budget.copy(&mut entry, &mut out, name, &dest)?;
    }
    Ok(())
}

fn untar(r: impl Read, into: &Path, name: &str, budget: &mut Budget) -> Result<(), Outcome> {
    let bad = |e: std::io::Error| Outcome::fatal(format!("container {name}: {e}"));
    let mut ar = tar::Archive::new(r);
    for entry in ar.entries().map_err(bad)? {
        budget.entry(name)?;
        let mut entry = entry.map_err(bad)?;
        let path = entry.path().map_err(bad)?.to_string_lossy().into_owned();
        let rel = path
            .trim_start_matches("./")
            .trim_end_matches('/')
            .to_string();
        if rel.is_empty() {
            continue;
        }
        check_relative_path(&rel).map_err(|_| {
            Outcome::fatal(format!(
                "container {name}: entry {path:?} would be written outside the object"
            ))
        })?;
        let dest = into.join(&rel);
        match entry.header().entry_type() {
            tar::EntryType::Directory => {
                std::fs::create_dir_all(&dest).map_err(|e| io("creating", &dest, e))?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                if let Some(p) = dest.parent() {
                    std::fs::create_dir_all(p).map_err(|e| io("creating", p, e))?;
                }
                let mut out = std::fs::File::create(&dest).map_err(|e| io("creating", &dest, e))?;
                budget.copy(&mut entry, &mut out, name, &dest)?;
            }
            // Links and devices could point outside the object: refused.
            other => {
                return Err(Outcome::fatal(format!(
                    "container {name}: entry {path:?} is a {other:?}, not a file or folder"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn setup(name: &str, bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("container")).unwrap();
        std::fs::write(dir.path().join("container").join(name), bytes).unwrap();
        let producer = dir.path().join("producer");
        (dir, producer)
    }

    const LIMITS: Limits = Limits {
        max_bytes: 1 << 20,
        max_entries: 100,
        max_ratio: 200,
    };

    #[test]
    fn bombs_are_refused_and_leave_nothing_unpacked() {
        // A zip of zeros: 8 MiB from a few KiB, over the ratio and the byte limit.
        let mut buf = std::io::Cursor::new(Vec::new());
        let mut z = zip::ZipWriter::new(&mut buf);
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        z.start_file("zeros.bin", opts).unwrap();
        z.write_all(&vec![0u8; 8 << 20]).unwrap();
        z.finish().unwrap();
        let (dir, producer) = setup("bomb.zip", &buf.into_inner());
        let err = unpack_all(&dir.path().join("container"), &producer, &LIMITS).unwrap_err();
        match err {
            Outcome::Fatal(m) => assert!(m.contains("unpacks to more than"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(!producer.exists());
        assert!(!producer.with_extension("unpacking").exists());
        // A tar.gz with too many entries.
        let mut t = tar::Builder::new(Vec::new());
        for i in 0..101 {
            let mut h = tar::Header::new_gnu();
            h.set_size(1);
            h.set_mode(0o600);
            h.set_cksum();
            t.append_data(&mut h, format!("f{i}"), &b"x"[..]).unwrap();
        }
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&t.into_inner().unwrap()).unwrap();
        let (dir, producer) = setup("many.tar.gz", &gz.finish().unwrap());
        let err = unpack_all(&dir.path().join("container"), &producer, &LIMITS).unwrap_err();
        match err {
            Outcome::Fatal(m) => assert!(m.contains("more than 100 entries"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(!producer.exists());
    }

    fn zip_of(names: &[&str]) -> Vec<u8> {
        let mut buf = std::io::Cursor::new(Vec::new());
        let mut z = zip::ZipWriter::new(&mut buf);
        for n in names {
            z.start_file(*n, zip::write::SimpleFileOptions::default())
                .unwrap();
            z.write_all(b"x").unwrap();
        }
        z.finish().unwrap();
        buf.into_inner()
    }

    #[test]
    fn a_zip_unpacks_into_the_object() {
        let (dir, producer) = setup("c.zip", &zip_of(&["a/b.txt", "c.txt"]));
        unpack_all(&dir.path().join("container"), &producer, &LIMITS).unwrap();
        assert!(producer.join("a/b.txt").is_file());
        assert!(producer.join("c.txt").is_file());
    }

    #[test]
    fn a_zip_entry_that_climbs_out_is_refused_and_nothing_is_unpacked() {
        let (dir, producer) = setup("evil.zip", &zip_of(&["ok.txt", "../../escaped.txt"]));
        let err = unpack_all(&dir.path().join("container"), &producer, &LIMITS).unwrap_err();
        match err {
            Outcome::Fatal(m) => assert!(m.contains("outside the object"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(!producer.exists(), "no half-unpacked object");
        assert!(!dir.path().join("escaped.txt").exists());
    }

    #[test]
    fn a_tar_link_is_refused() {
        let mut t = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        t.append_link(&mut h, "passwd", "/etc/passwd").unwrap();
        let (dir, producer) = setup("c.tar", &t.into_inner().unwrap());
        let err = unpack_all(&dir.path().join("container"), &producer, &LIMITS).unwrap_err();
        match err {
            Outcome::Fatal(m) => assert!(m.contains("not a file or folder"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn something_that_is_no_container_is_named() {
        let (dir, producer) = setup("notes.txt", b"just text");
        let err = unpack_all(&dir.path().join("container"), &producer, &LIMITS).unwrap_err();
        assert_eq!(
            err,
            Outcome::Fatal("container notes.txt is not a zip, tar or tar.gz file".into())
        );
    }
}
