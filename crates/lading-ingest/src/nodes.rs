//! Storage nodes (SPEC §8): numbered places a stored version goes, as Merritt's storage
//! service numbers its cloud nodes. A node is an S3-compatible bucket (through the
//! `object_store` crate, Apache Arrow's) or a folder on this machine.
//!
//! On a bucket, each file of version V of ARK is the key `ARK|V|producer/PATH` (Merritt's
//! shape) and Lading's version record is `ARK|V|system/lading-version.json`, written last: a
//! version without it is not stored yet. On a folder, a version keeps the storage root's
//! layout (`ARK_NAME/vV/producer/PATH`, the record at `ARK_NAME/vV/lading-version.json`).
//!
//! Writes never overwrite: a key is created only when absent (`If-None-Match: *` on a single
//! PUT, and on the completion of a multipart upload: `object_store` completes one with no
//! condition, so that request is made here, signed by its own signer). A key that already holds bytes is read back and accepted only when
//! they are the same. Only [`Node::replace`] (fixity repair) writes over a bad copy.
//!
//! Secrets are read from the environment when a node is opened and kept only inside the
//! client: [`NodeSettings`] holds the names of the variables, never their values.

use crate::bucket::Bucket;
use futures_util::StreamExt;
use object_store::PutPayload;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as Key;
use sha2::Digest;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A node's part size when none is configured.
pub const DEFAULT_PART_SIZE: u64 = 64 << 20;
/// S3's smallest part (but the last).
const MIN_PART_SIZE: u64 = 5 << 20;

/// Where a node keeps its copies.
#[derive(Debug)]
pub enum Place {
    Folder(PathBuf),
    Bucket {
        bucket: String,
        /// Ends with `/` when not empty.
        prefix: String,
        /// The server: S3-compatible ([`crate::bucket::S3`]), or in memory.
        store: Arc<dyn Bucket>,
    },
}

/// An open storage node.
#[derive(Debug)]
pub struct Node {
    pub id: u32,
    pub place: Place,
    pub part_size: u64,
    /// Where it is (its endpoint, or folder), for admins and the log.
    pub address: String,
    /// Set once [`Node::check`] passed in this process.
    checked: std::sync::atomic::AtomicBool,
}

/// A node's failure, named by node (and bucket): `fatal` when no retry can help (wrong
/// credentials, a missing bucket, access denied).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{what}")]
pub struct NodeError {
    pub what: String,
    pub fatal: bool,
    /// The node is unavailable (SPEC §11): why, in plain words.
    pub down: Option<String>,
}

/// A copy as a node holds it: size and SHA-256 (hex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copy {
    pub size: u64,
    pub sha256: String,
}

/// What a HEAD shows of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub size: u64,
    pub etag: Option<String>,
    pub modified_ms: i64,
}

