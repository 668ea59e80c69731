//! A stored version given back as a BagIt bag: `NAME.tar`, untarring to `NAME/`. A version
//! deposited as a bag gets its own tag files back byte for byte (but `bag-info.txt`, whose
//! `Bagging-Date` and `Payload-Oxum` are brought up to date), a payload manifest for each
//! algorithm it came with plus sha256, and tag manifests; any other version becomes a bag with
//! md5 and sha256 manifests. Streamed: the payload goes into the tar first, its digests
//! computed as it passes, and the manifests (a line per file) last, so memory does not grow
//! with the bag's bytes.

use crate::checkm::HashAlg;
use crate::fetch::Hasher;
use crate::files::{PRODUCER, VERSION_FILE};
use crate::sources::Source;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// Where a version keeps the bag it came as (its tag files) and what was learnt of it.
pub const BAG_TAGS: &str = "system/bag/";
pub const BAG_RECORD: &str = "system/bag.json";

/// Largest tag file carried over (read whole).
const MAX_TAG_FILE: u64 = 1 << 20;

/// The files of `src`, relative to the version, with their sizes.
async fn listing(src: &Source) -> std::io::Result<Vec<(String, u64)>> {
    match src {
        Source::Dir(d) => {
            let d = d.clone();
            let list = crate::blocking::io(move || crate::sources::files(&d)).await?;
            Ok(list
                .into_iter()
                .filter(|(n, _, _)| n != VERSION_FILE)
                .map(|(n, _, s)| (n, s))
                .collect())
        }
        Source::Node { files, .. } => Ok(files.iter().map(|f| (f.path.clone(), f.size)).collect()),
    }
}

async fn open(src: &Source, rel: &str) -> std::io::Result<crate::nodes::Reader> {
    match src {
        Source::Dir(d) => {
            let p = d.join(rel);
            let f = crate::blocking::io(move || std::fs::File::open(p)).await?;
            Ok(crate::nodes::Reader::File(f))
        }
        Source::Node {
            node,
            ark,
            version,
            files,
        } => {
            let (at, path) = files
                .iter()
                .find(|f| f.path == rel)
                .map_or((*version, rel), |f| f.stored_at(*version));
            node.open_read(ark, at, path)
                .await
                .map_err(|e| std::io::Error::other(e.what))?
                .ok_or_else(|| std::io::Error::other(format!("{}: {rel} is missing", node.name())))
        }
    }
}

/// A whole small file of `src`.
async fn read_small(src: &Source, rel: &str) -> std::io::Result<Vec<u8>> {
    read_bounded(src, rel, MAX_TAG_FILE).await
}

/// Largest manifest of a deposited bag carried over as it was.
const MAX_MANIFEST: u64 = 64 << 20;

/// A whole file of `src`, refused past `max` bytes.
async fn read_bounded(src: &Source, rel: &str, max: u64) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    match open(src, rel).await? {
        crate::nodes::Reader::File(f) => {
            out = crate::blocking::io(move || {
                use std::io::Read;
                let mut b = Vec::new();
                f.take(max + 1).read_to_end(&mut b)?;
                Ok(b)
            })
            .await?;
        }
        crate::nodes::Reader::Stream(mut s) => {
            use futures_util::StreamExt;
            while let Some(c) = s.next().await {
                out.extend_from_slice(&c.map_err(std::io::Error::other)?);
                if out.len() as u64 > max {
                    break;
                }
            }
        }
    }
    if out.len() as u64 > max {
        return Err(std::io::Error::other(format!(
            "{rel} is larger than {max} bytes"
        )));
    }
    Ok(out)
}

/// The header blocks of one tar entry (a GNU long-name entry first when the path needs it).
fn header(path: &str, size: u64, mtime: u64) -> std::io::Result<Vec<u8>> {
    let mut h = tar::Header::new_gnu();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_mtime(mtime);
    h.set_entry_type(tar::EntryType::Regular);
    let mut b = tar::Builder::new(Vec::new());
    b.append_data(&mut h, path, std::io::empty())?;
    // Only the header bytes: the builder's closing blocks are not taken.
    Ok(std::mem::take(b.get_mut()))
}

fn padding(size: u64) -> usize {
    ((512 - size % 512) % 512) as usize
}

/// The tar being written, moved to the blocking pool for each write.
struct Out<W> {
    w: Option<W>,
    written: u64,
}

impl<W: Write + Send + 'static> Out<W> {
    async fn put(&mut self, bytes: Vec<u8>) -> std::io::Result<()> {
        let mut w = self
            .w
            .take()
            .ok_or_else(|| std::io::Error::other("writer lost"))?;
        let n = bytes.len() as u64;
        let w = crate::blocking::io(move || {
            w.write_all(&bytes)?;
            Ok(w)
        })
        .await?;
        self.w = Some(w);
        self.written += n;
        Ok(())
    }

    /// One whole entry of `bytes`.
    async fn entry(&mut self, path: &str, bytes: Vec<u8>, mtime: u64) -> std::io::Result<()> {
        let size = bytes.len() as u64;
        self.put(header(path, size, mtime)?).await?;
        self.put(bytes).await?;
        self.put(vec![0; padding(size)]).await
    }
}

