//! Checkm 0.7 manifests, as Merritt writes them: a `#%checkm_0.7` header, a `#%profile`
//! naming the manifest kind, `#%prefix` declarations, a `#%fields` line, rows of
//! `|`-separated values, and `#%eof`. Anything malformed is reported with its line number and
//! the reason, so a depositor can fix the file; nothing is guessed.

use std::collections::BTreeMap;

/// The kinds of manifest, by the last segment of their `#%profile` URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestKind {
    /// `mrt-ingest-manifest`: the files of one object.
    Object,
    /// `mrt-batch-manifest`: one object manifest per row (a manifest of manifests).
    Batch,
    /// `mrt-single-file-batch-manifest`: one single-file object per row.
    SingleFileBatch,
    /// `mrt-container-batch-manifest`: one container (zip/tar) object per row.
    ContainerBatch,
}

impl ManifestKind {
    pub fn profile_name(self) -> &'static str {
        match self {
            ManifestKind::Object => "mrt-ingest-manifest",
            ManifestKind::Batch => "mrt-batch-manifest",
            ManifestKind::SingleFileBatch => "mrt-single-file-batch-manifest",
            ManifestKind::ContainerBatch => "mrt-container-batch-manifest",
        }
    }

    fn from_profile(url: &str) -> Option<ManifestKind> {
        let last = url.trim_end_matches('/').rsplit('/').next()?;
        [
            ManifestKind::Object,
            ManifestKind::Batch,
            ManifestKind::SingleFileBatch,
            ManifestKind::ContainerBatch,
        ]
        .into_iter()
        .find(|k| k.profile_name() == last)
    }

    /// The profile URL Merritt uses for this kind.
    pub fn profile_url(self) -> String {
        format!(
            "http://uc3.cdlib.org/registry/ingest/manifest/{}",
            self.profile_name()
        )
    }
}

/// A digest algorithm checkm names in `nfo:hashAlgorithm`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum HashAlg {
    Md5,
    Sha1,
    Sha256,
    Sha512,
}

impl HashAlg {
    pub fn parse(s: &str) -> Option<HashAlg> {
        match s.to_ascii_lowercase().replace('-', "").as_str() {
            "md5" => Some(HashAlg::Md5),
            "sha1" => Some(HashAlg::Sha1),
            "sha256" => Some(HashAlg::Sha256),
            "sha512" => Some(HashAlg::Sha512),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            HashAlg::Md5 => "md5",
            HashAlg::Sha1 => "sha1",
            HashAlg::Sha256 => "sha256",
            HashAlg::Sha512 => "sha512",
        }
    }

    /// Length of the digest in hex digits.
    pub fn hex_len(self) -> usize {
        match self {
            HashAlg::Md5 => 32,
            HashAlg::Sha1 => 40,
            HashAlg::Sha256 => 64,
            HashAlg::Sha512 => 128,
        }
    }
}

/// An expected digest.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Digest {
    pub alg: HashAlg,
    /// Lower-case hex.
    pub hex: String,
}

/// A malformed manifest: where and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("manifest line {line}: {reason}")]
pub struct ManifestError {
    pub line: usize,
    pub reason: String,
}

fn bad(line: usize, reason: impl Into<String>) -> ManifestError {
    ManifestError {
        line,
        reason: reason.into(),
    }
}

/// One row: its line number and its values by field name (`nfo:fileUrl`, `mrt:title`, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub line: usize,
    pub values: BTreeMap<String, String>,
}

impl Row {
    /// A non-empty value.
    pub fn get(&self, field: &str) -> Option<&str> {
        self.values
            .get(field)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// A parsed manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub kind: ManifestKind,
    pub fields: Vec<String>,
    pub rows: Vec<Row>,
}

/// One file a row names, checked.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileEntry {
    pub url: String,
    /// Relative path inside the object, no `..`, not absolute.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<Digest>,
}

pub const FILE_URL: &str = "nfo:fileUrl";
pub const HASH_ALG: &str = "nfo:hashAlgorithm";
pub const HASH_VALUE: &str = "nfo:hashValue";
pub const FILE_SIZE: &str = "nfo:fileSize";
pub const FILE_NAME: &str = "nfo:fileName";
pub const PRIMARY_ID: &str = "mrt:primaryIdentifier";
pub const LOCAL_ID: &str = "mrt:localIdentifier";
pub const CREATOR: &str = "mrt:creator";
pub const TITLE: &str = "mrt:title";
pub const DATE: &str = "mrt:date";