/// A copy being read: a local file, or a bucket's response body.
pub enum Reader {
    File(std::fs::File),
    Stream(futures_util::stream::BoxStream<'static, object_store::Result<bytes::Bytes>>),
}

/// What [`Node::put_new`] is told of a multipart upload's id, to record it.
pub type UploadNote<'a> = futures_util::future::BoxFuture<'a, Result<(), String>>;

/// The largest version record read (its file list: about 150 bytes a file).
pub const MAX_RECORD_BYTES: u64 = 256 << 20;

/// A node's version record key's path inside the version.
pub const VERSION_RECORD: &str = "system/lading-version.json";

/// Written inside a version an approved deletion removed ([`crate::deletion`]): the version
/// keeps its number and record, and nothing is carried over from it again.
pub const DELETION_MARK: &str = "system/lading-deletion.json";

pub use crate::config::NodeSettings;

impl Node {
    /// Opens a node from its settings, reading its credentials from `env` (only for a
    /// bucket). Names the node and what is wrong.
    pub fn open(s: &NodeSettings, env: impl Fn(&str) -> Option<String>) -> Result<Node, String> {
        let named = |m: String| format!("storage node {}: {m}", s.id);
        let part_size = s.part_size.unwrap_or(DEFAULT_PART_SIZE);
        if part_size < MIN_PART_SIZE {
            return Err(named(format!(
                "part_size {part_size} is below S3's smallest part ({MIN_PART_SIZE} bytes)"
            )));
        }
        let url = url::Url::parse(&s.url)
            .map_err(|e| named(format!("url {:?} is not a URL: {e}", s.url)))?;
        let address;
        let place = match url.scheme() {
            "file" => {
                let p = url
                    .to_file_path()
                    .map_err(|_| named(format!("url {:?} is not a folder path", s.url)))?;
                address = p.display().to_string();
                Place::Folder(p)
            }
            "s3" => {
                let bucket = url.host_str().unwrap_or_default().to_string();
                if bucket.len() < 3 {
                    return Err(named(format!("url {:?} names no bucket", s.url)));
                }
                let prefix = url.path().trim_matches('/');
                let prefix = if prefix.is_empty() {
                    String::new()
                } else {
                    format!("{prefix}/")
                };
                let var = |given: &Option<String>, default: &str| {
                    let name = given.clone().unwrap_or_else(|| default.to_string());
                    env(&name)
                        .filter(|v| !v.is_empty())
                        .ok_or_else(|| named(format!("the credential variable {name} is not set")))
                };
                let checksum = match s.checksum.as_deref().unwrap_or("sha256") {
                    "sha256" => object_store::aws::Checksum::SHA256,
                    "crc64nvme" => object_store::aws::Checksum::CRC64NVME,
                    other => {
                        return Err(named(format!(
                            "checksum {other:?} is not \"sha256\" or \"crc64nvme\""
                        )));
                    }
                };
                let key_id = var(&s.access_key_id_env, "AWS_ACCESS_KEY_ID")?;
                let secret = var(&s.secret_access_key_env, "AWS_SECRET_ACCESS_KEY")?;
                let region = s.region.clone().unwrap_or_else(|| "us-east-1".into());
                let base = match &s.endpoint {
                    Some(ep) => ep.trim_end_matches('/').to_string(),
                    None => format!("https://s3.{region}.amazonaws.com"),
                };
                let mut b = AmazonS3Builder::new()
                    .with_bucket_name(&bucket)
                    .with_region(&region)
                    .with_access_key_id(key_id)
                    .with_secret_access_key(secret)
                    // The server checks each body against its SHA-256 header, which the
                    // signature covers: the body itself need not be hashed again to sign.
                    .with_checksum_algorithm(checksum)
                    .with_unsigned_payload(true)
                    // The stage retries with its own backoff; the client tries briefly.
                    .with_retry(object_store::RetryConfig {
                        max_retries: 2,
                        retry_timeout: Duration::from_secs(20),
                        ..Default::default()
                    })
                    .with_client_options(
                        object_store::ClientOptions::new()
                            .with_connect_timeout(Duration::from_secs(5))
                            .with_timeout(Duration::from_secs(600)),
                    );
                if let Some(ep) = &s.endpoint {
                    b = b
                        .with_endpoint(ep)
                        .with_allow_http(ep.starts_with("http://"))
                        .with_virtual_hosted_style_request(false);
                }
                // A probe is one request: the same client without its retries.
                let probing = (b.clone())
                    .with_retry(object_store::RetryConfig {
                        max_retries: 0,
                        ..Default::default()
                    })
                    .build()
                    .map_err(|e| named(e.to_string()))?;
                let store = b.build().map_err(|e| named(e.to_string()))?;
                address = base.clone();
                Place::Bucket {
                    store: Arc::new(crate::bucket::S3 {
                        store,
                        probing,
                        url: format!("{base}/{bucket}"),
                        region,
                    }),
                    bucket,
                    prefix,
                }
            }
            other => {
                return Err(named(format!(
                    "url scheme {other:?} is not s3:// or file://"
                )));
            }
        };
        Ok(Node {
            id: s.id,
            place,
            part_size,
            address,
            checked: Default::default(),
        })
    }

    /// A bucket node on `store` (the simulator's bucket in memory, or any other
    /// [`Bucket`]), named `bucket`, its keys under `prefix` (empty, or ending with `/`).
    pub fn in_bucket(id: u32, bucket: &str, prefix: &str, store: Arc<dyn Bucket>) -> Node {
        Node {
            id,
            place: Place::Bucket {
                bucket: bucket.into(),
                prefix: prefix.into(),
                store,
            },
            part_size: MIN_PART_SIZE,
            address: format!("bucket {bucket}"),
            checked: Default::default(),
        }
    }