/// RFC 8493's escapes for a manifest's file path.
fn escape(path: &str) -> String {
    path.replace('%', "%25")
        .replace('\n', "%0A")
        .replace('\r', "%0D")
}

fn digest_of(algs: &[HashAlg], bytes: &[u8]) -> Vec<(HashAlg, String)> {
    algs.iter()
        .map(|a| {
            let mut h = Hasher::new(*a);
            h.update(bytes);
            (*a, h.hex())
        })
        .collect()
}

/// `bag-info.txt` with `Bagging-Date` and `Payload-Oxum` brought up to date (added when
/// absent); every other line kept as it was.
fn updated_bag_info(old: &str, date: &str, oxum: &str) -> String {
    let mut out = String::new();
    let (mut dated, mut oxumed, mut skipping) = (false, false, false);
    for line in old.split_inclusive('\n') {
        if skipping && line.starts_with([' ', '\t']) {
            continue;
        }
        skipping = false;
        let label = line
            .split_once(':')
            .map(|(l, _)| l.trim().to_ascii_lowercase());
        match label.as_deref() {
            Some("bagging-date") => {
                out.push_str(&format!("Bagging-Date: {date}\n"));
                dated = true;
                skipping = true;
            }
            Some("payload-oxum") => {
                out.push_str(&format!("Payload-Oxum: {oxum}\n"));
                oxumed = true;
                skipping = true;
            }
            _ => out.push_str(line),
        }
    }
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    if !dated {
        out.push_str(&format!("Bagging-Date: {date}\n"));
    }
    if !oxumed {
        out.push_str(&format!("Payload-Oxum: {oxum}\n"));
    }
    out
}

/// A folder name from an identifier: what is not a letter, digit, `-`, `_` or `.` becomes `_`.
pub fn bag_name_of(ark: &str) -> String {
    let s: String = ark
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    s.trim_start_matches('.').to_string()
}

/// What a restored bag was made of (for the log and the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub name: String,
    pub payload_files: u64,
    pub payload_bytes: u64,
    pub algorithms: Vec<String>,
}

/// Writes version `version` of `ark` from `src` as a bag in a tar to `out` (`now_ms` dates
/// it); returns `out`, flushed, and what it held.
pub async fn write_bag<W: Write + Send + 'static>(
    src: &Source,
    ark: &str,
    version: u32,
    now_ms: u64,
    out: W,
) -> std::io::Result<(W, Restored)> {
    let list = listing(src).await?;
    let record: Option<serde_json::Value> = if list.iter().any(|(p, _)| p == BAG_RECORD) {
        lading_core::json::from_bytes(&read_small(src, BAG_RECORD).await?).ok()
    } else {
        None
    };
    let from_bag = record.is_some();
    let name = record
        .as_ref()
        .and_then(|r| r.get("name").and_then(|n| n.as_str()).map(str::to_string))
        .unwrap_or_else(|| format!("{}_v{version}", bag_name_of(ark)));
    let (algs, tag_algs) = algorithms(record.as_ref());
    let mtime = now_ms / 1000;
    let date = lading_core::time::format_rfc3339(now_ms)
        .get(..10)
        .unwrap_or_default()
        .to_string();
    let mut tar = Out {
        w: Some(out),
        written: 0,
    };
    // The payload first, hashed as it passes.
    let mut manifests: BTreeMap<HashAlg, Vec<(String, String)>> = BTreeMap::new();
    let (mut files, mut bytes) = (0u64, 0u64);
    let producer = format!("{PRODUCER}/");
    for (rel, size) in list.iter().filter(|(p, _)| p.starts_with(&producer)) {
        let inside = format!("data/{}", &rel[producer.len()..]);
        tar.put(header(&format!("{name}/{inside}"), *size, mtime)?)
            .await?;
        let hashers = copy_file(&mut tar, src, rel, *size, &algs).await?;
        tar.put(vec![0; padding(*size)]).await?;
        for (a, h) in hashers {
            manifests
                .entry(a)
                .or_default()
                .push((inside.clone(), h.hex()));
        }
        files += 1;
        bytes += size;
    }
    let oxum = format!("{bytes}.{files}");
    // The tag files: the bag's own (bag-info.txt brought up to date), or new ones.
    let bag = Tagging {
        src,
        list: &list,
        from_bag,
    };
    let mut tags = bag.tag_files(ark, version, &date, &oxum).await?;
    for (a, lines) in &manifests {
        tags.push(bag.manifest(*a, lines).await?);
    }
    // Tag manifests list every tag file written, manifests among them.
    let mut tag_lines: BTreeMap<HashAlg, String> = BTreeMap::new();
    for (inside, body) in &tags {
        for (a, d) in digest_of(&tag_algs, body) {
            tag_lines
                .entry(a)
                .or_default()
                .push_str(&format!("{d}  {}\n", escape(inside)));
        }
    }
    for (a, text) in tag_lines {
        tags.push((format!("tagmanifest-{}.txt", a.name()), text.into_bytes()));
    }
    for (inside, body) in tags {
        tar.entry(&format!("{name}/{inside}"), body, mtime).await?;
    }
    tar.put(vec![0; 1024]).await?;
    let w = tar
        .w
        .take()
        .ok_or_else(|| std::io::Error::other("writer lost"))?;
    let w = crate::blocking::io(move || {
        let mut w = w;
        w.flush()?;
        Ok(w)
    })
    .await?;
    Ok((
        w,
        Restored {
            name,
            payload_files: files,
            payload_bytes: bytes,
            algorithms: algs.iter().map(|a| a.name().to_string()).collect(),
        },
    ))
}

