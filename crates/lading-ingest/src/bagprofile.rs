//! BagIt profiles: what a bag must hold to be taken. Read from either JSON a depositor's
//! community publishes: the BagIt Profiles specification's (`BagIt-Profile-Info`,
//! `Bag-Info`, `Manifests-Required`, …) and APTrust's own (`bagItProfileInfo`, a `tags`
//! array naming a tag file for each tag). Both become one [`BagProfile`].

use serde_json::Value;
use std::path::Path;

/// One rule about a tag: in which tag file, whether it must be there, what it may be.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TagRule {
    /// The tag file, e.g. `bag-info.txt` or `aptrust-info.txt`.
    pub file: String,
    pub name: String,
    pub required: bool,
    /// The values allowed; empty: any.
    pub values: Vec<String>,
    /// Whether a required tag may be present but empty.
    pub empty_ok: bool,
    /// What an absent tag is taken to be (APTrust's `defaultValue`: a bag without
    /// `Storage-Option` is `Standard`).
    pub default: Option<String>,
}

/// A BagIt profile, from either JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BagProfile {
    /// `BagIt-Profile-Identifier`: the URI a bag names in its `bag-info.txt` to be checked
    /// against this profile.
    pub identifier: String,
    /// The file it was read from (shown in messages).
    pub file: String,
    /// BagIt versions taken; empty: 0.97 and 1.0.
    pub accept_versions: Vec<String>,
    /// Media types of the serializations taken; empty: any Lading unpacks.
    pub accept_serialization: Vec<String>,
    pub allow_fetch: bool,
    pub manifests_required: Vec<String>,
    /// Empty: any algorithm Lading computes.
    pub manifests_allowed: Vec<String>,
    pub tag_manifests_required: Vec<String>,
    pub tag_manifests_allowed: Vec<String>,
    pub tag_files_required: Vec<String>,
    pub tags: Vec<TagRule>,
}

/// Algorithms Lading computes (RFC 8493's and the profiles').
pub const ALGORITHMS: &[&str] = &["md5", "sha1", "sha256", "sha512"];

fn strings(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        Some(Value::String(s)) => vec![s.clone()],
        _ => Vec::new(),
    }
}

fn lower(v: Vec<String>) -> Vec<String> {
    v.into_iter().map(|s| s.to_ascii_lowercase()).collect()
}

impl BagProfile {
    /// Reads the profile in `path`, in either JSON; the error names the file and what is wrong.
    pub fn load(path: &Path) -> Result<BagProfile, String> {
        let shown = path.display().to_string();
        let text = std::fs::read(path).map_err(|e| format!("BagIt profile {shown}: {e}"))?;
        if text.len() > 1 << 20 {
            return Err(format!("BagIt profile {shown}: larger than 1 MiB"));
        }
        let v: Value = lading_core::json::from_bytes(&text)
            .map_err(|e| format!("BagIt profile {shown}: not JSON: {e}"))?;
        // Messages about a bag name the profile's file, never the server's folders.
        let name = path
            .file_name()
            .map_or(shown.clone(), |n| n.to_string_lossy().into_owned());
        BagProfile::from_json(&v, &name).map_err(|e| format!("BagIt profile {shown}: {e}"))
    }

    /// A profile from its JSON (`file` names it in messages).
    pub fn from_json(v: &Value, file: &str) -> Result<BagProfile, String> {
        let mut p = if let Some(info) = v.get("BagIt-Profile-Info") {
            Self::from_spec(v, info)?
        } else if let Some(info) = v.get("bagItProfileInfo") {
            Self::from_aptrust(v, info)?
        } else {
            return Err("neither a BagIt Profiles specification profile (no \
                 \"BagIt-Profile-Info\") nor an APTrust profile (no \"bagItProfileInfo\")"
                .into());
        };
        p.file = file.to_string();
        for alg in p.manifests_required.iter().chain(&p.tag_manifests_required) {
            if !ALGORITHMS.contains(&alg.as_str()) {
                return Err(format!(
                    "requires a {alg} manifest; Lading computes only {}",
                    ALGORITHMS.join(", ")
                ));
            }
        }
        if p.identifier.is_empty() {
            return Err("no BagIt-Profile-Identifier".into());
        }
        Ok(p)
    }

    /// The BagIt Profiles specification's JSON (v1.3 and later).
    fn from_spec(v: &Value, info: &Value) -> Result<BagProfile, String> {
        let mut tags = Vec::new();
        if let Some(Value::Object(bag_info)) = v.get("Bag-Info") {
            for (name, rule) in bag_info {
                tags.push(TagRule {
                    file: "bag-info.txt".into(),
                    name: name.clone(),
                    required: rule
                        .get("required")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                    values: strings(rule.get("values")),
                    empty_ok: false,
                    default: None,
                });
            }
        }
        let fetch = match v.get("Allow-Fetch.txt") {
            None => true,
            Some(Value::Bool(b)) => *b,
            Some(other) => return Err(format!("Allow-Fetch.txt is {other}, not true or false")),
        };
        Ok(BagProfile {
            identifier: info
                .get("BagIt-Profile-Identifier")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            file: String::new(),
            accept_versions: strings(v.get("Accept-BagIt-Version")),
            accept_serialization: strings(v.get("Accept-Serialization")),
            allow_fetch: fetch,
            manifests_required: lower(strings(v.get("Manifests-Required"))),
            manifests_allowed: lower(strings(v.get("Manifests-Allowed"))),
            tag_manifests_required: lower(strings(v.get("Tag-Manifests-Required"))),
            tag_manifests_allowed: lower(strings(v.get("Tag-Manifests-Allowed"))),
            tag_files_required: strings(v.get("Tag-Files-Required")),
            tags,
        })
    }

