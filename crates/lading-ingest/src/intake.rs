//! Submission and batch intake: a batch's payload becomes one job per object.

use crate::checkm::{self, FileEntry, ManifestKind, Row};
use crate::fetch::FetchError;
use crate::policy::Trust;
use crate::{Ingest, fatal_or_transient};
use lading_core::layout::{BatchId, BatchSubmission, ErcMetadata, Identifiers, JobConfiguration};
use lading_core::tree::BoxFuture;
use lading_core::{BatchState, Event};
use lading_engine::{EngineError, JobSpec};
use lading_worker::{BatchCtx, BatchStage, Outcome};
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;

/// What a depositor's payload is (the submission's `type`, Merritt's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadType {
    File,
    Container,
    /// An object manifest (`mrt-ingest-manifest`).
    Manifest,
    BatchManifest,
    SingleFileBatchManifest,
    ContainerBatchManifest,
    /// A serialized BagIt bag (tar, tar.gz or zip): one object.
    Bag,
    /// A container batch manifest whose rows are bags.
    BagBatchManifest,
}

impl PayloadType {
    pub const ALL: &'static [PayloadType] = &[
        PayloadType::File,
        PayloadType::Container,
        PayloadType::Manifest,
        PayloadType::BatchManifest,
        PayloadType::SingleFileBatchManifest,
        PayloadType::ContainerBatchManifest,
        PayloadType::Bag,
        PayloadType::BagBatchManifest,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PayloadType::File => "file",
            PayloadType::Container => "container",
            PayloadType::Manifest => "manifest",
            PayloadType::BatchManifest => "batch-manifest",
            PayloadType::SingleFileBatchManifest => "single-file-batch-manifest",
            PayloadType::ContainerBatchManifest => "container-batch-manifest",
            PayloadType::Bag => "bag",
            PayloadType::BagBatchManifest => "bag-batch-manifest",
        }
    }

    /// A type by Lading's name, or by the name Merritt's ingest service writes.
    pub fn parse(s: &str) -> Option<PayloadType> {
        let s = match s {
            "batchManifest" => "batch-manifest",
            "batchManifestFile" => "single-file-batch-manifest",
            "batchManifestContainer" => "container-batch-manifest",
            s => s,
        };
        PayloadType::ALL.iter().copied().find(|t| t.name() == s)
    }
}

/// A submission, as the CLI and the HTTP API take it.
#[derive(Debug, Clone, Default)]
pub struct Submission {
    pub profile: String,
    pub submitter: String,
    pub payload_url: String,
    /// A [`PayloadType`] name.
    pub payload_type: String,
    pub title: Option<String>,
    pub creator: Option<String>,
    pub date: Option<String>,
    pub local_id: Option<String>,
    pub primary_id: Option<String>,
    /// Whose URLs these are: a depositor's (through the API) are held to the payload policy.
    pub trust: Trust,
}