/// The payload's and the tag manifests' algorithms of a bag from its deposit record
/// (`record`), or Lading's own (MD5 and SHA-256) for an object that came in no bag; SHA-256
/// always among them.
fn algorithms(record: Option<&serde_json::Value>) -> (Vec<HashAlg>, Vec<HashAlg>) {
    let from_bag = record.is_some();
    let get = |k: &str| -> Vec<String> {
        record
            .and_then(|r| r.get(k))
            .and_then(|v| v.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut algs: Vec<HashAlg> = if from_bag {
        get("payload_algorithms")
    } else {
        vec!["md5".into()]
    }
    .iter()
    .filter_map(|a| HashAlg::parse(a))
    .collect();
    if !algs.contains(&HashAlg::Sha256) {
        algs.push(HashAlg::Sha256);
    }
    let mut tag_algs: Vec<HashAlg> = get("tag_algorithms")
        .iter()
        .filter_map(|a| HashAlg::parse(a))
        .collect();
    for a in [HashAlg::Md5, HashAlg::Sha256] {
        if !from_bag && !tag_algs.contains(&a) {
            tag_algs.push(a);
        }
    }
    if !tag_algs.contains(&HashAlg::Sha256) {
        tag_algs.push(HashAlg::Sha256);
    }
    (algs, tag_algs)
}

/// Copies the stored file `rel` (`size` bytes) from `src` into the tar, hashed as it passes
/// with each of `algs`; the hashers. A file not of its listed size is an error.
async fn copy_file<W: Write + Send + 'static>(
    tar: &mut Out<W>,
    src: &Source,
    rel: &str,
    size: u64,
    algs: &[HashAlg],
) -> std::io::Result<Vec<(HashAlg, Hasher)>> {
    let mut hashers: Vec<(HashAlg, Hasher)> = algs.iter().map(|a| (*a, Hasher::new(*a))).collect();
    let mut n = 0u64;
    match open(src, rel).await? {
        crate::nodes::Reader::File(f) => {
            let mut w = tar
                .w
                .take()
                .ok_or_else(|| std::io::Error::other("writer lost"))?;
            let (w2, h2, got) = crate::blocking::io(move || {
                use std::io::Read;
                let mut f = f;
                let mut buf = vec![0u8; 1 << 20];
                let mut got = 0u64;
                loop {
                    let k = f.read(&mut buf)?;
                    if k == 0 {
                        break;
                    }
                    for (_, h) in &mut hashers {
                        h.update(&buf[..k]);
                    }
                    w.write_all(&buf[..k])?;
                    got += k as u64;
                }
                Ok((w, hashers, got))
            })
            .await?;
            tar.w = Some(w2);
            tar.written += got;
            hashers = h2;
            n = got;
        }
        crate::nodes::Reader::Stream(mut s) => {
            use futures_util::StreamExt;
            while let Some(c) = s.next().await {
                let c = c.map_err(std::io::Error::other)?;
                for (_, h) in &mut hashers {
                    h.update(&c);
                }
                n += c.len() as u64;
                tar.put(c.to_vec()).await?;
            }
        }
    }
    if n != size {
        return Err(std::io::Error::other(format!(
            "{rel}: {n} bytes read, {size} listed"
        )));
    }
    Ok(hashers)
}

/// What a restored bag's tag files are made from: the stored version's files, and whether
/// it came in a bag.
struct Tagging<'a> {
    src: &'a Source,
    list: &'a [(String, u64)],
    from_bag: bool,
}

