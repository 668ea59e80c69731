//! BagIt bags (RFC 8493), validated on disk once unpacked: `bagit.txt`, every payload and
//! tag manifest both ways (each file read once for all its algorithms, on two threads),
//! `Payload-Oxum`, `fetch.txt`, names that escape the bag, and the BagIt profile the bag is
//! held to. Every problem found is kept: an invalid bag is refused naming all of them.

use crate::bagprofile::{ALGORITHMS, BagProfile};
use crate::checkm::{HashAlg, check_relative_path};
use crate::fetch::Hasher;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One tag of a tag file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Tag {
    pub file: String,
    pub name: String,
    pub value: String,
}

/// A bag that passed.
#[derive(Debug, Clone)]
pub struct Bag {
    /// The bag's name: its serialization's file name without the extension.
    pub name: String,
    /// The folder holding `bagit.txt`.
    pub dir: PathBuf,
    pub version: String,
    pub profile: Arc<BagProfile>,
    /// Algorithms of its payload manifests, and of its tag manifests.
    pub payload_algorithms: Vec<String>,
    pub tag_algorithms: Vec<String>,
    /// Tags of every tag file read as tags (`bagit.txt`, `bag-info.txt`, and the files the
    /// profile names), and the defaults of absent required tags.
    pub tags: Vec<Tag>,
    pub payload_files: u64,
    pub payload_bytes: u64,
}

impl Bag {
    /// The first value of tag `name` (case-insensitive), in any tag file.
    pub fn tag(&self, name: &str) -> Option<&str> {
        self.tags
            .iter()
            .find(|t| t.name.eq_ignore_ascii_case(name))
            .map(|t| t.value.as_str())
    }
}

/// Largest tag file read as tags, and largest manifest line.
const MAX_TAG_FILE: u64 = 1 << 20;
const MAX_LINE: usize = 64 << 10;

/// The media type of a serialization, by its file name, and the name without extension.
pub fn serialization(file_name: &str) -> Option<(&'static str, &str)> {
    let lower = file_name.to_ascii_lowercase();
    for (ext, mime) in [
        (".tar.gz", "application/gzip"),
        (".tgz", "application/gzip"),
        (".tar", "application/tar"),
        (".zip", "application/zip"),
    ] {
        if lower.ends_with(ext) && lower.len() > ext.len() {
            return Some((mime, &file_name[..file_name.len() - ext.len()]));
        }
    }
    None
}

/// Where the bag is once its serialization `file_name` was unpacked into `unpacked`: the one
/// folder there, which must be named like the serialization (APTrust's rule).
pub fn bag_folder(unpacked: &Path, file_name: &str) -> Result<(PathBuf, String), String> {
    let (_, name) = serialization(file_name)
        .ok_or_else(|| format!("bag {file_name:?}: a bag is a .tar, .tar.gz, .tgz or .zip file"))?;
    let mut entries: Vec<String> = std::fs::read_dir(unpacked)
        .map_err(|e| format!("bag {file_name}: {e}"))?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    match entries.as_slice() {
        [one] if one == name && unpacked.join(one).is_dir() => {
            Ok((unpacked.join(one), name.into()))
        }
        [one] if unpacked.join(one).is_dir() => Err(format!(
            "bag {file_name} unpacks to a folder named {one:?}, not {name:?}: a bag's \
             serialization must unpack to one folder named like the file"
        )),
        _ => Err(format!(
            "bag {file_name} unpacks to {} entries ({}), not one folder named {name:?}",
            entries.len(),
            entries
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Reads a tag file's `Label: value` lines (a value goes on over lines that start with a
/// space or tab). A line that is neither is a problem named with its number.
pub fn parse_tags(file: &str, text: &str) -> Result<Vec<Tag>, String> {
    let mut out: Vec<Tag> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() {
            continue;
        }
        if line.starts_with([' ', '\t']) {
            match out.last_mut() {
                Some(t) => {
                    t.value.push(' ');
                    t.value.push_str(line.trim());
                }
                None => return Err(format!("{file} line {}: a continuation with no tag", i + 1)),
            }
            continue;
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(format!("{file} line {}: not \"Label: value\"", i + 1));
        };
        if name.trim().is_empty() || name.chars().any(char::is_control) {
            return Err(format!("{file} line {}: no label", i + 1));
        }
        out.push(Tag {
            file: file.to_string(),
            name: name.trim().to_string(),
            value: value.trim().to_string(),
        });
    }
    Ok(out)
}

fn read_text(p: &Path, max: u64) -> std::io::Result<String> {
    let mut b = Vec::new();
    std::fs::File::open(p)?.take(max + 1).read_to_end(&mut b)?;
    if b.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {max} bytes"),
        ));
    }
    let b = b.strip_prefix(b"\xef\xbb\xbf").unwrap_or(&b);
    String::from_utf8(b.to_vec())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8"))
}