/// The fields of the object manifests Lading writes: one file per row, with its digest.
pub const OBJECT_FIELDS: &[&str] = &[FILE_URL, HASH_ALG, HASH_VALUE, FILE_SIZE, FILE_NAME];

/// Bounds on one manifest; exceeding one is an error naming it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_rows: usize,
    pub max_fields: usize,
    pub max_prefixes: usize,
    pub max_line_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        let d = crate::config::PayloadSettings::default();
        Limits::from(&d)
    }
}

impl From<&crate::config::PayloadSettings> for Limits {
    fn from(p: &crate::config::PayloadSettings) -> Limits {
        Limits {
            max_rows: p.max_rows,
            max_fields: p.max_fields,
            max_prefixes: p.max_prefixes,
            max_line_bytes: p.max_line_bytes,
        }
    }
}

/// Parses a checkm 0.7 manifest within the default [`Limits`].
pub fn parse(text: &str) -> Result<Manifest, ManifestError> {
    parse_within(text, &Limits::default())
}

/// Parses a checkm 0.7 manifest within `limits`, in time linear in its length.
pub fn parse_within(text: &str, limits: &Limits) -> Result<Manifest, ManifestError> {
    parse_at(text, limits, None)
}

/// [`parse_within`] for a manifest fetched from `base`: a row's `nfo:fileUrl` may then be
/// relative (`files/a.txt`: no scheme, no leading `/`, no `..`), and is read as the file of
/// that name beside the manifest (an extension to checkm, whose URLs are absolute). Rows
/// come out with absolute URLs, so every later check sees the URL that is fetched.
pub fn parse_at(
    text: &str,
    limits: &Limits,
    base: Option<&str>,
) -> Result<Manifest, ManifestError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut header_seen = false;
    let mut kind = None;
    let mut fields: Option<Vec<String>> = None;
    let mut prefixes: std::collections::HashSet<String> = Default::default();
    let mut rows = Vec::new();
    let mut eof_line = None;
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        if raw.len() > limits.max_line_bytes {
            return Err(bad(
                n,
                format!(
                    "the line is {} bytes, over the limit of {} (payload.max_line_bytes)",
                    raw.len(),
                    limits.max_line_bytes
                ),
            ));
        }
        let line = raw.trim_end_matches('\r').trim();
        if line.is_empty() {
            continue;
        }
        if let Some(at) = eof_line {
            return Err(bad(n, format!("content after #%eof on line {at}")));
        }
        if !header_seen {
            if !line.eq_ignore_ascii_case("#%checkm_0.7") {
                return Err(bad(
                    n,
                    format!("expected the header #%checkm_0.7, found {line:?}"),
                ));
            }
            header_seen = true;
            continue;
        }
        if let Some(directive) = line.strip_prefix("#%") {
            let mut parts: Vec<&str> = directive.split('|').map(str::trim).collect();
            // Merritt's own client separates a directive's name from its first value by a
            // space (`#%profile http://…`), not a `|`.
            if let Some((name, rest)) = parts[0].split_once(char::is_whitespace) {
                let rest = rest.trim();
                parts[0] = name;
                if !rest.is_empty() {
                    parts.insert(1, rest);
                }
            }
            match parts[0].to_ascii_lowercase().as_str() {
                "profile" => {
                    let url = parts
                        .get(1)
                        .filter(|u| !u.is_empty())
                        .ok_or_else(|| bad(n, "#%profile names no profile"))?;
                    kind = Some(ManifestKind::from_profile(url).ok_or_else(|| {
                        bad(
                            n,
                            format!(
                                "unknown manifest profile {url:?} (expected one ending in \
                                 mrt-ingest-manifest, mrt-batch-manifest, \
                                 mrt-single-file-batch-manifest or mrt-container-batch-manifest)"
                            ),
                        )
                    })?);
                }
                "prefix" => {
                    let p = parts
                        .get(1)
                        .filter(|p| p.ends_with(':') && p.len() > 1)
                        .ok_or_else(|| bad(n, "#%prefix needs a name ending in ':'"))?;
                    if parts.get(2).is_none_or(|u| u.is_empty()) {
                        return Err(bad(n, format!("#%prefix {p} names no URI")));
                    }
                    if prefixes.len() >= limits.max_prefixes {
                        return Err(bad(
                            n,
                            format!(
                                "more than {} #%prefix lines (payload.max_prefixes)",
                                limits.max_prefixes
                            ),
                        ));
                    }
                    prefixes.insert(p.trim_end_matches(':').to_string());
                }
                "fields" => fields = Some(declared_fields(n, &parts, &prefixes, limits)?),
                "eof" => eof_line = Some(n),
                other => return Err(bad(n, format!("unknown directive #%{other}"))),
            }
            continue;
        }
        if line.starts_with('#') {
            continue; // a comment
        }
        let Some(kind) = kind else {
            return Err(bad(n, "a row before #%profile"));
        };
        let _ = kind;
        let Some(fields) = fields.as_ref() else {
            return Err(bad(n, "a row before #%fields"));
        };
        let row = row_of(n, line, fields, base)?;
        check_row(&row)?;
        if rows.len() >= limits.max_rows {
            return Err(bad(
                n,
                format!("more than {} rows (payload.max_rows)", limits.max_rows),
            ));
        }
        rows.push(row);
    }
    if !header_seen {
        return Err(bad(1, "empty manifest (no #%checkm_0.7 header)"));
    }
    let kind = kind.ok_or_else(|| bad(1, "no #%profile line"))?;
    if eof_line.is_none() {
        let last = text.lines().count();
        return Err(bad(
            last + 1,
            "missing #%eof: the manifest is truncated or incomplete",
        ));
    }
    Ok(Manifest {
        kind,
        fields: fields.unwrap_or_default(),
        rows,
    })
}