/// Why a submission was refused (nothing was stored).
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error(transparent)]
    Profile(#[from] crate::config::ConfigError),
    #[error(
        "unknown payload type {0:?} (one of: file, container, manifest, batch-manifest, single-file-batch-manifest, container-batch-manifest, bag, bag-batch-manifest)"
    )]
    PayloadType(String),
    #[error("payload URL: {0}")]
    Url(String),
    #[error("submitter is empty")]
    Submitter,
    #[error("payload URL {url:?} refused by the payload policy: {why}")]
    Policy { url: String, why: String },
    #[error("primary identifier: {0}")]
    PrimaryId(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("inventory: {0}")]
    Inventory(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Checks a submission against the profiles and creates its batch, Pending.
pub async fn submit(ingest: &Ingest, s: &Submission) -> Result<BatchId, SubmitError> {
    submit_keeping(ingest, s, Map::new()).await
}

/// [`submit`], keeping `form` (fields a front door took but Lading does not use, such as
/// Merritt's `note` and `notification`) with the batch's submission under `"form"`.
pub async fn submit_keeping(
    ingest: &Ingest,
    s: &Submission,
    form: Map<String, Value>,
) -> Result<BatchId, SubmitError> {
    let profile = ingest.profile(&s.profile)?;
    if PayloadType::parse(&s.payload_type).is_none() {
        return Err(SubmitError::PayloadType(s.payload_type.clone()));
    }
    checkm::check_url(&s.payload_url).map_err(SubmitError::Url)?;
    if s.submitter.trim().is_empty() {
        return Err(SubmitError::Submitter);
    }
    if let Trust::Depositor { upload } = &s.trust
        && upload.as_deref() != Some(s.payload_url.as_str())
    {
        ingest
            .fetcher
            .policy()
            .check(&s.payload_url)
            .map_err(|r| SubmitError::Policy {
                url: s.payload_url.clone(),
                why: r.0,
            })?;
    }
    if let Some(id) = s.primary_id.as_deref() {
        check_primary_id(id).map_err(SubmitError::PrimaryId)?;
        let owner = crate::inventory::owner_of(&ingest.inventory, id)
            .await
            .map_err(|e| SubmitError::Inventory(e.to_string()))?;
        if let Some(owner) = owner
            && owner != profile.collection
        {
            return Err(SubmitError::Forbidden(format!(
                "{id} belongs to another collection; profile {} (collection {}) may not add a version to it",
                profile.name, profile.collection
            )));
        }
    }
    let sub = BatchSubmission {
        profile_name: Some(profile.name.clone()),
        collection: Some(profile.collection.clone()),
        submitter: Some(s.submitter.clone()),
        payload_url: Some(s.payload_url.clone()),
        payload_type: Some(s.payload_type.clone()),
        submission_mode: Some("add".into()),
        response_type: Some("json".into()),
        erc: ErcMetadata {
            erc_what: s.title.clone(),
            erc_who: s.creator.clone(),
            erc_when: s.date.clone(),
            erc_where: None,
        },
        local_id: s.local_id.clone(),
        primary_id: s.primary_id.clone(),
        trust: s.trust.fields(),
        extra: if form.is_empty() {
            Map::new()
        } else {
            Map::from_iter([("form".to_string(), Value::Object(form))])
        },
    };
    Ok(ingest.engine.create_batch(sub).await?)
}

/// A depositor's manifest row `row_url` (line `line` of the manifest at `url`), held to the
/// payload policy before any file is fetched. A row naming a file beside an uploaded manifest
/// is named as such: an upload brings only the manifest.
pub(crate) fn check_depositor_row(
    ingest: &Ingest,
    trust: &Trust,
    url: &str,
    line: usize,
    row_url: &str,
) -> Result<(), Outcome> {
    if let Trust::Depositor { upload: Some(u) } = trust
        && let Some((dir, _)) = u.rsplit_once('/')
        && let Some(name) = row_url.strip_prefix(&format!("{dir}/"))
    {
        return Err(Outcome::fatal(format!(
            "{url}: manifest line {line}: {name:?} names a file beside the uploaded manifest, \
             and an upload brings only the manifest: its rows must be http(s) URLs the server \
             may fetch. To send the files themselves, upload a zip or tar of them (type \
             container)"
        )));
    }
    if let Err(why) = ingest.fetcher.policy().check(row_url) {
        return Err(Outcome::fatal(format!(
            "{url}: manifest line {line}: {row_url:?} refused by the payload policy: {why}"
        )));
    }
    Ok(())
}

/// Longest primary identifier taken (it names a folder in the storage root).
pub const MAX_PRIMARY_ID_BYTES: usize = 200;

/// A primary identifier that can name an object's folder, or why not.
pub fn check_primary_id(id: &str) -> Result<(), String> {
    let node = lading_core::layout::ark_node_name(id);
    if id.trim().is_empty() {
        return Err("it is empty".into());
    }
    if id.len() > MAX_PRIMARY_ID_BYTES {
        return Err(format!(
            "it is {} bytes, over the limit of {MAX_PRIMARY_ID_BYTES}",
            id.len()
        ));
    }
    if id.chars().any(char::is_control) {
        return Err(format!("{id:?} contains control characters"));
    }
    if id.starts_with('.') || id.contains('\\') {
        return Err(format!(
            "{id:?} cannot name an object (no leading '.', no '\\')"
        ));
    }
    // One name per object in every layer: an object store drops a key's leading '/' and
    // empty segments (so `/ark:/…` would share `ark:/…`'s keys), and '|' separates the
    // parts of Merritt's storage keys (`ARK|VERSION|PATH`).
    if id.contains('|') {
        return Err(format!(
            "{id:?} contains '|', which separates the parts of a storage key"
        ));
    }
    if id.starts_with('/') || id.ends_with('/') || id.contains("//") || id != id.trim() {
        return Err(format!(
            "{id:?} is not in its one canonical form (no leading or trailing '/' or space, no '//')"
        ));
    }
    if node.len() > 255 {
        return Err(format!(
            "{id:?} would need a folder name of {} bytes once escaped (255 at most)",
            node.len()
        ));
    }
    Ok(())
}

/// Batch intake: Pending batch → jobs → Processing.
pub struct Intake(pub Arc<Ingest>);

/// One object of a batch, before it is a job.
struct Object {
    payload_type: &'static str,
    payload_url: String,
    file: Option<FileEntry>,
    identifiers: Identifiers,
    metadata: ErcMetadata,
}

fn row_object(row: &Row, payload_type: &'static str) -> Result<Object, checkm::ManifestError> {
    let file = row.file_entry()?;
    Ok(Object {
        payload_type,
        payload_url: file.url.clone(),
        file: (payload_type != "manifest").then_some(file),
        identifiers: Identifiers {
            primary_id: row.get(checkm::PRIMARY_ID).map(str::to_string),
            local_id: row
                .get(checkm::LOCAL_ID)
                .map(|s| vec![s.to_string()])
                .unwrap_or_default(),
            ..Identifiers::default()
        },
        metadata: ErcMetadata {
            erc_who: row.get(checkm::CREATOR).map(str::to_string),
            erc_what: row.get(checkm::TITLE).map(str::to_string),
            erc_when: row.get(checkm::DATE).map(str::to_string),
            erc_where: row.get(checkm::PRIMARY_ID).map(str::to_string),
        },
    })
}

/// Jobs one intake creates at once.
const INTAKE_CONCURRENCY: usize = 16;

/// The outcome to stop with when a creation failed.
fn created(
    r: Result<Result<lading_core::layout::JobId, EngineError>, tokio::task::JoinError>,
) -> Option<Outcome> {
    match r {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(e.into()),
        Err(e) => Some(Outcome::Transient(format!("creating a job: {e}"))),
    }
}

/// The payload of a submission: its `payload_url`, or, for one made by Merritt's ingest
/// service, its `filename` (see [`merritt_package`]).
fn payload_url(ingest: &Ingest, sub: &BatchSubmission) -> Result<String, Outcome> {
    if let Some(u) = &sub.payload_url {
        return Ok(u.clone());
    }
    match sub.merritt_filename() {
        Some(name) => merritt_package(ingest, name),
        None => Err(Outcome::fatal(
            "the submission has no payload_url (nor a Merritt filename)",
        )),
    }
}

/// The URL of Merritt's package `name` (a file on Merritt's ingest storage, as its ingest
/// service names a batch's or a job's payload) under the configured
/// `merritt_package_root`, never outside it.
pub(crate) fn merritt_package(ingest: &Ingest, name: &str) -> Result<String, Outcome> {
    let Some(root) = &ingest.cfg.merritt_package_root else {
        return Err(Outcome::fatal(format!(
            "the submission names a Merritt package ({name:?}) but merritt_package_root is not configured"
        )));
    };
    let root = std::fs::canonicalize(root)
        .map_err(|e| Outcome::fatal(format!("merritt_package_root {}: {e}", root.display())))?;
    let path = std::fs::canonicalize(root.join(name))
        .map_err(|e| Outcome::fatal(format!("Merritt package {name:?}: {e}")))?;
    if !path.starts_with(&root) || !path.is_file() {
        return Err(Outcome::fatal(format!(
            "Merritt package {name:?} is not a file inside merritt_package_root"
        )));
    }
    Ok(format!("file://{}", path.display()))
}

impl Intake {
    async fn objects(&self, b: &BatchCtx) -> Result<Vec<Object>, Outcome> {
        let sub = b.submission()?;
        let url = payload_url(&self.0, sub)?;
        let ty_name = sub.payload_type.as_deref().unwrap_or("file");
        let ty = PayloadType::parse(ty_name)
            .ok_or_else(|| Outcome::fatal(SubmitError::PayloadType(ty_name.into())))?;
        let single = |payload_type: &'static str| -> Result<Vec<Object>, Outcome> {
            let name = checkm::url_file_name(&url)
                .ok_or_else(|| Outcome::fatal(format!("no file name in payload URL {url:?}")))?;
            Ok(vec![Object {
                payload_type,
                payload_url: url.clone(),
                file: (payload_type != "manifest").then(|| FileEntry {
                    url: url.clone(),
                    name,
                    size: None,
                    digest: None,
                }),
                identifiers: Identifiers {
                    primary_id: sub.primary().map(str::to_string),
                    local_id: sub.local().map(str::to_string).into_iter().collect(),
                    ..Identifiers::default()
                },
                metadata: ErcMetadata {
                    erc_who: sub.creator().map(str::to_string),
                    erc_what: sub.title().map(str::to_string),
                    erc_when: sub.date().map(str::to_string),
                    erc_where: sub.primary().map(str::to_string),
                },
            }])
        };
        let (expected, payload_type) = match ty {
            PayloadType::File => return single("file"),
            PayloadType::Container => return single("container"),
            PayloadType::Manifest => return single("manifest"),
            PayloadType::BatchManifest => (ManifestKind::Batch, "manifest"),
            PayloadType::SingleFileBatchManifest => (ManifestKind::SingleFileBatch, "file"),
            PayloadType::ContainerBatchManifest => (ManifestKind::ContainerBatch, "container"),
            PayloadType::Bag => return single("bag"),
            PayloadType::BagBatchManifest => (ManifestKind::ContainerBatch, "bag"),
        };
        let trust = Trust::from_fields(|k| sub.field(k));
        let text = self
            .0
            .fetcher
            .get_text(&url, &trust)
            .await
            .map_err(fatal_or_transient)?;
        let limits = checkm::Limits::from(self.0.fetcher.limits());
        let base = url.to_string();
        let m = crate::blocking::run(move || checkm::parse_at(&text, &limits, Some(&base)))
            .await
            .map_err(|e| Outcome::Transient(e.to_string()))?
            .map_err(|e| Outcome::fatal(format!("{}: {e}", shown_url(&url))))?;
        if m.kind != expected {
            return Err(Outcome::fatal(format!(
                "{url} is a {} but the batch was submitted as {}",
                m.kind.profile_name(),
                ty.name()
            )));
        }
        if m.rows.is_empty() {
            return Err(Outcome::fatal(format!("{url} lists no objects")));
        }
        let objects: Vec<Object> = m
            .rows
            .iter()
            .map(|r| row_object(r, payload_type))
            .collect::<Result<_, _>>()
            .map_err(|e| Outcome::fatal(format!("{url}: {e}")))?;
        // A depositor's rows are held to the policy before any job exists.
        if let Trust::Depositor { .. } = trust {
            for (o, r) in objects.iter().zip(&m.rows) {
                check_depositor_row(&self.0, &trust, &url, r.line, &o.payload_url)?;
                if let Some(id) = &o.identifiers.primary_id
                    && let Err(why) = check_primary_id(id)
                {
                    return Err(Outcome::fatal(format!(
                        "{url}: manifest line {}: primary identifier: {why}",
                        r.line
                    )));
                }
            }
        }
        Ok(objects)
    }

    async fn run(&self, b: Arc<BatchCtx>) -> Outcome {
        let b = &b;
        let objects = match self.objects(b).await {
            Ok(o) => o,
            Err(o) => return o,
        };
        let sub = match b.submission() {
            Ok(s) => s,
            Err(o) => return o,
        };
        let profile = match self.0.profile(sub.profile().unwrap_or_default()) {
            Ok(p) => p,
            Err(e) => return Outcome::fatal(e),
        };
        let trust = Trust::from_fields(|k| sub.field(k));
        // A retried intake (after a crash or a transient error) skips the objects it made.
        let done: BTreeSet<u64> = match self.existing_rows(b).await {
            Ok(d) => d,
            Err(e) => return e.into(),
        };
        // Jobs are created a few at a time: each creation is durable on its own, and
        // concurrent ones share the store's group commits.
        let mut set = tokio::task::JoinSet::new();
        for (i, o) in objects.into_iter().enumerate() {
            if done.contains(&(i as u64)) {
                continue;
            }
            let mut extra = Map::new();
            extra.insert("local_id".into(), json!(o.identifiers.local_id));
            let cfg = JobConfiguration {
                profile_name: Some(profile.name.clone()),
                collection: Some(profile.collection.clone()),
                submitter: Some(sub.submitter.clone().unwrap_or_default()),
                payload_url: Some(o.payload_url.clone()),
                payload_type: Some(o.payload_type.to_string()),
                response_type: Some(sub.response().unwrap_or("json").to_string()),
                submission_mode: Some("add".into()),
                batch_uuid: sub.merritt_batch_id().map(str::to_string),
                intake_row: Some(i as u64),
                file: o.file.as_ref().map(|f| json!(f)),
                trust: trust.fields(),
                extra,
            };
            let spec = JobSpec {
                configuration: cfg,
                priority: profile.priority,
                space_needed: 0,
                identifiers: o.identifiers,
                metadata: o.metadata,
            };
            if set.len() >= INTAKE_CONCURRENCY
                && let Some(r) = set.join_next().await
                && let Some(o) = created(r)
            {
                return o;
            }
            let b = b.clone();
            set.spawn(async move { b.create_job(spec).await });
        }
        while let Some(r) = set.join_next().await {
            if let Some(o) = created(r) {
                return o;
            }
        }
        Outcome::Done
    }

    async fn existing_rows(&self, b: &BatchCtx) -> Result<BTreeSet<u64>, EngineError> {
        let mut rows = BTreeSet::new();
        for job in b.engine.batch_jobs(b.batch()).await? {
            let cfg = b.engine.job_configuration(&job).await?;
            if let Some(r) = cfg.typed().ok().and_then(|c| c.intake_row) {
                rows.insert(r);
            }
        }
        Ok(rows)
    }
}