/// RFC 8493's escapes in a manifest's file path: `%0A`, `%0D` and `%25`.
pub(crate) fn decode_path(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    let mut rest = p;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 3).map(str::to_ascii_uppercase);
        match code.as_deref() {
            Some("0A") => out.push('\n'),
            Some("0D") => out.push('\r'),
            Some("25") => out.push('%'),
            _ => {
                out.push('%');
                rest = &rest[i + 1..];
                continue;
            }
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    out
}

/// A manifest: path → digest, read line by line, each line bounded.
fn read_manifest(
    p: &Path,
    file: &str,
    alg: HashAlg,
    max_lines: u64,
    payload: bool,
    problems: &mut Vec<String>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let f = match std::fs::File::open(p) {
        Ok(f) => f,
        Err(e) => {
            problems.push(format!("{file}: {e}"));
            return out;
        }
    };
    let mut r = std::io::BufReader::new(f);
    let mut line = Vec::new();
    let mut n = 0u64;
    loop {
        line.clear();
        match r
            .by_ref()
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
        {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                problems.push(format!("{file}: {e}"));
                break;
            }
        }
        n += 1;
        if line.len() > MAX_LINE {
            problems.push(format!("{file} line {n}: longer than {MAX_LINE} bytes"));
            break;
        }
        if n > max_lines {
            problems.push(format!(
                "{file}: more than {max_lines} lines (payload.max_unpacked_entries)"
            ));
            break;
        }
        let Ok(text) = std::str::from_utf8(&line) else {
            problems.push(format!("{file} line {n}: not UTF-8"));
            continue;
        };
        let text = text.trim_end_matches(['\n', '\r']);
        if text.trim().is_empty() {
            continue;
        }
        let Some((digest, path)) = text.split_once([' ', '\t']) else {
            problems.push(format!("{file} line {n}: not \"DIGEST PATH\""));
            continue;
        };
        let path = decode_path(path.trim_start_matches([' ', '\t']));
        let digest = digest.to_ascii_lowercase();
        if digest.len() != alg.hex_len() || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
            problems.push(format!(
                "{file} line {n}: {digest:?} is not a {} digest",
                alg.name()
            ));
            continue;
        }
        if let Err(why) = check_name(&path) {
            problems.push(format!("{file} line {n}: {why}"));
            continue;
        }
        if payload != path.starts_with("data/") {
            problems.push(if payload {
                format!("{file} line {n}: {path:?} is not in the payload (data/)")
            } else {
                format!("{file} line {n}: {path:?} is a payload file, not a tag file")
            });
            continue;
        }
        if out.insert(path.clone(), digest).is_some() {
            problems.push(format!("{file} line {n}: {path:?} is listed twice"));
        }
    }
    out
}

/// A name inside the bag, or why it would escape it.
fn check_name(path: &str) -> Result<(), String> {
    if path.chars().any(char::is_control) {
        return Err(format!("{path:?} has control characters"));
    }
    check_relative_path(path)
        .map_err(|_| format!("{path:?} escapes the bag (absolute, '..', empty parts or NUL)"))
}

/// One line of a bag's `fetch.txt` (RFC 8493 §2.2.3): a payload file the bag holds by
/// reference, to be fetched from `url` before the bag is complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchLine {
    pub url: String,
    /// Its size in bytes, when the line gives one (`-` when not).
    pub length: Option<u64>,
    /// Where it goes in the bag: `data/…`.
    pub path: String,
}

