//! The node layout of SPEC §2 (Merritt's mrt-zk layout): ids, paths and the JSON records
//! stored in nodes. Every path the engine touches is built here and nowhere else.
//!
//! Records keep fields they do not know (`extra`), so rewriting a status written by another
//! tool never drops that tool's fields.

use crate::state::{AccessState, BatchState, JobState};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;

mod status_de;

pub const BATCHES: &str = "/batches";
pub const BATCH_PREFIX: &str = "/batches/bid";
pub const BATCH_UUIDS: &str = "/batch-uuids";
/// Lading's index of batches by submitter (`/batch-submitters/SUBMITTER/BID`, empty nodes),
/// so one submitter's listing reads only its own batches. Not part of Merritt's layout.
pub const BATCH_SUBMITTERS: &str = "/batch-submitters";
pub const JOBS: &str = "/jobs";
pub const JOB_PREFIX: &str = "/jobs/jid";
pub const JOB_STATES: &str = "/jobs/states";
pub const ACCESS: &str = "/access";
pub const LOCKS: &str = "/locks";
pub const QUEUE_LOCKS: &str = "/locks/queue";
pub const COLLECTION_LOCKS: &str = "/locks/collections";
pub const STORAGE_LOCKS: &str = "/locks/storage";
pub const INVENTORY_LOCKS: &str = "/locks/inventory";
/// Lading's outbox: one node per outside effect (a mail, a callback) still to deliver,
/// created in the same `multi` as the state change that causes it. Not part of Merritt's
/// layout.
pub const OUTBOX: &str = "/outbox";
pub const OUTBOX_PREFIX: &str = "/outbox/e";
/// Lading's space reservations of jobs admitted by provisioning (`/reservations/JID`), held
/// until their download ends either way. Not part of Merritt's layout.
pub const RESERVATIONS: &str = "/reservations";

/// Folders the engine creates once, up front, so every later operation can assume them.
pub const ROOTS: &[&str] = &[
    BATCHES,
    BATCH_UUIDS,
    JOBS,
    JOB_STATES,
    ACCESS,
    "/access/small",
    "/access/large",
    LOCKS,
    QUEUE_LOCKS,
    COLLECTION_LOCKS,
    STORAGE_LOCKS,
    INVENTORY_LOCKS,
    OUTBOX,
    RESERVATIONS,
];

/// The batch reference folders under `/batches/BID/states`, in the order every worker's move
/// between them follows (Processing to Completed or Failed, Failed to Deleted): read in this
/// order, a job moved forward meanwhile is still seen once. A move back (a requeue) can hide
/// a job from one pass: Lading's own waits while the intake holds the batch, and a retried
/// intake reads the folders until a pass finds nothing new (`Engine::batch_jobs`), which
/// covers a tool that does not take the lock.
pub const BATCH_FOLDERS: &[&str] = &[
    "batch-processing",
    "batch-completed",
    "batch-failed",
    "batch-deleted",
];

/// An id that is not of the expected form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a valid {1} id (expected {2} followed by digits)")]
pub struct BadId(pub String, pub &'static str, pub &'static str);

macro_rules! id_type {
    ($name:ident, $prefix:literal, $what:literal) => {
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub const PREFIX: &'static str = $prefix;
            pub fn parse(s: &str) -> Result<Self, BadId> {
                let digits = s
                    .strip_prefix($prefix)
                    .ok_or_else(|| BadId(s.into(), $what, $prefix))?;
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(BadId(s.into(), $what, $prefix));
                }
                Ok($name(s.to_string()))
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        /// An id is a folder's name too (a job's working folder).
        impl AsRef<std::path::Path> for $name {
            fn as_ref(&self) -> &std::path::Path {
                self.0.as_ref()
            }
        }

        impl AsRef<std::ffi::OsStr> for $name {
            fn as_ref(&self) -> &std::ffi::OsStr {
                self.0.as_ref()
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }
    };
}

id_type!(BatchId, "bid", "batch");
id_type!(JobId, "jid", "job");
id_type!(AccessId, "qid", "access");

/// The two access queues.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessQueue {
    Small,
    Large,
}