    /// APTrust's profile JSON (`aptrust-v2.2.json`, `btr-v1.0.json`).
    fn from_aptrust(v: &Value, info: &Value) -> Result<BagProfile, String> {
        let mut tags = Vec::new();
        if let Some(Value::Array(list)) = v.get("tags") {
            for t in list {
                let get = |k: &str| t.get(k).and_then(Value::as_str).unwrap_or_default();
                if get("tagFile").is_empty() || get("tagName").is_empty() {
                    return Err("a tag without tagFile or tagName".into());
                }
                tags.push(TagRule {
                    file: get("tagFile").to_string(),
                    name: get("tagName").to_string(),
                    required: t.get("required").and_then(Value::as_bool).unwrap_or(false),
                    values: strings(t.get("values")),
                    empty_ok: t.get("emptyOk").and_then(Value::as_bool).unwrap_or(false),
                    default: t
                        .get("defaultValue")
                        .and_then(Value::as_str)
                        .filter(|d| !d.is_empty())
                        .map(str::to_string),
                });
            }
        }
        // The tag files a required tag lives in are required too.
        let mut files: Vec<String> = Vec::new();
        for t in tags.iter().filter(|t| t.required) {
            if !files.contains(&t.file) {
                files.push(t.file.clone());
            }
        }
        Ok(BagProfile {
            identifier: info
                .get("bagItProfileIdentifier")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            file: String::new(),
            accept_versions: strings(v.get("acceptBagItVersion")),
            accept_serialization: strings(v.get("acceptSerialization")),
            allow_fetch: v
                .get("allowFetchTxt")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            manifests_required: lower(strings(v.get("manifestsRequired"))),
            manifests_allowed: lower(strings(v.get("manifestsAllowed"))),
            tag_manifests_required: lower(strings(v.get("tagManifestsRequired"))),
            tag_manifests_allowed: lower(strings(v.get("tagManifestsAllowed"))),
            tag_files_required: files,
            tags,
        })
    }

    /// Whether a serialization of media type `mime` is taken (`application/tar` and
    /// `application/x-tar` are one type, as are the gzip names).
    pub fn takes_serialization(&self, mime: &str) -> bool {
        let canon = |m: &str| match m.to_ascii_lowercase().as_str() {
            "application/x-tar" | "application/tar" => "tar".to_string(),
            "application/gzip" | "application/x-gzip" | "application/tar+gzip" => {
                "gzip".to_string()
            }
            "application/zip" | "application/x-zip-compressed" => "zip".to_string(),
            other => other.to_string(),
        };
        self.accept_serialization.is_empty()
            || self
                .accept_serialization
                .iter()
                .any(|a| canon(a) == canon(mime))
    }

    /// The profile a default Lading bag is restored under when it came with none: md5 and
    /// sha256 manifests, nothing else required.
    pub fn lading_default() -> BagProfile {
        BagProfile {
            identifier: "lading:default".into(),
            file: "(built in)".into(),
            manifests_allowed: ALGORITHMS.iter().map(|s| s.to_string()).collect(),
            tag_manifests_allowed: ALGORITHMS.iter().map(|s| s.to_string()).collect(),
            ..BagProfile::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_specifications_json_and_aptrusts_give_one_profile() {
        let spec = json!({
            "BagIt-Profile-Info": {"BagIt-Profile-Identifier": "https://example.org/p.json"},
            "Bag-Info": {"Source-Organization": {"required": true, "values": ["A", "B"]}},
            "Manifests-Required": ["SHA256"],
            "Allow-Fetch.txt": false,
            "Accept-Serialization": ["application/zip"],
            "Tag-Files-Required": ["extra.txt"]
        });
        let p = BagProfile::from_json(&spec, "p.json").unwrap();
        assert_eq!(p.identifier, "https://example.org/p.json");
        assert_eq!(p.manifests_required, vec!["sha256"]);
        assert!(!p.allow_fetch);
        assert!(p.takes_serialization("application/x-zip-compressed"));
        assert!(!p.takes_serialization("application/tar"));
        assert_eq!(p.tags[0].file, "bag-info.txt");
        assert_eq!(p.tags[0].values, vec!["A", "B"]);
        let aptrust = json!({
            "bagItProfileInfo": {"bagItProfileIdentifier": "https://example.org/a.json"},
            "manifestsRequired": ["md5"],
            "acceptSerialization": ["application/tar"],
            "tags": [{"tagFile": "aptrust-info.txt", "tagName": "Title", "required": true},
                     {"tagFile": "aptrust-info.txt", "tagName": "Access", "required": true,
                      "values": ["Consortia", "Institution", "Restricted"]}]
        });
        let a = BagProfile::from_json(&aptrust, "a.json").unwrap();
        assert_eq!(a.tag_files_required, vec!["aptrust-info.txt"]);
        assert!(a.takes_serialization("application/x-tar"));
        assert!(!a.allow_fetch);
        let e = BagProfile::from_json(&json!({"name": "x"}), "x.json").unwrap_err();
        assert!(e.contains("BagIt-Profile-Info"), "{e}");
        let e = BagProfile::from_json(
            &json!({"BagIt-Profile-Info": {"BagIt-Profile-Identifier": "u"},
                    "Manifests-Required": ["blake2b"]}),
            "b.json",
        )
        .unwrap_err();
        assert!(e.contains("blake2b"), "{e}");
    }
}