/// The lines of the `fetch.txt` in `dir` (at most `max_entries`), each naming a payload file
/// inside the bag once; every bad line is named, with its number.
pub fn read_fetch(dir: &Path, max_entries: u64) -> Result<Vec<FetchLine>, Vec<String>> {
    let text = read_text(&dir.join("fetch.txt"), MAX_TAG_FILE)
        .map_err(|e| vec![format!("fetch.txt: {e}")])?;
    let mut out: Vec<FetchLine> = Vec::new();
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        if out.len() as u64 >= max_entries {
            problems.push(format!(
                "fetch.txt lists more than {max_entries} files (payload.max_unpacked_entries)"
            ));
            break;
        }
        let ws = |c: char| c == ' ' || c == '\t';
        let mut rest = line.trim_start_matches(ws);
        let mut field = || {
            let (f, r) = rest.split_once(ws).unwrap_or((rest, ""));
            rest = r.trim_start_matches(ws);
            f
        };
        let (url, length) = (field(), field());
        let path = decode_path(rest.trim_end_matches('\r'));
        if url.is_empty() || length.is_empty() || path.is_empty() {
            problems.push(format!(
                "fetch.txt line {n}: not URL LENGTH FILENAME: {line:?}"
            ));
            continue;
        }
        let length = match length {
            "-" => None,
            l => match l.parse::<u64>() {
                Ok(v) => Some(v),
                Err(_) => {
                    problems.push(format!(
                        "fetch.txt line {n}: the length {l:?} is neither a number nor -"
                    ));
                    continue;
                }
            },
        };
        if let Err(why) = check_name(&path) {
            problems.push(format!("fetch.txt line {n}: {why}"));
            continue;
        }
        if !path.starts_with("data/") {
            problems.push(format!(
                "fetch.txt line {n}: {path:?} is not a payload file (under data/)"
            ));
            continue;
        }
        if !seen.insert(path.clone()) {
            problems.push(format!("fetch.txt line {n}: {path:?} is listed twice"));
            continue;
        }
        out.push(FetchLine {
            url: url.to_string(),
            length,
            path,
        });
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// Every file under `dir`, relative and `/`-separated, with its size; anything that is
/// neither a file nor a folder is a problem.
fn walk(dir: &Path, problems: &mut Vec<String>) -> std::io::Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let t = e.file_type()?;
            let rel = e
                .path()
                .strip_prefix(dir)
                .map_err(std::io::Error::other)?
                .to_string_lossy()
                .replace('\\', "/");
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                if let Err(why) = check_name(&rel) {
                    problems.push(why);
                }
                out.insert(rel, e.metadata()?.len());
            } else {
                problems.push(format!("{rel:?} is not a regular file"));
            }
        }
    }
    Ok(out)
}

/// Each file's digests for the algorithms asked, every file read once, on up to two threads.
fn digests(
    dir: &Path,
    wanted: &BTreeMap<String, Vec<HashAlg>>,
) -> BTreeMap<String, Result<Vec<(HashAlg, String)>, String>> {
    let jobs: Vec<(&String, &Vec<HashAlg>)> = wanted.iter().collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(BTreeMap::new());
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 2);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((path, algs)) = jobs.get(i) else {
                        break;
                    };
                    let r = hash_file(&dir.join(path), algs, &mut buf).map_err(|e| e.to_string());
                    results
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert((*path).clone(), r);
                }
            });
        }
    });
    results.into_inner().unwrap_or_else(|e| e.into_inner())
}

fn hash_file(
    p: &Path,
    algs: &[HashAlg],
    buf: &mut [u8],
) -> std::io::Result<Vec<(HashAlg, String)>> {
    if algs.is_empty() {
        return Ok(Vec::new());
    }
    let mut hashers: Vec<(HashAlg, Hasher)> = algs.iter().map(|a| (*a, Hasher::new(*a))).collect();
    let mut f = std::fs::File::open(p)?;
    loop {
        let n = f.read(buf)?;
        if n == 0 {
            break;
        }
        for (_, h) in &mut hashers {
            h.update(&buf[..n]);
        }
    }
    Ok(hashers.into_iter().map(|(a, h)| (a, h.hex())).collect())
}