/// The fields a `#%fields` directive on line `n` declares (`parts`: its name and values):
/// within the limit, none empty, `nfo:fileUrl` among them, each prefix declared.
fn declared_fields(
    n: usize,
    parts: &[&str],
    prefixes: &std::collections::HashSet<String>,
    limits: &Limits,
) -> Result<Vec<String>, ManifestError> {
    if parts.len() - 1 > limits.max_fields {
        return Err(bad(
            n,
            format!(
                "#%fields declares {} fields, over the limit of {} (payload.max_fields)",
                parts.len() - 1,
                limits.max_fields
            ),
        ));
    }
    let f: Vec<String> = parts[1..].iter().map(|s| s.to_string()).collect();
    if f.is_empty() || f.iter().any(String::is_empty) {
        return Err(bad(n, "#%fields has an empty field name"));
    }
    if !f.iter().any(|x| x == FILE_URL) {
        return Err(bad(n, format!("#%fields lacks {FILE_URL}")));
    }
    for name in &f {
        if let Some((p, _)) = name.split_once(':')
            && !prefixes.contains(p)
            && !matches!(p, "nfo" | "mrt")
        {
            return Err(bad(n, format!("field {name} uses undeclared prefix {p}:")));
        }
    }
    Ok(f)
}

/// Row `n` (`line`) under `fields`; a relative `nfo:fileUrl` resolved against `base`.
fn row_of(
    n: usize,
    line: &str,
    fields: &[String],
    base: Option<&str>,
) -> Result<Row, ManifestError> {
    let values: Vec<&str> = line.split('|').map(str::trim).collect();
    if values.len() > fields.len() {
        return Err(bad(
            n,
            format!(
                "{} values but #%fields declares {}",
                values.len(),
                fields.len()
            ),
        ));
    }
    let mut map = BTreeMap::new();
    for (k, v) in fields.iter().zip(values.iter()) {
        map.insert(k.clone(), v.to_string());
    }
    if let Some(base) = base
        && let Some(url) = map.get_mut(FILE_URL)
        && !url.is_empty()
        && !url.contains("://")
    {
        *url = resolve(base, url).map_err(|r| bad(n, r))?;
    }
    let row = Row {
        line: n,
        values: map,
    };
    Ok(row)
}