impl AccessQueue {
    pub fn name(self) -> &'static str {
        match self {
            AccessQueue::Small => "small",
            AccessQueue::Large => "large",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "small" => Some(AccessQueue::Small),
            "large" => Some(AccessQueue::Large),
            _ => None,
        }
    }
    /// The queue-pause lock name of this queue.
    pub fn lock_name(self) -> &'static str {
        match self {
            AccessQueue::Small => "accessSmall",
            AccessQueue::Large => "accessLarge",
        }
    }
}

/// Queues that can be paused with `/locks/queue/NAME`.
pub const QUEUE_NAMES: &[&str] = &["ingest", "accessSmall", "accessLarge"];

pub fn batch_path(b: &BatchId) -> String {
    slashed([BATCHES, b.as_str()])
}
/// `parts` joined by slashes, in one allocation of the right size (paths are built on every
/// call of the engine; `[..].join("/")` took 1.4% of a simulator run's instructions).
pub fn slashed<const N: usize>(parts: [&str; N]) -> String {
    let mut s = String::with_capacity(parts.iter().map(|p| p.len() + 1).sum());
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            s.push('/');
        }
        s.push_str(p);
    }
    s
}
pub fn batch_node(b: &BatchId, name: &str) -> String {
    slashed([BATCHES, b.as_str(), name])
}
pub fn batch_states(b: &BatchId) -> String {
    slashed([BATCHES, b.as_str(), "states"])
}
pub fn batch_ref_folder(b: &BatchId, folder: &str) -> String {
    slashed([BATCHES, b.as_str(), "states", folder])
}
pub fn batch_ref(b: &BatchId, folder: &str, j: &JobId) -> String {
    slashed([BATCHES, b.as_str(), "states", folder, j.as_str()])
}
pub fn batch_uuid_path(uuid: &str) -> String {
    slashed([BATCH_UUIDS, uuid])
}
pub fn job_path(j: &JobId) -> String {
    slashed([JOBS, j.as_str()])
}
pub fn job_node(j: &JobId, name: &str) -> String {
    slashed([JOBS, j.as_str(), name])
}
pub fn job_state_folder(s: JobState) -> String {
    slashed([JOB_STATES, s.node_name()])
}
/// The name of a job's reference in its state folder: two-digit priority, dash, id.
pub fn job_ref_name(priority: u8, j: &JobId) -> String {
    // Paths are built on every call of the engine: concatenated, not formatted.
    let mut s = String::with_capacity(j.as_str().len() + 4);
    let digit = |d: u8| char::from(b'0' + d);
    if priority >= 100 {
        s.push(digit(priority / 100));
    }
    s.push(digit(priority / 10 % 10));
    s.push(digit(priority % 10));
    s.push('-');
    s.push_str(j.as_str());
    s
}
pub fn job_ref(s: JobState, priority: u8, j: &JobId) -> String {
    slashed([JOB_STATES, s.node_name(), &job_ref_name(priority, j)])
}
/// Reads `PP-jidNNN` back into (priority, job id).
pub fn parse_job_ref(name: &str) -> Option<(u8, JobId)> {
    let (pp, jid) = name.split_once('-')?;
    Some((pp.parse().ok()?, JobId::parse(jid).ok()?))
}
pub fn access_folder(q: AccessQueue) -> String {
    format!("{ACCESS}/{}", q.name())
}
pub fn access_path(q: AccessQueue, a: &AccessId) -> String {
    format!("{ACCESS}/{}/{a}", q.name())
}
pub fn queue_lock(name: &str) -> String {
    slashed([QUEUE_LOCKS, name])
}
pub fn collection_lock(mnemonic: &str) -> String {
    slashed([COLLECTION_LOCKS, mnemonic])
}
/// An identifier as a single node name (its storage folder and its locks), one-to-one:
///
/// - an ARK of Merritt's shape (`ark:/NAAN/NAME`, with no `_`, `%`, `:` after `ark:/`, no
///   empty, `.` or `..` segment) gets Merritt's own name, `:/` and `/` turned into `_`
///   (`ark:/13030/m5k695dk` → `ark_13030_m5k695dk`), so Merritt's tools find its locks;
/// - any other identifier is escaped: letters, digits, `.` and `-` kept, every other byte
///   `%XX` (`_` and `%` included), a leading `.` too.
///
/// The first kind always holds a `_` and no `%`; the second never holds a `_`. So no two
/// identifiers share a name: `ark:/99999/x`, `ark:/99999_x` and `ark_99999_x` are three.
pub fn ark_node_name(ark: &str) -> String {
    if let Some(rest) = ark.strip_prefix("ark:/")
        && merritt_shaped(rest)
    {
        return format!("ark_{}", rest.replace('/', "_"));
    }
    escape_keeping(ark, b".-")
}