/// The manifests of one kind (`manifest` or `tagmanifest`) at the bag's top.
fn manifests_of(files: &BTreeMap<String, u64>, prefix: &str) -> Vec<(String, String)> {
    files
        .keys()
        .filter(|f| !f.contains('/'))
        .filter_map(|f| {
            let alg = f
                .strip_prefix(prefix)?
                .strip_prefix('-')?
                .strip_suffix(".txt")?;
            Some((f.clone(), alg.to_ascii_lowercase()))
        })
        .collect()
}

/// The profile a bag is held to: the one it names, else the first (APTrust's rule).
fn pick_profile(named: Option<&str>, profiles: &[Arc<BagProfile>]) -> Arc<BagProfile> {
    named
        .and_then(|id| profiles.iter().find(|p| p.identifier == id))
        .or(profiles.first())
        .cloned()
        .unwrap_or_else(|| Arc::new(BagProfile::lading_default()))
}

/// What the bag in `dir` asks to be fetched, when its profile allows it (`Ok(None)`: no
/// `fetch.txt`, or one its profile refuses, which [`validate`] names).
pub fn to_fetch(
    dir: &Path,
    profiles: &[Arc<BagProfile>],
    max_entries: u64,
) -> Result<Option<Vec<FetchLine>>, Vec<String>> {
    if !dir.join("fetch.txt").is_file() {
        return Ok(None);
    }
    let info = match read_text(&dir.join("bag-info.txt"), MAX_TAG_FILE) {
        Ok(t) => parse_tags("bag-info.txt", &t).unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    let named = info
        .iter()
        .find(|t| t.name.eq_ignore_ascii_case("BagIt-Profile-Identifier"))
        .map(|t| t.value.as_str());
    if !pick_profile(named, profiles).allow_fetch {
        return Ok(None);
    }
    read_fetch(dir, max_entries).map(Some)
}

/// Validates the bag in `dir` (named `name`, serialized as `mime`) against RFC 8493 and the
/// profile it names among `profiles` (else the first; none: RFC 8493 alone). `max_entries`
/// bounds each manifest's lines. Returns the bag, or every problem found, one per line.
pub fn validate(
    dir: &Path,
    name: &str,
    mime: &str,
    profiles: &[Arc<BagProfile>],
    max_entries: u64,
) -> Result<Bag, Vec<String>> {
    let mut problems = Vec::new();
    let files = match walk(dir, &mut problems) {
        Ok(f) => f,
        Err(e) => return Err(vec![format!("reading the bag: {e}")]),
    };
    let (mut tags, version, profile, shown) = read_tags(dir, &files, profiles, &mut problems)?;
    if !files.keys().any(|f| f.starts_with("data/")) && !dir.join("data").is_dir() {
        problems.push("no data/ folder (the payload)".into());
    }
    // Manifests, each read once, bounded.
    let mut wanted: BTreeMap<String, Vec<HashAlg>> = BTreeMap::new();
    let mut read_all = |prefix: &str, payload: bool, problems: &mut Vec<String>| {
        let mut out = Vec::new();
        for (file, alg_name) in manifests_of(&files, prefix) {
            let Some(alg) =
                HashAlg::parse(&alg_name).filter(|_| ALGORITHMS.contains(&alg_name.as_str()))
            else {
                problems.push(format!(
                    "{file}: Lading cannot compute {alg_name} (it computes {})",
                    ALGORITHMS.join(", ")
                ));
                continue;
            };
            let entries =
                read_manifest(&dir.join(&file), &file, alg, max_entries, payload, problems);
            for path in entries.keys() {
                if files.contains_key(path) {
                    wanted.entry(path.clone()).or_default().push(alg);
                }
            }
            out.push((file, alg, entries));
        }
        out
    };
    let payload_manifests = read_all("manifest", true, &mut problems);
    let tag_manifests = read_all("tagmanifest", false, &mut problems);
    if payload_manifests.is_empty() {
        problems.push("no payload manifest (manifest-ALGORITHM.txt)".into());
    }
    let payload: Vec<(&String, &u64)> = files
        .iter()
        .filter(|(f, _)| f.starts_with("data/"))
        .collect();
    // Every payload file is read once for all its manifests' algorithms.
    for (f, _) in &payload {
        wanted.entry((*f).clone()).or_default();
    }
    let found = digests(dir, &wanted);
    let check =
        |manifests: &[(String, HashAlg, BTreeMap<String, String>)], problems: &mut Vec<String>| {
            for (file, alg, entries) in manifests {
                for (path, expected) in entries {
                    match found.get(path) {
                        None => problems
                            .push(format!("{path} is listed in {file} but is not in the bag")),
                        Some(Err(e)) => problems.push(format!("{path}: {e}")),
                        Some(Ok(d)) => {
                            if let Some((_, got)) = d.iter().find(|(a, _)| a == alg)
                                && got != expected
                            {
                                problems.push(format!(
                                    "{path}: {} in {file} is {expected}, the file's is {got}",
                                    alg.name()
                                ));
                            }
                        }
                    }
                }
            }
        };
    check(&payload_manifests, &mut problems);
    check(&tag_manifests, &mut problems);
    // Both ways: every payload file in every payload manifest.
    for (file, _, entries) in &payload_manifests {
        for (path, _) in &payload {
            if !entries.contains_key(*path) {
                problems.push(format!("{path} is in the payload but not in {file}"));
            }
        }
    }
    let bytes: u64 = payload.iter().map(|(_, s)| **s).sum();
    let count = payload.len() as u64;
    check_oxum(&tags, bytes, count, &mut problems);
    if files.contains_key("fetch.txt") {
        check_fetched(dir, &files, &profile, &shown, max_entries, &mut problems);
    }
    let payload_algorithms: Vec<String> = payload_manifests
        .iter()
        .map(|(_, a, _)| a.name().to_string())
        .collect();
    let tag_algorithms: Vec<String> = tag_manifests
        .iter()
        .map(|(_, a, _)| a.name().to_string())
        .collect();
    let profile_rules = ProfileCheck {
        profile: &profile,
        shown: &shown,
        files: &files,
    };
    profile_rules.check(
        &version,
        mime,
        [&payload_algorithms, &tag_algorithms],
        &mut tags,
        &mut problems,
    );
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Bag {
        name: name.to_string(),
        dir: dir.to_path_buf(),
        version,
        profile,
        payload_algorithms,
        tag_algorithms,
        tags,
        payload_files: count,
        payload_bytes: bytes,
    })
}

