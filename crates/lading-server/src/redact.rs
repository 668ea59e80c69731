//! Server paths and passwords kept out of what submitters read: an upload's `file://` URL
//! becomes `upload:NAME`, the service's own folders (data, working, storage) are cut from any
//! other text, and a URL's password becomes `***`.

use crate::AppState;
use serde_json::Value;
use std::path::PathBuf;

/// The service's folders, absolute, longest first (so a folder inside another goes first).
fn roots(s: &AppState) -> Vec<String> {
    let c = &s.ingest.cfg;
    let mut out: Vec<String> = [c.data_dir.clone(), c.work_dir(), c.storage_root()]
        .into_iter()
        .filter_map(|p: PathBuf| std::path::absolute(p).ok())
        .map(|p| p.to_string_lossy().trim_end_matches('/').to_string())
        .filter(|p| !p.is_empty() && p != "/")
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.len()));
    out
}

/// Rewrites `text` without server paths.
pub fn text(s: &AppState, text: &mut String) {
    let roots = roots(s);
    rewrite(&roots, text);
}

fn rewrite(roots: &[String], text: &mut String) {
    if let std::borrow::Cow::Owned(t) = lading_core::text::without_passwords(text) {
        *text = t;
    }
    for r in roots {
        let upload = format!("file://{r}/uploads/");
        while let Some(at) = text.find(&upload) {
            // file://DATA/uploads/UUID/NAME → upload:NAME
            let rest = &text[at + upload.len()..];
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            let name = rest[..end]
                .split_once('/')
                .map_or("", |(_, n)| n)
                .to_string();
            text.replace_range(at..at + upload.len() + end, &format!("upload:{name}"));
        }
        if text.contains(r.as_str()) {
            *text = text.replace(&format!("{r}/"), "").replace(r.as_str(), "");
        }
    }
}

/// Rewrites every string in `v` without server paths.
pub fn paths(s: &AppState, v: &mut Value) {
    let roots = roots(s);
    walk(&roots, v);
}

fn walk(roots: &[String], v: &mut Value) {
    match v {
        Value::String(t) => rewrite(roots, t),
        Value::Array(a) => a.iter_mut().for_each(|x| walk(roots, x)),
        Value::Object(o) => o.values_mut().for_each(|x| walk(roots, x)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn uploads_and_folders_are_cut() {
        let roots = vec!["/srv/lading/data".to_string()];
        let mut t =
            "file:///srv/lading/data/uploads/0a1b/report.pdf and /srv/lading/data/work/jid1/x"
                .to_string();
        super::rewrite(&roots, &mut t);
        assert_eq!(t, "upload:report.pdf and work/jid1/x");
        let mut t = "https://ann:s3cret@example.org/m.checkm".to_string();
        super::rewrite(&roots, &mut t);
        assert_eq!(t, "https://ann:***@example.org/m.checkm");
    }
}