/// Whether an ARK's part after `ark:/` has Merritt's shape (see [`ark_node_name`]).
fn merritt_shaped(rest: &str) -> bool {
    !rest.is_empty()
        && rest.split('/').all(|seg| {
            !seg.is_empty()
                && seg != "."
                && seg != ".."
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-=~*+@$".contains(&b))
        })
}
pub fn storage_lock(ark: &str) -> String {
    format!("{STORAGE_LOCKS}/{}", ark_node_name(ark))
}
pub fn inventory_lock(ark: &str) -> String {
    format!("{INVENTORY_LOCKS}/{}", ark_node_name(ark))
}

/// Checks a collection mnemonic or queue name is usable as one node name.
/// Any string as one node name: letters, digits, `.`, `_`, `-` kept, every other byte `%XX`,
/// a leading `.` too (so `.` and `..` cannot be made).
pub fn escape_node_name(s: &str) -> String {
    escape_keeping(s, b"._-")
}

/// `s` as one node name: letters, digits and the bytes of `keep` kept, every other byte
/// `%XX`, a leading `.` too.
fn escape_keeping(s: &str, keep: &[u8]) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || keep.contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.starts_with('.') {
        out.replace_range(0..1, "%2E");
    }
    out
}

/// The folder of `submitter`'s batches in [`BATCH_SUBMITTERS`].
pub fn submitter_batches(submitter: &str) -> String {
    format!("{BATCH_SUBMITTERS}/{}", escape_node_name(submitter))
}

pub fn check_name(kind: &'static str, name: &str) -> Result<(), BadName> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." || name.contains('\0') {
        return Err(BadName(kind, name.to_string()));
    }
    Ok(())
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {0} name {1:?}")]
pub struct BadName(pub &'static str, pub String);

/// `/jobs/JID/status` (read field by field: `status_de.rs`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobStatus {
    pub status: JobState,
    #[serde(default)]
    pub last_successful_status: Option<JobState>,
    #[serde(default)]
    pub last_modified: String,
    #[serde(default)]
    pub retry_count: u32,
    /// Always written (`""` for none), as Merritt writes and reads it.
    #[serde(default, with = "message_field")]
    pub message: Option<String>,
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub extra: Map<String, Value>,
}

/// A field Merritt always has (a status `message`, `primary_id`): written as `""` when
/// there is none, and `""` read as none.
mod message_field {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(m: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(m.as_deref().unwrap_or(""))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        Ok(Option::<String>::deserialize(d)?.filter(|m| !m.is_empty()))
    }
}

/// `/batches/BID/status` (read field by field: `status_de.rs`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchStatus {
    pub status: BatchState,
    #[serde(default)]
    pub last_modified: String,
    /// Always written (`""` for none), as Merritt writes and reads it.
    #[serde(default, with = "message_field")]
    pub message: Option<String>,
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub extra: Map<String, Value>,
}

/// `/access/QUEUE/QID/status`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccessStatus {
    pub status: AccessState,
    #[serde(default)]
    pub last_modified: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub extra: Map<String, Value>,
}

/// `/batches/BID/status-report`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    #[serde(default)]
    pub last_modified: String,
    #[serde(default)]
    pub completed_jobs: Vec<String>,
    #[serde(default)]
    pub failed_jobs: Vec<String>,
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub extra: Map<String, Value>,
}

/// `/jobs/JID/identifiers`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Identifiers {
    /// Always written (`""` until one is given or minted), as Merritt reads it.
    #[serde(default, with = "message_field")]
    pub primary_id: Option<String>,
    /// Read as a list or as one name (`""` is none); written as a list.
    #[serde(default, deserialize_with = "one_or_many")]
    pub local_id: Vec<String>,
    /// Keys another writer of the tree added, kept as they came.
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub extra: Map<String, Value>,
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(Option<String>),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(one) => one.into_iter().filter(|s| !s.is_empty()).collect(),
        OneOrMany::Many(many) => many,
    })
}