/// The value of tag `tag` of tag file `file` (names compared without case).
fn find_tag(tags: &[Tag], file: &str, tag: &str) -> Option<String> {
    tags.iter()
        .find(|t| t.file == file && t.name.eq_ignore_ascii_case(tag))
        .map(|t| t.value.clone())
}

/// The bag's tags (`bagit.txt`, `bag-info.txt` and the tag files its profile names), its
/// BagIt version, the profile it names among `profiles` and how to name that profile.
/// Without a readable `bagit.txt` this is no bag: that alone is the answer.
#[allow(clippy::type_complexity)]
fn read_tags(
    dir: &Path,
    files: &BTreeMap<String, u64>,
    profiles: &[Arc<BagProfile>],
    problems: &mut Vec<String>,
) -> Result<(Vec<Tag>, String, Arc<BagProfile>, String), Vec<String>> {
    // bagit.txt: without it this is no bag, and nothing else can be said.
    let bagit = match read_text(&dir.join("bagit.txt"), 64 << 10) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(vec!["bagit.txt is missing: this is not a bag".into()]);
        }
        Err(e) => return Err(vec![format!("bagit.txt: {e}")]),
    };
    let mut tags = match parse_tags("bagit.txt", &bagit) {
        Ok(t) => t,
        Err(e) => return Err(vec![e]),
    };
    let version = find_tag(&tags, "bagit.txt", "BagIt-Version").unwrap_or_default();
    if version.is_empty() {
        problems.push("bagit.txt: no BagIt-Version".into());
    }
    match find_tag(&tags, "bagit.txt", "Tag-File-Character-Encoding") {
        Some(enc) if enc.eq_ignore_ascii_case("UTF-8") => {}
        Some(enc) => problems.push(format!(
            "bagit.txt: Tag-File-Character-Encoding is {enc:?}; Lading reads UTF-8 tag files"
        )),
        None => problems.push("bagit.txt: no Tag-File-Character-Encoding".into()),
    }
    if files.contains_key("bag-info.txt") {
        match read_text(&dir.join("bag-info.txt"), MAX_TAG_FILE) {
            Ok(t) => match parse_tags("bag-info.txt", &t) {
                Ok(t) => tags.extend(t),
                Err(e) => problems.push(e),
            },
            Err(e) => problems.push(format!("bag-info.txt: {e}")),
        }
    }
    let named = find_tag(&tags, "bag-info.txt", "BagIt-Profile-Identifier");
    let profile = pick_profile(named.as_deref(), profiles);
    let shown = if profile.file.is_empty() {
        profile.identifier.clone()
    } else {
        profile.file.clone()
    };
    // Tag files the profile names are read as tags too.
    let mut read: BTreeSet<String> = ["bagit.txt".to_string(), "bag-info.txt".into()].into();
    for rule in &profile.tags {
        if read.insert(rule.file.clone()) && files.contains_key(&rule.file) {
            match read_text(&dir.join(&rule.file), MAX_TAG_FILE) {
                Ok(t) => match parse_tags(&rule.file, &t) {
                    Ok(t) => tags.extend(t),
                    Err(e) => problems.push(e),
                },
                Err(e) => problems.push(format!("{}: {e}", rule.file)),
            }
        }
    }
    Ok((tags, version, profile, shown))
}