impl BatchStage for Intake {
    fn state(&self) -> BatchState {
        BatchState::Pending
    }
    fn success(&self) -> Event<BatchState> {
        Event::To(BatchState::Processing)
    }
    fn run(&self, b: Arc<BatchCtx>) -> BoxFuture<'static, Outcome> {
        let me = Intake(self.0.clone());
        Box::pin(async move { me.run(b).await })
    }
    /// A batch that fails at intake has no jobs and so never reports: its failure is its
    /// report, mailed to the depositor.
    fn on_failure(
        &self,
        b: Arc<BatchCtx>,
        reason: String,
    ) -> BoxFuture<
        'static,
        Option<(
            lading_core::layout::StatusReport,
            Vec<lading_engine::Effect>,
        )>,
    > {
        let ingest = self.0.clone();
        Box::pin(async move { crate::report::intake_failure(&ingest, &b, &reason).await })
    }
}

/// A URL as a message may show it: a server-made upload's `file://` path is not the
/// depositor's business, only its name.
pub fn shown_url(url: &str) -> String {
    match url.strip_prefix("file://") {
        Some(p) => format!(
            "the uploaded file {:?}",
            p.rsplit('/').next().unwrap_or_default()
        ),
        None => url.to_string(),
    }
}

impl From<FetchError> for Outcome {
    fn from(e: FetchError) -> Outcome {
        fatal_or_transient(e)
    }
}

#[cfg(test)]
mod identifier_tests {
    use super::check_primary_id;

    /// Issue 58, item 5: one canonical name per identifier, refused otherwise, so that no
    /// two identifiers share an object store's keys.
    #[test]
    fn identifiers_that_would_share_keys_or_split_a_key_are_refused() {
        assert!(check_primary_id("ark:/99999/sq1").is_ok());
        for bad in [
            "/ark:/99999/sq1",
            "ark:/99999/sq1/",
            "ark:/99999//sq1",
            " ark:/99999/sq1",
            "ark:/99999/vic1|1|producer/x",
        ] {
            let why = check_primary_id(bad).unwrap_err();
            assert!(why.contains(&format!("{bad:?}")), "{why}");
        }
    }
}
