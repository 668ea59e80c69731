//! Unpacking containers (zip, tar, tar.gz) into the object's files, refusing any entry that
//! would land outside it.

use crate::checkm::check_relative_path;
use lading_worker::Outcome;
use std::io::Read;
use std::path::Path;

fn io(what: &str, p: &Path, e: impl std::fmt::Display) -> Outcome {
    Outcome::Transient(format!("{what} {}: {e}", p.display()))
}

/// Unpacks every container in `containers` into `producer` (through a temporary folder
/// renamed at the end, so a half-unpacked object is never taken for a whole one).
pub fn unpack_all(containers: &Path, producer: &Path) -> Result<(), Outcome> {
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
    for c in entries {
        unpack(&c, &tmp)?;
    }
    if producer.exists() {
        std::fs::remove_dir_all(producer).map_err(|e| io("removing", producer, e))?;
    }
    std::fs::rename(&tmp, producer).map_err(|e| io("renaming", producer, e))
}

fn unpack(container: &Path, into: &Path) -> Result<(), Outcome> {
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
        unzip(file, into, &name)
    } else if magic.starts_with(&[0x1f, 0x8b]) {
        untar(flate2::read::GzDecoder::new(file), into, &name)
    } else if magic.len() >= 262 && &magic[257..262] == b"ustar" {
        untar(file, into, &name)
    } else {
        Err(Outcome::fatal(format!(
            "container {name} is not a zip, tar or tar.gz file"
        )))
    }
}

fn unzip(file: std::fs::File, into: &Path, name: &str) -> Result<(), Outcome> {
    let bad = |e: zip::result::ZipError| Outcome::fatal(format!("container {name}: {e}"));
    let mut zip = zip::ZipArchive::new(file).map_err(bad)?;
    for i in 0..zip.len() {
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
        std::io::copy(&mut entry, &mut out)
            .map_err(|e| Outcome::fatal(format!("container {name}: entry {entry_name:?}: {e}")))?;
    }
    Ok(())
}

fn untar(r: impl Read, into: &Path, name: &str) -> Result<(), Outcome> {
    let bad = |e: std::io::Error| Outcome::fatal(format!("container {name}: {e}"));
    let mut ar = tar::Archive::new(r);
    for entry in ar.entries().map_err(bad)? {
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
                std::io::copy(&mut entry, &mut out).map_err(bad)?;
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
        unpack_all(&dir.path().join("container"), &producer).unwrap();
        assert!(producer.join("a/b.txt").is_file());
        assert!(producer.join("c.txt").is_file());
    }

    #[test]
    fn a_zip_entry_that_climbs_out_is_refused_and_nothing_is_unpacked() {
        let (dir, producer) = setup("evil.zip", &zip_of(&["ok.txt", "../../escaped.txt"]));
        let err = unpack_all(&dir.path().join("container"), &producer).unwrap_err();
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
        let err = unpack_all(&dir.path().join("container"), &producer).unwrap_err();
        match err {
            Outcome::Fatal(m) => assert!(m.contains("not a file or folder"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn something_that_is_no_container_is_named() {
        let (dir, producer) = setup("notes.txt", b"just text");
        let err = unpack_all(&dir.path().join("container"), &producer).unwrap_err();
        assert_eq!(
            err,
            Outcome::Fatal("container notes.txt is not a zip, tar or tar.gz file".into())
        );
    }
}