fn check_row(row: &Row) -> Result<(), ManifestError> {
    let n = row.line;
    let url = row
        .get(FILE_URL)
        .ok_or_else(|| bad(n, format!("{FILE_URL} is empty")))?;
    check_url(url).map_err(|r| bad(n, r))?;
    match (row.get(HASH_ALG), row.get(HASH_VALUE)) {
        (None, None) => {}
        (Some(a), Some(v)) => {
            let alg = HashAlg::parse(a).ok_or_else(|| {
                bad(
                    n,
                    format!("unsupported hash algorithm {a:?} (md5, sha1, sha256, sha512)"),
                )
            })?;
            if v.len() != alg.hex_len() || !v.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad(
                    n,
                    format!(
                        "{} digest {v:?} is not {} hex digits",
                        alg.name(),
                        alg.hex_len()
                    ),
                ));
            }
        }
        (Some(_), None) => return Err(bad(n, "a hash algorithm without a hash value")),
        (None, Some(_)) => return Err(bad(n, "a hash value without a hash algorithm")),
    }
    if let Some(s) = row.get(FILE_SIZE)
        && s.parse::<u64>().is_err()
    {
        return Err(bad(
            n,
            format!("file size {s:?} is not a whole number of bytes"),
        ));
    }
    if let Some(name) = row.get(FILE_NAME) {
        check_relative_path(name).map_err(|r| bad(n, r))?;
    }
    Ok(())
}

/// `rel` (a relative URL: no scheme, no leading `/`, no `.` or `..` part, no query) as the
/// file beside the manifest at `base`.
pub fn resolve(base: &str, rel: &str) -> Result<String, String> {
    let path = rel.split(['?', '#']).next().unwrap_or_default();
    if rel.contains(['?', '#']) || rel.starts_with('/') || path.contains('\\') {
        return Err(format!(
            "{rel:?} is neither an absolute URL nor a plain relative path"
        ));
    }
    if path
        .split('/')
        .any(|p| p.is_empty() || p == "." || p == "..")
    {
        return Err(format!(
            "relative URL {rel:?} must name a file beside the manifest or below it (no '.', \
             '..' or empty parts)"
        ));
    }
    let base = base.split(['?', '#']).next().unwrap_or_default();
    let Some(scheme_end) = base.find("://") else {
        return Err(format!("relative URL {rel:?} in a manifest without a URL"));
    };
    let after = &base[scheme_end + 3..];
    let folder = match after.rfind('/') {
        Some(i) => base[..scheme_end + 3 + i + 1].to_string(),
        // `https://host` has no path: the file is at the root.
        None => format!("{base}/"),
    };
    Ok(format!("{folder}{rel}"))
}

/// URLs a payload may come from.
pub fn check_url(url: &str) -> Result<(), String> {
    let ok = ["http://", "https://", "file://"]
        .iter()
        .any(|s| url.len() > s.len() && url[..s.len()].eq_ignore_ascii_case(s));
    if ok {
        Ok(())
    } else {
        Err(format!("{url:?} is not an http, https or file URL"))
    }
}

/// A path inside an object: relative, no `..`, no empty segments, no NUL.
pub fn check_relative_path(name: &str) -> Result<(), String> {
    let bad_seg = name
        .split('/')
        .any(|s| s.is_empty() || s == "." || s == ".." || s.contains('\\'));
    if name.starts_with('/') || bad_seg || name.contains('\0') {
        return Err(format!(
            "file name {name:?} must be a relative path without '..' or empty parts"
        ));
    }
    Ok(())
}