/// `/jobs/JID/metadata` as stored: the object's ERC, and whatever else an ERC file or a
/// bag's tags put there under their own names (`Source-Organization`, say), kept as it came.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobMetadata {
    #[serde(flatten)]
    pub erc: ErcMetadata,
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub extra: Map<String, Value>,
}

impl JobMetadata {
    /// The text under `key` (an ERC field or another), if it has any; a value that is not
    /// text is none.
    pub fn get(&self, key: &str) -> Option<&str> {
        match self.erc.field(key) {
            Some(v) => v.as_deref(),
            None => self.extra.get(key).and_then(Value::as_str),
        }
        .filter(|v| !v.is_empty())
    }

    /// Sets `key` to `value` if it holds nothing yet (absent, null or `""`); whether it did.
    pub fn fill(&mut self, key: &str, value: &str) -> bool {
        if let Some(v) = self.erc.field_mut(key) {
            if v.as_deref().is_some_and(|v| !v.is_empty()) {
                return false;
            }
            *v = Some(value.to_string());
            return true;
        }
        if self.extra.get(key).is_some_and(|v| !v.is_null() && v != "") {
            return false;
        }
        self.extra.insert(key.to_string(), Value::from(value));
        true
    }
}

impl From<ErcMetadata> for JobMetadata {
    fn from(erc: ErcMetadata) -> JobMetadata {
        JobMetadata {
            erc,
            extra: Map::new(),
        }
    }
}

/// The object's ERC (who, what, when, where), as a submission gives it and as
/// `/jobs/JID/metadata` ([`JobMetadata`]) holds it.
#[serde_with::skip_serializing_none]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ErcMetadata {
    pub erc_who: Option<String>,
    pub erc_what: Option<String>,
    pub erc_when: Option<String>,
    pub erc_where: Option<String>,
}

impl ErcMetadata {
    /// The field named `key` (`erc_who`, …); `None` for a name that is no ERC field.
    pub fn field(&self, key: &str) -> Option<&Option<String>> {
        Some(match key {
            "erc_who" => &self.erc_who,
            "erc_what" => &self.erc_what,
            "erc_when" => &self.erc_when,
            "erc_where" => &self.erc_where,
            _ => return None,
        })
    }

    fn field_mut(&mut self, key: &str) -> Option<&mut Option<String>> {
        Some(match key {
            "erc_who" => &mut self.erc_who,
            "erc_what" => &mut self.erc_what,
            "erc_when" => &mut self.erc_when,
            "erc_where" => &mut self.erc_where,
            _ => return None,
        })
    }
}

/// Data of a lock node: who holds it. Merritt's tools only test a lock's presence, so the
/// identity rides along without changing what they see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockOwner {
    pub owner: String,
    pub session: u64,
    pub acquired: String,
}