    /// The same node, sending files larger than `part_size` bytes as multipart uploads. No
    /// smallest part is enforced here: for a store without S3's (the simulator's bucket in
    /// memory, whose files are far below 5 MiB).
    pub fn with_part_size(mut self, part_size: u64) -> Node {
        self.part_size = part_size.max(1);
        self
    }

    /// The node as logs and errors name it: its number and bucket or folder.
    pub fn name(&self) -> String {
        match &self.place {
            Place::Folder(p) => format!("storage node {} (folder {})", self.id, p.display()),
            Place::Bucket { bucket, .. } => format!("storage node {} (bucket {bucket})", self.id),
        }
    }

    /// Where version `version` of `ark` is, as the store record names it.
    pub fn version_url(&self, ark: &str, version: u32) -> String {
        match &self.place {
            Place::Folder(root) => self
                .folder_path(root, ark, version, "")
                .display()
                .to_string(),
            Place::Bucket { bucket, prefix, .. } => {
                format!("s3://{bucket}/{prefix}{ark}|{version}|")
            }
        }
    }

    fn folder_path(&self, root: &Path, ark: &str, version: u32, rel: &str) -> PathBuf {
        let d = root
            .join(lading_core::layout::ark_node_name(ark))
            .join(format!("v{version}"));
        match rel {
            "" => d,
            VERSION_RECORD => d.join(crate::files::VERSION_FILE),
            r => d.join(r),
        }
    }

    /// The key of `rel` (`producer/…`, `system/…`) of version `version` of `ark`.
    pub fn key(&self, ark: &str, version: u32, rel: &str) -> Result<Key, NodeError> {
        let prefix = match &self.place {
            Place::Bucket { prefix, .. } => prefix.as_str(),
            Place::Folder(_) => "",
        };
        let raw = format!("{prefix}{ark}|{version}|{rel}");
        Key::parse(&raw).map_err(|e| NodeError {
            what: format!("{}: {raw:?} cannot be a key: {e}", self.name()),
            fatal: true,
            down: None,
        })
    }

    /// Names an `object_store` failure: wrong credentials, a missing bucket, an access
    /// denied and a 4xx about the request (a key the server refuses) are fatal; a refused
    /// connection, a timeout, a 5xx or throttling say the node is unavailable (`down`, with
    /// the cause in plain words; the client's own text goes to the log); anything else may
    /// pass with a retry.
    fn fail(&self, doing: &str, e: object_store::Error) -> NodeError {
        let text = e.to_string();
        if let Some(cause) = crate::weather::object_store_cause(&e) {
            tracing::warn!(node = %self.name(), doing, error = %text, "storage node unavailable");
            return NodeError {
                what: format!("{}: {doing}: unavailable: {cause}", self.name()),
                fatal: false,
                down: Some(cause),
            };
        }
        if let Some(why) = crate::weather::object_store_refused(&e) {
            tracing::warn!(node = %self.name(), doing, error = %text, "storage node refused a request");
            return NodeError {
                what: format!("{}: {doing}: {why}", self.name()),
                fatal: true,
                down: None,
            };
        }
        // By the answer's status where the client maps it; by S3's error codes (words no
        // key holds) where it does not. Never by digits, which an identifier may contain.
        let fatal = matches!(
            e,
            object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. }
        ) || [
            "AccessDenied",
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "NoSuchBucket",
            "InvalidBucketName",
        ]
        .iter()
        .any(|m| text.contains(m));
        // The client's own text names the server's address and the key: it goes to the log
        // only (a job's message is read by its depositor).
        tracing::warn!(node = %self.name(), doing, error = %text, "storage node request failed");
        let why = if text.contains("NoSuchBucket") {
            "the bucket does not exist".to_string()
        } else if fatal {
            "access refused (check its credentials; the log has the server's answer)".to_string()
        } else {
            "the request failed (the log has the server's answer)".to_string()
        };
        NodeError {
            what: format!("{}: {doing}: {why}", self.name()),
            fatal,
            down: None,
        }
    }

    /// The node as a dependency (SPEC §11): `storage-node` NUMBER, at its endpoint or folder.
    pub fn dependency(&self) -> lading_engine::deps::Dependency {
        lading_engine::deps::Dependency::new("storage-node", self.id.to_string(), &self.address)
    }

