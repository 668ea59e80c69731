//! What the stages, the inventory and the storage nodes share about files, at the bottom of
//! the crate (it uses no other module): the working folder's names, an object's files and
//! their digests, a stored version's record and the versions under an object's folder, and
//! how a file-system error becomes a job's outcome.

use lading_worker::Outcome;
use sha2::Digest as _;
use std::path::{Path, PathBuf};

/// The object's files inside the working directory.
pub const PRODUCER: &str = "producer";

/// Downloaded containers, before processing unpacks them.
pub const CONTAINER: &str = "container";

/// Whether a job of payload type `t` downloads containers that Processing unpacks (a
/// container, a bag) rather than the object's files themselves.
pub fn unpacks(t: &str) -> bool {
    matches!(t, "container" | "bag")
}

/// Files Lading writes about the object (its manifest).
pub const SYSTEM: &str = "system";

/// Interim state of the stages.
pub const INTERIM: &str = ".lading";

/// The ERC file Merritt's clients add to an object: its who, what, when and where.
pub const ERC_FILE: &str = "mrt-erc.txt";

pub fn io_err(what: &str, path: &Path, e: std::io::Error) -> Outcome {
    // A full disk or a vanished mount may recover; a name that cannot exist here will not.
    // Messages name the file, not the server's folders.
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if is_permanent(&e) {
        Outcome::Fatal(format!("{what} {name:?}: {e}"))
    } else {
        Outcome::Transient(format!("{what} {name:?}: {e}"))
    }
}

/// File-system errors that trying again cannot clear: a name too long, a file where a folder
/// must be (or the other way round), a name that is not valid here.
pub fn is_permanent(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ENAMETOOLONG
                | libc::ENOTDIR
                | libc::EISDIR
                | libc::EEXIST
                | libc::EINVAL
                | libc::ELOOP
        )
    )
}

/// One file of a built object.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ObjectFile {
    pub path: String,
    pub size: u64,
    pub sha256: String,
    /// Where a version's file is stored when it is not stored under the version itself: a
    /// reingest does not upload again bytes an earlier version of the object holds on the
    /// node, and lists them from there. `None`: stored under this version and path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Origin>,
}

/// The version and path under which a carried-over file's bytes are stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Origin {
    pub version: u32,
    pub path: String,
}

impl ObjectFile {
    /// Where this file of version `version` is stored: (version, path).
    pub fn stored_at(&self, version: u32) -> (u32, &str) {
        match &self.from {
            Some(o) => (o.version, &o.path),
            None => (version, &self.path),
        }
    }
}

/// Every regular file under `dir`, relative paths sorted, with size and sha256.
pub fn list_files(dir: &Path) -> std::io::Result<Vec<ObjectFile>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let t = e.file_type()?;
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                let (size, sha256) = file_sha256(&e.path())?;
                let rel = e
                    .path()
                    .strip_prefix(dir)
                    .map_err(std::io::Error::other)?
                    .to_string_lossy()
                    .into_owned();
                out.push(ObjectFile {
                    path: rel,
                    size,
                    sha256,
                    from: None,
                });
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// What the storing stage wrote, kept in `/jobs/JID/store` and in the version's
/// `lading-version.json`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoredVersion {
    pub ark: String,
    pub version: u32,
    pub path: String,
    pub job: String,
    pub batch: String,
    /// The collection of the profile that stored it: the object's owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collection: Option<String>,
    /// The storage node holding the primary copy (none: the storage root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<u32>,
}

pub const VERSION_FILE: &str = "lading-version.json";

/// Versions present under an object directory: `v1`, `v2`, …
pub fn versions(object_dir: &Path) -> std::io::Result<Vec<u32>> {
    let mut v = Vec::new();
    match std::fs::read_dir(object_dir) {
        Ok(rd) => {
            for e in rd {
                let name = e?.file_name();
                if let Some(n) = name.to_str().and_then(|s| s.strip_prefix('v'))
                    && let Ok(n) = n.parse()
                {
                    v.push(n);
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    v.sort_unstable();
    Ok(v)
}

pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// A buffer to read a file of `len` bytes with: its size and one byte more (its end is seen
/// in one read), at least 8 KiB, at most `max`.
pub fn read_buffer(len: u64, max: usize) -> usize {
    usize::try_from(len)
        .map_or(max, |n| n.saturating_add(1))
        .clamp(8 << 10, max)
}

/// Size and sha256 of a file, read in blocks.
pub fn file_sha256(path: &Path) -> std::io::Result<(u64, String)> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; read_buffer(f.metadata()?.len(), 256 << 10)];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        size += n as u64;
        h.update(&buf[..n]);
    }
    Ok((size, hex(&h.finalize())))
}

/// Files under `dir`, sorted, as (path relative to `dir` with `/`, absolute path, size).
pub fn files(dir: &Path) -> std::io::Result<Vec<(String, PathBuf, u64)>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let t = e.file_type()?;
            if t.is_dir() {
                todo.push(e.path());
            } else if t.is_file() {
                let rel = e
                    .path()
                    .strip_prefix(dir)
                    .map(|r| r.to_string_lossy().replace('\\', "/"))
                    .unwrap_or_default();
                out.push((rel, e.path(), e.metadata()?.len()));
            }
        }
    }
    out.sort();
    Ok(out)
}