/// Encodes a record as node bytes.
pub fn to_bytes<T: Serialize>(v: &T) -> Vec<u8> {
    // Serialising these plain records cannot fail: no maps with non-string keys, no floats.
    serde_json::to_vec(v).expect("record serialises")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_identifiers_and_metadata_keep_what_they_do_not_name() {
        // A local id written as one name (or as "") reads as a list; unknown keys stay.
        let ids: Identifiers =
            serde_json::from_str(r#"{"primary_id":"","local_id":"mine","other":1}"#).unwrap();
        assert_eq!(ids.primary_id, None);
        assert_eq!(ids.local_id, ["mine"]);
        assert_eq!(
            serde_json::to_value(&ids).unwrap(),
            serde_json::json!({"primary_id": "", "local_id": ["mine"], "other": 1})
        );
        let none: Identifiers = serde_json::from_str(r#"{"local_id":""}"#).unwrap();
        assert!(none.local_id.is_empty());

        let text = r#"{"erc_what":"A title","erc_who":"","Source-Organization":"Uni","n":2}"#;
        let mut md: JobMetadata = serde_json::from_str(text).unwrap();
        assert_eq!(md.get("erc_what"), Some("A title"));
        assert_eq!(md.get("erc_who"), None, "empty is none");
        assert_eq!(md.get("n"), None, "not text");
        // Filled only where nothing is held: an ERC field and another key alike.
        assert!(md.fill("erc_who", "A creator"));
        assert!(!md.fill("erc_what", "Another title"));
        assert!(!md.fill("Source-Organization", "Elsewhere"));
        assert!(!md.fill("n", "3"));
        assert!(md.fill("Bag-Group-Identifier", "g1"));
        assert_eq!(
            serde_json::to_value(&md).unwrap(),
            serde_json::json!({"erc_what": "A title", "erc_who": "A creator",
                "Source-Organization": "Uni", "n": 2, "Bag-Group-Identifier": "g1"})
        );
    }

    #[test]
    fn identifiers_map_to_node_names_one_to_one() {
        assert_eq!(ark_node_name("ark:/13030/m5k695dk"), "ark_13030_m5k695dk");
        assert_eq!(ark_node_name("ark:/99999/fk4/a.b"), "ark_99999_fk4_a.b");
        let ids = [
            "ark:/99999/x",
            "ark:/99999_x",
            "ark_99999_x",
            "ark:/99999/x_",
            "ark/99999/x",
            "ark:99999/x",
            "ark:/99999//x",
            "ark:/99999/%78",
            "ark:/99999/x/..",
            "doi:10.1/abc_def",
            "doi:10.1/abc%5Fdef",
            ".hidden",
            "%2Ehidden",
        ];
        let names: std::collections::BTreeSet<String> =
            ids.iter().map(|i| ark_node_name(i)).collect();
        assert_eq!(names.len(), ids.len(), "{names:?}");
        for n in &names {
            assert!(!n.contains('/') && !n.starts_with('.'), "{n}");
        }
    }

    #[test]
    fn ids_parse_and_refuse() {
        assert!(BatchId::parse("bid0000000001").is_ok());
        assert!(JobId::parse("jid0001").is_ok());
        assert!(JobId::parse("bid0001").is_err());
        assert!(JobId::parse("jid").is_err());
        assert!(JobId::parse("jid12a").is_err());
        let e = JobId::parse("x").unwrap_err();
        assert!(e.to_string().contains("\"x\" is not a valid job id"));
    }

    #[test]
    fn job_refs_sort_by_priority_then_age() {
        let a = job_ref_name(5, &JobId::parse("jid0000000002").unwrap());
        let b = job_ref_name(10, &JobId::parse("jid0000000001").unwrap());
        let c = job_ref_name(5, &JobId::parse("jid0000000001").unwrap());
        let mut v = vec![a.clone(), b.clone(), c.clone()];
        v.sort();
        assert_eq!(v, vec![c, a, b]);
        assert_eq!(parse_job_ref("05-jid0000000001").unwrap().0, 5);
    }

    #[test]
    fn paths_are_spelled_as_merritt_spells_them() {
        let j = JobId::parse("jid0000000007").unwrap();
        let b = BatchId::parse("bid0000000003").unwrap();
        for (p, name) in [
            (0, "00"),
            (5, "05"),
            (10, "10"),
            (99, "99"),
            (100, "100"),
            (255, "255"),
        ] {
            assert_eq!(job_ref_name(p, &j), format!("{name}-jid0000000007"));
            assert_eq!(format!("{p:02}"), name, "as format! pads it");
        }
        assert_eq!(
            job_ref(JobState::Estimating, 5, &j),
            "/jobs/states/estimating/05-jid0000000007"
        );
        assert_eq!(job_node(&j, "status"), "/jobs/jid0000000007/status");
        assert_eq!(job_path(&j), "/jobs/jid0000000007");
        assert_eq!(
            batch_ref(&b, "batch-failed", &j),
            "/batches/bid0000000003/states/batch-failed/jid0000000007"
        );
        assert_eq!(batch_node(&b, "lock"), "/batches/bid0000000003/lock");
        assert_eq!(batch_states(&b), "/batches/bid0000000003/states");
        assert_eq!(batch_uuid_path("u-1"), "/batch-uuids/u-1");
        assert_eq!(job_state_folder(JobState::Pending), "/jobs/states/pending");
    }

    #[test]
    fn arks_become_one_node_name() {
        assert_eq!(ark_node_name("ark:/13030/m5abc"), "ark_13030_m5abc");
    }

    #[test]
    fn status_keeps_unknown_fields() {
        let raw = r#"{"status":"Estimating","last_successful_status":null,"last_modified":"2026-11-21 14:03:07 +0000","retry_count":0,"owner_note":"x"}"#;
        let s: JobStatus = serde_json::from_str(raw).unwrap();
        assert_eq!(s.status, JobState::Estimating);
        let back = String::from_utf8(to_bytes(&s)).unwrap();
        assert!(back.contains("\"owner_note\":\"x\""));
        assert!(back.contains("\"last_successful_status\":null"));
    }
}

/// Whether a string field is absent or empty (Merritt writes `""` for none).
fn blank(v: &Option<String>) -> bool {
    v.as_deref().is_none_or(str::is_empty)
}

/// `/batches/BID/submission`: what Lading's submission writes, read also from one Merritt's
/// ingest service wrote (its names for the same things are looked up in `extra` when
/// Lading's are absent). Other fields are kept in `extra` and written back as they were.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchSubmission {
    pub profile_name: Option<String>,
    pub collection: Option<String>,
    pub submitter: Option<String>,
    pub payload_url: Option<String>,
    #[serde(rename = "type")]
    pub payload_type: Option<String>,
    pub submission_mode: Option<String>,
    pub response_type: Option<String>,
    /// The object's ERC (who, what, when, where), for a single-object batch.
    #[serde(flatten)]
    pub erc: ErcMetadata,
    pub local_id: Option<String>,
    pub primary_id: Option<String>,
    #[serde(flatten)]
    pub trust: PayloadTrust,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Whose URLs a batch or job holds: fields of its submission or configuration, which
/// `lading_ingest::Trust` reads back by key.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PayloadTrust {
    /// `depositor`, or absent for the operator's.
    pub payload_trust: Option<String>,
    /// The server-made file of an upload.
    pub upload_url: Option<String>,
}

impl PayloadTrust {
    /// A field of the record holding this trust, by its key: these two, else from `extra`.
    pub fn field<'a>(&'a self, extra: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
        match key {
            "payload_trust" => self.payload_trust.as_deref(),
            "upload_url" => self.upload_url.as_deref(),
            _ => extra.get(key).and_then(Value::as_str),
        }
    }
}