    fn io(&self, doing: &str, p: &Path, e: std::io::Error) -> NodeError {
        NodeError {
            what: format!("{}: {doing} {}: {e}", self.name(), p.display()),
            fatal: false,
            down: None,
        }
    }

    /// [`Node::check`], once per process: before a node is first written, its credentials
    /// and bucket are checked by a request every S3 server authenticates (a write is not
    /// enough: a server may take an unsigned body from anyone), so wrong credentials and a
    /// missing bucket fail at once and write nothing.
    pub async fn check_once(&self) -> Result<(), NodeError> {
        use std::sync::atomic::Ordering;
        if self.checked.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.check().await?;
        self.checked.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Checks that the node answers and that its credentials may list the bucket (or that
    /// the folder can be made).
    pub async fn check(&self) -> Result<(), NodeError> {
        match &self.place {
            Place::Folder(root) => {
                std::fs::create_dir_all(root).map_err(|e| self.io("creating", root, e))
            }
            Place::Bucket { store, prefix, .. } => {
                let p = Key::parse(prefix.trim_end_matches('/')).unwrap_or_default();
                store.probe(&p).await.map_err(|e| self.fail("listing", e))
            }
        }
    }

    /// What the node holds at `rel` of the version, if anything.
    pub async fn head(
        &self,
        ark: &str,
        version: u32,
        rel: &str,
    ) -> Result<Option<Meta>, NodeError> {
        match &self.place {
            Place::Folder(root) => {
                let p = self.folder_path(root, ark, version, rel);
                match std::fs::metadata(&p) {
                    Ok(m) => Ok(Some(Meta {
                        size: m.len(),
                        etag: None,
                        modified_ms: m
                            .modified()
                            .ok()
                            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                            .map_or(0, |d| d.as_millis() as i64),
                    })),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(self.io("reading", &p, e)),
                }
            }
            Place::Bucket { store, .. } => {
                let key = self.key(ark, version, rel)?;
                match store.head(&key).await {
                    Ok(m) => Ok(Some(Meta {
                        size: m.size,
                        etag: m.e_tag,
                        modified_ms: m.last_modified.timestamp_millis(),
                    })),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(self.fail(&format!("HEAD {key}"), e)),
                }
            }
        }
    }

    /// Reads `rel` of the version back: its size and SHA-256, or None when it is missing.
    /// At most `pace` bytes a second when given (the fixity audit's bound).
    pub async fn digest(
        &self,
        ark: &str,
        version: u32,
        rel: &str,
        pace: Option<u64>,
    ) -> Result<Option<Copy>, NodeError> {
        let mut h = sha2::Sha256::new();
        let mut size = 0u64;
        let start = tokio::time::Instant::now();
        let mut paced = |n: usize| {
            size += n as u64;
            pace.filter(|&b| b > 0).map(|b| {
                Duration::from_secs_f64(size as f64 / b as f64).saturating_sub(start.elapsed())
            })
        };
        match &self.place {
            Place::Folder(root) => {
                let p = self.folder_path(root, ark, version, rel);
                let Some(mut f) = Chunks::open(&p)
                    .await
                    .map_err(|e| self.io("opening", &p, e))?
                else {
                    return Ok(None);
                };
                loop {
                    let chunk = f.next().await.map_err(|e| self.io("reading", &p, e))?;
                    let n = chunk.len();
                    if n == 0 {
                        break;
                    }
                    h.update(chunk);
                    if let Some(d) = paced(n).filter(|d| !d.is_zero()) {
                        tokio::time::sleep(d).await;
                    }
                }
            }
            Place::Bucket { store, .. } => {
                let key = self.key(ark, version, rel)?;
                let got = match store.get(&key).await {
                    Ok(g) => g,
                    Err(object_store::Error::NotFound { .. }) => return Ok(None),
                    Err(e) => return Err(self.fail(&format!("GET {key}"), e)),
                };
                let mut s = got.into_stream();
                while let Some(chunk) = s.next().await {
                    let chunk = chunk.map_err(|e| self.fail(&format!("GET {key}"), e))?;
                    h.update(&chunk);
                    if let Some(d) = paced(chunk.len()).filter(|d| !d.is_zero()) {
                        tokio::time::sleep(d).await;
                    }
                }
            }
        }
        Ok(Some(Copy {
            size,
            sha256: hex(&h.finalize()),
        }))
    }

    /// The whole of a small key (a version record), or None.
    pub async fn read_small(
        &self,
        ark: &str,
        version: u32,
        rel: &str,
    ) -> Result<Option<Vec<u8>>, NodeError> {
        // A record is read whole: one larger than this is named, not read.
        let too_big = |size: u64| NodeError {
            what: format!(
                "{}: {ark}|{version}|{rel} holds {size} bytes, more than a record may ({MAX_RECORD_BYTES})",
                self.name()
            ),
            fatal: true,
            down: None,
        };
        match &self.place {
            Place::Folder(root) => {
                let p = self.folder_path(root, ark, version, rel);
                match std::fs::metadata(&p) {
                    Ok(m) if m.len() > MAX_RECORD_BYTES => return Err(too_big(m.len())),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    _ => {}
                }
                match std::fs::read(&p) {
                    Ok(b) => Ok(Some(b)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(self.io("reading", &p, e)),
                }
            }
            Place::Bucket { store, .. } => {
                let key = self.key(ark, version, rel)?;
                match store.get(&key).await {
                    Ok(g) if g.meta.size > MAX_RECORD_BYTES => Err(too_big(g.meta.size)),
                    Ok(g) => g
                        .bytes()
                        .await
                        .map(|b| Some(b.to_vec()))
                        .map_err(|e| self.fail(&format!("GET {key}"), e)),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(self.fail(&format!("GET {key}"), e)),
                }
            }
        }
    }

    /// Streams `rel` of the version into `out` (a download, a zip entry, a replica's
    /// source); false when the node lacks it.
    pub async fn read_into(
        &self,
        ark: &str,
        version: u32,
        rel: &str,
        out: &mut (dyn tokio::io::AsyncWrite + Unpin + Send),
    ) -> Result<bool, NodeError> {
        use tokio::io::AsyncWriteExt;
        match &self.place {
            Place::Folder(root) => {
                let p = self.folder_path(root, ark, version, rel);
                let Some(mut f) = Chunks::open(&p)
                    .await
                    .map_err(|e| self.io("opening", &p, e))?
                else {
                    return Ok(false);
                };
                loop {
                    let chunk = f.next().await.map_err(|e| self.io("reading", &p, e))?;
                    if chunk.is_empty() {
                        break;
                    }
                    out.write_all(chunk).await.map_err(|e| NodeError {
                        what: format!("{}: writing what {} holds: {e}", self.name(), p.display()),
                        fatal: false,
                        down: None,
                    })?;
                }
            }
            Place::Bucket { store, .. } => {
                let key = self.key(ark, version, rel)?;
                let got = match store.get(&key).await {
                    Ok(g) => g,
                    Err(object_store::Error::NotFound { .. }) => return Ok(false),
                    Err(e) => return Err(self.fail(&format!("GET {key}"), e)),
                };
                let mut s = got.into_stream();
                while let Some(chunk) = s.next().await {
                    let chunk = chunk.map_err(|e| self.fail(&format!("GET {key}"), e))?;
                    out.write_all(&chunk).await.map_err(|e| NodeError {
                        what: format!("{}: writing what {key} holds: {e}", self.name()),
                        fatal: false,
                        down: None,
                    })?;
                }
            }
        }
        Ok(true)
    }

    /// Opens `rel` of the version for reading (a zip entry, a download), or None when the
    /// node lacks it.
    pub async fn open_read(
        &self,
        ark: &str,
        version: u32,
        rel: &str,
    ) -> Result<Option<Reader>, NodeError> {
        match &self.place {
            Place::Folder(root) => {
                let p = self.folder_path(root, ark, version, rel);
                match std::fs::File::open(&p) {
                    Ok(f) => Ok(Some(Reader::File(f))),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(self.io("opening", &p, e)),
                }
            }
            Place::Bucket { store, .. } => {
                let key = self.key(ark, version, rel)?;
                match store.get(&key).await {
                    Ok(g) => Ok(Some(Reader::Stream(g.into_stream()))),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(self.fail(&format!("GET {key}"), e)),
                }
            }
        }
    }

    /// The versions of `ark` the node holds a version record of, ascending.
    pub async fn versions(&self, ark: &str) -> Result<Vec<u32>, NodeError> {
        match &self.place {
            Place::Folder(root) => {
                let d = root.join(lading_core::layout::ark_node_name(ark));
                let mut v = crate::files::versions(&d).map_err(|e| self.io("reading", &d, e))?;
                v.retain(|n| self.folder_path(root, ark, *n, VERSION_RECORD).exists());
                Ok(v)
            }
            Place::Bucket { .. } => {
                // Versions are made one after another under the object's storage lock, so
                // they are found by asking for each record in turn: a listing would read
                // every object sharing the ark's shoulder.
                let mut out = Vec::new();
                for n in 1.. {
                    if self.head(ark, n, VERSION_RECORD).await?.is_none() {
                        break;
                    }
                    out.push(n);
                }
                Ok(out)
            }
        }
    }
}

pub(crate) fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    b.iter()
        .fold(String::with_capacity(b.len() * 2), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
}

/// The configured nodes, opened.
#[derive(Debug, Default)]
pub struct Nodes {
    map: BTreeMap<u32, Arc<Node>>,
}

impl Nodes {
    /// Opens every `[[storage_nodes]]` entry (credentials from `env`);
    /// a repeated id or a bad entry is named.
    pub fn open(
        settings: &[NodeSettings],
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Nodes, String> {
        let mut map = BTreeMap::new();
        for s in settings {
            let n = Node::open(s, &env)?;
            if map.insert(s.id, Arc::new(n)).is_some() {
                return Err(format!("storage node {} is configured twice", s.id));
            }
        }
        Ok(Nodes { map })
    }

    /// Adds (or replaces) a node opened otherwise ([`Node::in_bucket`]).
    pub fn insert(&mut self, node: Node) {
        self.map.insert(node.id, Arc::new(node));
    }

    pub fn get(&self, id: u32) -> Option<&Arc<Node>> {
        self.map.get(&id)
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<Node>> {
        self.map.values()
    }

    /// The nodes a profile names, primary first; an id the config lacks is named.
    pub fn of_profile(&self, p: &crate::Profile) -> Result<Vec<Arc<Node>>, String> {
        for ids in p.storage_options.values() {
            self.of_ids(ids, &p.name)?;
        }
        self.of_ids(&p.storage_nodes, &p.name)
    }

    /// The nodes `ids` names (profile `profile`'s), first the primary.
    pub fn of_ids(&self, ids: &[u32], profile: &str) -> Result<Vec<Arc<Node>>, String> {
        ids.iter()
            .map(|id| {
                self.get(*id).cloned().ok_or_else(|| {
                    format!(
                        "profile {profile} names storage node {id}, which the config's [[storage_nodes]] lacks"
                    )
                })
            })
            .collect()
    }
}

/// A folder node's file, read in chunks off the async threads (in place in the simulator:
/// see [`crate::blocking`]).
struct Chunks {
    file: Option<std::fs::File>,
    buf: Vec<u8>,
}

impl Chunks {
    /// None when there is no such file.
    async fn open(p: &Path) -> std::io::Result<Option<Chunks>> {
        let p = p.to_path_buf();
        let opened = crate::blocking::io(move || {
            let f = std::fs::File::open(p)?;
            let len = f.metadata()?.len();
            Ok((f, len))
        })
        .await;
        match opened {
            // A buffer the file's size (one byte more, to see its end in one read), at most
            // 1 MiB: a zeroed 1 MiB per small file was a twentieth of a simulated run.
            Ok((f, len)) => Ok(Some(Chunks {
                file: Some(f),
                buf: vec![0; crate::files::read_buffer(len, 1 << 20)],
            })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The next chunk; empty at the end.
    async fn next(&mut self) -> std::io::Result<&[u8]> {
        let Some(mut f) = self.file.take() else {
            return Ok(&[]);
        };
        let mut buf = std::mem::take(&mut self.buf);
        let (f, buf, n) = crate::blocking::io(move || {
            use std::io::Read;
            let n = f.read(&mut buf)?;
            Ok((f, buf, n))
        })
        .await?;
        self.file = Some(f);
        self.buf = buf;
        Ok(&self.buf[..n])
    }
}

mod write;

#[cfg(test)]
mod tests;