/// The last path segment of a URL, percent-decoding left alone.
pub fn url_file_name(url: &str) -> Option<String> {
    let path = url.split(['?', '#']).next()?;
    let after_scheme = path.split_once("://").map_or(path, |(_, r)| r);
    let (_, p) = after_scheme.split_once('/')?;
    p.rsplit('/')
        .next()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

impl Row {
    /// The file this row names: its name is `nfo:fileName`, else the URL's last segment.
    pub fn file_entry(&self) -> Result<FileEntry, ManifestError> {
        let url = self.get(FILE_URL).unwrap_or_default().to_string();
        let name = match self.get(FILE_NAME) {
            Some(n) => n.to_string(),
            None => url_file_name(&url).ok_or_else(|| {
                bad(
                    self.line,
                    format!("no {FILE_NAME} and no file name in URL {url:?}"),
                )
            })?,
        };
        check_relative_path(&name).map_err(|r| bad(self.line, r))?;
        let digest = match (self.get(HASH_ALG), self.get(HASH_VALUE)) {
            (Some(a), Some(v)) => HashAlg::parse(a).map(|alg| Digest {
                alg,
                hex: v.to_ascii_lowercase(),
            }),
            _ => None,
        };
        Ok(FileEntry {
            url,
            name,
            size: self.get(FILE_SIZE).and_then(|s| s.parse().ok()),
            digest,
        })
    }
}

/// Writes a manifest of `kind` with `fields` and `rows` (values in field order).
pub fn write(kind: ManifestKind, fields: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = String::from("#%checkm_0.7\n");
    s.push_str(&format!("#%profile | {}\n", kind.profile_url()));
    s.push_str("#%prefix | mrt: | http://merritt.cdlib.org/terms#\n");
    s.push_str("#%prefix | nfo: | http://www.semanticdesktop.org/ontologies/2007/03/22/nfo#\n");
    s.push_str(&format!("#%fields | {}\n", fields.join(" | ")));
    for r in rows {
        s.push_str(&r.join(" | "));
        s.push('\n');
    }
    s.push_str("#%eof\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_urls_name_files_beside_the_manifest() {
        assert_eq!(
            resolve("file:///srv/in/o.checkm", "a.txt").unwrap(),
            "file:///srv/in/a.txt"
        );
        assert_eq!(
            resolve("https://h.example/d/o.checkm?x=1", "sub/b.txt").unwrap(),
            "https://h.example/d/sub/b.txt"
        );
        assert_eq!(
            resolve("https://h.example", "b.txt").unwrap(),
            "https://h.example/b.txt"
        );
        for bad in [
            "../etc/passwd",
            "a/../../b",
            "/etc/passwd",
            "./a",
            "a//b",
            "a?b",
        ] {
            let e = resolve("file:///srv/in/o.checkm", bad).unwrap_err();
            assert!(e.contains(bad), "{bad}: {e}");
        }
        let text = checkm_text(&[vec!["a.txt".into()], vec!["https://o.example/b".into()]]);
        let m = parse_at(
            &text,
            &Limits::default(),
            Some("file:///srv/in/batch.checkm"),
        )
        .unwrap();
        let urls: Vec<_> = m.rows.iter().map(|r| r.get(FILE_URL).unwrap()).collect();
        assert_eq!(urls, ["file:///srv/in/a.txt", "https://o.example/b"]);
        // Without a base, a relative URL is refused, naming its line.
        let e = parse(&text).unwrap_err();
        assert_eq!(e.line, 6, "{e}");
        let e = parse_at(
            &checkm_text(&[vec!["../x".into()]]),
            &Limits::default(),
            Some("file:///srv/in/b.checkm"),
        )
        .unwrap_err();
        assert!(e.reason.contains("'..'"), "{e}");
    }

    fn checkm_text(rows: &[Vec<String>]) -> String {
        write(ManifestKind::Batch, &[FILE_URL], rows)
    }

    const OBJECT: &str = "#%checkm_0.7
#%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-ingest-manifest
#%prefix | mrt: | http://merritt.cdlib.org/terms#
#%prefix | nfo: | http://www.semanticdesktop.org/ontologies/2007/03/22/nfo#
#%fields | nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileSize | nfo:fileLastModified | nfo:fileName | mrt:mimeType
# a comment
http://example.org/a.txt | md5 | 0123456789abcdef0123456789ABCDEF | 12 | | data/a.txt | text/plain
file:///tmp/b.bin | | | | | |
#%eof
";

    #[test]
    fn object_manifest_rows_become_files() {
        let m = parse(OBJECT).unwrap();
        assert_eq!(m.kind, ManifestKind::Object);
        assert_eq!(m.rows.len(), 2);
        let a = m.rows[0].file_entry().unwrap();
        assert_eq!(a.name, "data/a.txt");
        assert_eq!(a.size, Some(12));
        assert_eq!(
            a.digest,
            Some(Digest {
                alg: HashAlg::Md5,
                hex: "0123456789abcdef0123456789abcdef".into()
            })
        );
        let b = m.rows[1].file_entry().unwrap();
        assert_eq!((b.name.as_str(), b.size, b.digest), ("b.bin", None, None));
        assert_eq!(m.rows[1].line, 8);
    }

    #[test]
    fn written_manifests_parse_back() {
        let text = write(
            ManifestKind::Batch,
            &[FILE_URL, PRIMARY_ID, LOCAL_ID, TITLE],
            &[vec![
                "http://h/m1.checkm".into(),
                "".into(),
                "loc-1".into(),
                "A title".into(),
            ]],
        );
        let m = parse(&text).unwrap();
        assert_eq!(m.kind, ManifestKind::Batch);
        assert_eq!(m.rows[0].get(LOCAL_ID), Some("loc-1"));
        assert_eq!(m.rows[0].get(PRIMARY_ID), None);
    }

    fn err(text: &str) -> ManifestError {
        parse(text).unwrap_err()
    }

    fn with_row(row: &str) -> String {
        OBJECT.replace("file:///tmp/b.bin | | | | | |", row)
    }

    #[test]
    fn malformed_manifests_name_the_line_and_the_reason() {
        assert_eq!(err("hello\n").line, 1);
        assert!(err("hello\n").reason.contains("#%checkm_0.7"));
        assert_eq!(err("").reason, "empty manifest (no #%checkm_0.7 header)");
        let e = err(&OBJECT.replace("#%eof\n", ""));
        assert_eq!(e.line, 9);
        assert!(e.reason.contains("missing #%eof"), "{e}");
        let e = err(&OBJECT.replace("mrt-ingest-manifest", "mrt-nonsense"));
        assert_eq!(e.line, 2);
        assert!(e.reason.contains("unknown manifest profile"), "{e}");
        let e = err(&with_row("http://h/x | sha256 | abc | | | x |"));
        assert_eq!(e.line, 8);
        assert!(e.reason.contains("is not 64 hex digits"), "{e}");
        let e = err(&with_row("http://h/x | crc32 | abc | | | x |"));
        assert!(
            e.reason.contains("unsupported hash algorithm \"crc32\""),
            "{e}"
        );
        let e = err(&with_row("http://h/x | | | ten | | x |"));
        assert!(e.reason.contains("file size \"ten\""), "{e}");
        let e = err(&with_row("http://h/x | | | | | ../../etc/passwd |"));
        assert!(e.reason.contains("relative path"), "{e}");
        let e = err(&with_row("ftp://h/x | | | | | x |"));
        assert!(e.reason.contains("not an http, https or file URL"), "{e}");
        let e = err(&with_row("http://h/x | | | | | x | a | b | c"));
        assert!(e.reason.contains("values but #%fields declares 7"), "{e}");
        let e = err(&with_row(" | | | | | x |"));
        assert!(e.reason.contains("nfo:fileUrl is empty"), "{e}");
        let e = err(&format!("{OBJECT}http://h/late\n"));
        assert!(e.reason.contains("content after #%eof"), "{e}");
        let e = err(&OBJECT.replace("#%fields", "#%fieldz"));
        assert!(e.reason.contains("unknown directive #%fieldz"), "{e}");
        // Merritt's Ruby client writes `#%profile URL` and `#%EOF`.
        let merritt = OBJECT
            .replace("#%profile | ", "#%profile ")
            .replace("#%eof", "#%EOF");
        assert!(parse(&merritt).is_ok(), "{:?}", parse(&merritt).err());
        let e = err(&OBJECT.replace("nfo:fileUrl |", "nfo:fileURL |"));
        assert!(e.reason.contains("lacks nfo:fileUrl"), "{e}");
        let e = err(&OBJECT.replace("#%fields |", "#%fields | x:y |"));
        assert!(e.reason.contains("undeclared prefix x:"), "{e}");
    }

    #[test]
    fn file_names_come_from_the_url_when_not_given() {
        assert_eq!(
            url_file_name("http://h/a/b/c.txt?x=1").as_deref(),
            Some("c.txt")
        );
        assert_eq!(url_file_name("http://h/"), None);
        assert_eq!(url_file_name("file:///tmp/f.zip").as_deref(), Some("f.zip"));
    }
}