impl Tagging<'_> {
    /// The bag's own tag files (bag-info.txt brought up to date, its manifests left for
    /// [`Tagging::manifest`]), or new ones for an object that came in no bag.
    async fn tag_files(
        &self,
        ark: &str,
        version: u32,
        date: &str,
        oxum: &str,
    ) -> std::io::Result<Vec<(String, Vec<u8>)>> {
        let (src, list, from_bag) = (self.src, self.list, self.from_bag);
        let mut tags: Vec<(String, Vec<u8>)> = Vec::new();
        if from_bag {
            for (rel, _) in list.iter().filter(|(p, _)| p.starts_with(BAG_TAGS)) {
                let inside = rel[BAG_TAGS.len()..].to_string();
                let top = !inside.contains('/');
                if top && (inside.starts_with("manifest-") || inside.starts_with("tagmanifest-")) {
                    continue;
                }
                let body = read_small(src, rel).await?;
                let body = if inside == "bag-info.txt" {
                    updated_bag_info(&String::from_utf8_lossy(&body), date, oxum).into_bytes()
                } else {
                    body
                };
                tags.push((inside, body));
            }
            if !tags.iter().any(|(n, _)| n == "bag-info.txt") {
                tags.push((
                    "bag-info.txt".into(),
                    updated_bag_info("", date, oxum).into_bytes(),
                ));
            }
        } else {
            tags.push((
                "bagit.txt".into(),
                b"BagIt-Version: 1.0\nTag-File-Character-Encoding: UTF-8\n".to_vec(),
            ));
            let info = format!(
                "External-Identifier: {ark}\nInternal-Sender-Identifier: {ark} v{version}\n\
                 Bag-Software-Agent: Lading\n"
            );
            tags.push((
                "bag-info.txt".into(),
                updated_bag_info(&info, date, oxum).into_bytes(),
            ));
        }
        Ok(tags)
    }

    /// The payload manifest of `a` listing `lines`: the deposited one, as it was, when it
    /// says just what was read now; else a new one.
    async fn manifest(
        &self,
        a: HashAlg,
        lines: &[(String, String)],
    ) -> std::io::Result<(String, Vec<u8>)> {
        let (src, list, from_bag) = (self.src, self.list, self.from_bag);
        let mut lines = lines.to_vec();
        lines.sort();
        let file = format!("manifest-{}.txt", a.name());
        // The deposited manifest, as it was, when it says just what was read now.
        let original = format!("{BAG_TAGS}{file}");
        if from_bag
            && list
                .iter()
                .any(|(p, s)| *p == original && *s <= MAX_MANIFEST)
        {
            let body = read_bounded(src, &original, MAX_MANIFEST).await?;
            let mut said: Vec<(String, String)> = String::from_utf8_lossy(&body)
                .lines()
                .filter_map(|l| {
                    let (d, p) = l.trim_end_matches('\r').split_once([' ', '\t'])?;
                    let p = p.trim_start_matches([' ', '\t']);
                    Some((crate::bagit::decode_path(p), d.to_ascii_lowercase()))
                })
                .collect();
            said.sort();
            if said == lines {
                return Ok((file, body));
            }
        }
        let text: String = lines
            .iter()
            .map(|(p, d)| format!("{d}  {}\n", escape(p)))
            .collect();
        Ok((file, text.into_bytes()))
    }
}

/// [`write_bag`] into the file `out` (through `out.part`, fsynced, then renamed).
pub async fn bag_to_file(
    src: &Source,
    ark: &str,
    version: u32,
    now_ms: u64,
    out: &Path,
) -> std::io::Result<Restored> {
    let part = out.with_extension("tar.part");
    let p = part.clone();
    let file = crate::blocking::io(move || {
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::fs::File::create(&p)
    })
    .await?;
    let buffered = std::io::BufWriter::with_capacity(1 << 20, file);
    let (w, restored) = write_bag(src, ark, version, now_ms, buffered).await?;
    let out = out.to_path_buf();
    crate::blocking::io(move || {
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        std::fs::rename(&part, out)
    })
    .await?;
    Ok(restored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bag_info_keeps_its_lines_but_the_date_and_the_oxum() {
        let old =
            "Source-Organization: UC\nBagging-Date: 2020-01-01\nPayload-Oxum: 1.1\nTitle: a\n  b\n";
        assert_eq!(
            updated_bag_info(old, "2026-11-29", "10.2"),
            "Source-Organization: UC\nBagging-Date: 2026-11-29\nPayload-Oxum: 10.2\nTitle: a\n  b\n"
        );
        assert_eq!(
            updated_bag_info("A: b", "D", "1.1"),
            "A: b\nBagging-Date: D\nPayload-Oxum: 1.1\n"
        );
        assert_eq!(bag_name_of("ark:/99999/fk4x"), "ark__99999_fk4x");
        assert_eq!(escape("data/a%b\nc"), "data/a%25b%0Ac");
    }
}