/// `Payload-Oxum`, when given, says the payload's bytes and files.
fn check_oxum(tags: &[Tag], bytes: u64, count: u64, problems: &mut Vec<String>) {
    if let Some(oxum) = find_tag(tags, "bag-info.txt", "Payload-Oxum") {
        let parsed = oxum.split_once('.').and_then(|(b, c)| {
            Some((b.trim().parse::<u64>().ok()?, c.trim().parse::<u64>().ok()?))
        });
        match parsed {
            Some((b, c)) if b == bytes && c == count => {}
            Some((b, c)) => problems.push(format!(
                "bag-info.txt: Payload-Oxum is {b}.{c} ({b} bytes in {c} files), the payload \
                 holds {bytes}.{count}"
            )),
            None => problems.push(format!(
                "bag-info.txt: Payload-Oxum {oxum:?} is not OCTETS.COUNT"
            )),
        }
    }
}

/// `fetch.txt` is allowed by the profile, and what it lists was fetched (Processing fetches
/// before validating): each listed file is there now, of the length listed; the manifests
/// checked its digests.
fn check_fetched(
    dir: &Path,
    files: &BTreeMap<String, u64>,
    profile: &BagProfile,
    shown: &str,
    max_entries: u64,
    problems: &mut Vec<String>,
) {
    if !profile.allow_fetch {
        problems.push(format!(
            "fetch.txt is present but the BagIt profile {shown} does not allow it"
        ));
    } else {
        // Fetched before validation (Processing does): each listed file is there now,
        // of the length listed, and the manifests above checked its digests.
        match read_fetch(dir, max_entries) {
            Ok(lines) => {
                for l in lines {
                    match (files.get(&l.path), l.length) {
                        (None, _) => problems.push(format!(
                            "fetch.txt lists {}, which is not in the bag (not fetched)",
                            l.path
                        )),
                        (Some(&got), Some(want)) if got != want => problems.push(format!(
                            "fetch.txt says {} is {want} bytes; the bag's is {got}",
                            l.path
                        )),
                        _ => {}
                    }
                }
            }
            Err(p) => problems.extend(p),
        }
    }
}

/// A bag's profile, to check the bag's rules against.
struct ProfileCheck<'a> {
    profile: &'a BagProfile,
    /// How the profile is named in a problem (its file, else its identifier).
    shown: &'a str,
    files: &'a BTreeMap<String, u64>,
}