/// Accessors of fields that Merritt's ingest service writes under its own name: `name()` is
/// Lading's field `ours`, or Merritt's `theirs` (kept in `extra`) when ours is blank.
macro_rules! ours_or_theirs {
    ($($name:ident => $($ours:ident).+, $theirs:literal;)*) => {
        $(
            pub fn $name(&self) -> Option<&str> {
                self.or_theirs(&self.$($ours).+, $theirs)
            }
        )*
    };
}

/// A submission from its fields as written (a field of an unexpected type is an error).
impl TryFrom<Map<String, Value>> for BatchSubmission {
    type Error = serde_json::Error;
    fn try_from(fields: Map<String, Value>) -> Result<Self, Self::Error> {
        serde_json::from_value(Value::Object(fields))
    }
}

/// A configuration from its fields as written (a field of an unexpected type is an error).
impl TryFrom<Map<String, Value>> for JobConfiguration {
    type Error = serde_json::Error;
    fn try_from(fields: Map<String, Value>) -> Result<Self, Self::Error> {
        serde_json::from_value(Value::Object(fields))
    }
}

impl BatchSubmission {
    /// A field Merritt's ingest service writes under its own name, when Lading's is blank.
    fn or_theirs<'a>(&'a self, ours: &'a Option<String>, theirs: &str) -> Option<&'a str> {
        if blank(ours) {
            self.extra
                .get(theirs)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        } else {
            ours.as_deref()
        }
    }
    ours_or_theirs! {
        profile => profile_name, "profile";
        creator => erc.erc_who, "creator";
        title => erc.erc_what, "title";
        date => erc.erc_when, "date";
        primary => primary_id, "objectID";
        local => local_id, "localID";
        response => response_type, "responseForm";
    }
    /// Merritt's package name (on its ingest storage), for a submission without a URL.
    pub fn merritt_filename(&self) -> Option<&str> {
        self.extra.get("filename").and_then(Value::as_str)
    }
    /// Merritt's uuid of the batch, when its ingest service made it.
    pub fn merritt_batch_id(&self) -> Option<&str> {
        self.extra.get("batchID").and_then(Value::as_str)
    }
    /// A field by its key, as written (the payload trust's keys included).
    pub fn field(&self, key: &str) -> Option<&str> {
        self.trust.field(&self.extra, key)
    }
}

impl crate::Recorded<BatchSubmission> {
    /// The submitter the submission names, read from it as stored (whatever its shape): what
    /// the owner checks and the submitters' index go by.
    pub fn submitter(&self) -> Option<&str> {
        self.text("submitter")
    }
}

/// The submitter a submission's or a job configuration's fields name, as stored.
pub fn submitter_in(fields: &Map<String, Value>) -> Option<&str> {
    fields.get("submitter").and_then(Value::as_str)
}

/// `/jobs/JID/configuration`: Merritt's keys (`profile_name`, `submitter`, `payload_url`,
/// `payload_type`, `response_type`), which every stage can work from alone, then Lading's.
/// Other fields are kept in `extra` and written back as they were.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobConfiguration {
    pub profile_name: Option<String>,
    pub collection: Option<String>,
    pub submitter: Option<String>,
    pub payload_url: Option<String>,
    pub payload_type: Option<String>,
    pub response_type: Option<String>,
    pub submission_mode: Option<String>,
    /// The batch's uuid (Merritt's `batchID`), when Merritt's ingest service made the batch.
    pub batch_uuid: Option<String>,
    /// The row of the batch's payload this job was made from (a retried intake skips it).
    pub intake_row: Option<u64>,
    /// The object's file as the manifest named it (url, name, size, digest).
    pub file: Option<Value>,
    #[serde(flatten)]
    pub trust: PayloadTrust,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl JobConfiguration {
    /// The profile's name: `profile_name`, or `profile` as Merritt's ingest service
    /// (`HandlerSubmit`) writes it.
    pub fn profile(&self) -> Option<&str> {
        self.profile_name
            .as_deref()
            .or_else(|| self.extra.get("profile").and_then(Value::as_str))
    }

    /// A field by its key (the payload trust's keys), as written.
    pub fn field(&self, key: &str) -> Option<&str> {
        self.trust.field(&self.extra, key)
    }

    /// The payload type: `payload_type`, or `type` as Merritt's ingest service writes it
    /// (`file`, `container`, `manifest`); `file` when neither is given.
    pub fn payload_type(&self) -> &str {
        self.payload_type
            .as_deref()
            .or_else(|| self.extra.get("type").and_then(Value::as_str))
            .filter(|t| !t.is_empty())
            .unwrap_or("file")
    }

    /// Merritt's package name (on its ingest storage), for a job its ingest service made
    /// without a payload URL.
    pub fn merritt_filename(&self) -> Option<&str> {
        self.extra
            .get("filename")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    }
}

/// `/access/QUEUE/QID/token`: what Lading's access request holds. Merritt's fields
/// (`token`, `delivery-node`, `cloud-content-byte`, `status`, `url`,
/// `anticipated-availability-time`), written beside them with the types Merritt's `Access`
/// reads, are kept in `extra`. A request Merritt's own access service made names no `ark`.
#[serde_with::skip_serializing_none]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AccessToken {
    pub ark: Option<String>,
    pub version: Option<u32>,
    /// Who asked (the token's name).
    pub requester: Option<String>,
    /// The digest of the depositor's secret (the secret itself is never stored).
    pub secret_sha256: Option<String>,
    /// A request made before digests were kept holds its secret.
    pub secret: Option<String>,
    /// The version's size.
    pub bytes: Option<u64>,
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub extra: Map<String, Value>,
}

/// A stored record read as `T`: absent (`null`) is `T`'s default; another shape is named as
/// corrupt, with the node's path.
pub fn read_record<T: serde::de::DeserializeOwned + Default>(
    path: &str,
    v: &Value,
) -> Result<T, String> {
    if v.is_null() {
        return Ok(T::default());
    }
    T::deserialize(v).map_err(|e| format!("{path} is corrupt: {e}"))
}

/// A typed record as the JSON object it is stored as.
pub fn to_object<T: Serialize>(record: &T) -> Map<String, Value> {
    match serde_json::to_value(record) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}