impl ProfileCheck<'_> {
    /// The profile's rules: the BagIt version, the serialization, the manifests' algorithms
    /// (`algorithms`: the payload's, the tag manifests'), the tag files and the tags (a
    /// required tag missing takes the profile's default, when it has one).
    fn check(
        &self,
        version: &str,
        mime: &str,
        algorithms: [&Vec<String>; 2],
        tags: &mut Vec<Tag>,
        problems: &mut Vec<String>,
    ) {
        let (profile, shown, files) = (self.profile, self.shown, self.files);
        let accepted = if profile.accept_versions.is_empty() {
            vec!["0.97".to_string(), "1.0".into()]
        } else {
            profile.accept_versions.clone()
        };
        if !version.is_empty() && !accepted.iter().any(|a| a == version) {
            problems.push(format!(
                "bagit.txt: BagIt-Version {version} is not one of {} (BagIt profile {shown})",
                accepted.join(", ")
            ));
        }
        if !profile.takes_serialization(mime) {
            problems.push(format!(
                "the bag is serialized as {mime}; BagIt profile {shown} takes {}",
                profile.accept_serialization.join(", ")
            ));
        }
        for (kind, have, required, allowed) in [
            (
                "manifest",
                algorithms[0],
                &profile.manifests_required,
                &profile.manifests_allowed,
            ),
            (
                "tagmanifest",
                algorithms[1],
                &profile.tag_manifests_required,
                &profile.tag_manifests_allowed,
            ),
        ] {
            for r in required {
                if !have.contains(r) {
                    problems.push(format!(
                        "{kind}-{r}.txt is missing: BagIt profile {shown} requires it"
                    ));
                }
            }
            for h in have {
                if !allowed.is_empty() && !allowed.contains(h) {
                    problems.push(format!(
                        "{kind}-{h}.txt: BagIt profile {shown} allows only {}",
                        allowed.join(", ")
                    ));
                }
            }
        }
        for f in &profile.tag_files_required {
            if !files.contains_key(f) {
                problems.push(format!(
                    "tag file {f} is missing: BagIt profile {shown} requires it"
                ));
            }
        }
        for rule in &profile.tags {
            let value = find_tag(tags, &rule.file, &rule.name);
            match value {
                None if rule.required => match &rule.default {
                    Some(d) => tags.push(Tag {
                        file: rule.file.clone(),
                        name: rule.name.clone(),
                        value: d.clone(),
                    }),
                    None => problems.push(format!(
                        "{}: tag {} is missing: BagIt profile {shown} requires it",
                        rule.file, rule.name
                    )),
                },
                None => {}
                Some(v) if v.is_empty() && rule.required && !rule.empty_ok => {
                    problems.push(format!(
                        "{}: tag {} is empty: BagIt profile {shown} requires a value",
                        rule.file, rule.name
                    ))
                }
                Some(v)
                    if !v.is_empty() && !rule.values.is_empty() && !rule.values.contains(&v) =>
                {
                    problems.push(format!(
                        "{}: tag {} is {v:?}, not one of {} (BagIt profile {shown})",
                        rule.file,
                        rule.name,
                        rule.values.join(", ")
                    ))
                }
                Some(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_tags_and_escapes() {
        assert_eq!(serialization("b1.tar.gz"), Some(("application/gzip", "b1")));
        assert_eq!(serialization("B.ZIP"), Some(("application/zip", "B")));
        assert_eq!(serialization(".tar"), None);
        assert_eq!(decode_path("data/a%0Ab%25c%zz"), "data/a\nb%c%zz");
        let t = parse_tags(
            "bag-info.txt",
            "Title: One\n  and two\nAccess: Institution\n",
        )
        .unwrap();
        assert_eq!(t[0].value, "One and two");
        assert_eq!(t[1].name, "Access");
        assert!(
            parse_tags("x.txt", "no colon here")
                .unwrap_err()
                .contains("line 1")
        );
        assert!(check_name("data/../../etc/passwd").is_err());
        assert!(check_name("/etc/passwd").is_err());
        assert!(check_name("data/a\u{1}b").is_err());
        assert!(check_name("data/ok name.txt").is_ok());
    }
}
