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

    /// Puts the local file `src` at `rel` of the version unless the key exists. A key that
    /// exists with the same bytes counts as written (`already`); with other bytes it is an
    /// error no retry fixes. `upload` is told a multipart upload's id as soon as it is made
    /// (and `None` once it is finished or aborted), so a successor can abort one left open.
    pub async fn put_new<'a>(
        &self,
        ark: &str,
        version: u32,
        rel: &str,
        src: &Path,
        upload: &mut (dyn FnMut(Option<String>) -> UploadNote<'a> + Send + 'a),
    ) -> Result<(Copy, bool), NodeError> {
        self.check_once().await?;
        let hash_file = || async {
            let p = src.to_path_buf();
            let (size, sha256) = crate::blocking::run(move || crate::files::file_sha256(&p))
                .await
                .map_err(|e| NodeError {
                    what: e.to_string(),
                    fatal: false,
                    down: None,
                })?
                .map_err(|e| self.io("reading", src, e))?;
            Ok::<Copy, NodeError>(Copy { size, sha256 })
        };
        // A single PUT is itself conditional; a folder copy and a multipart upload (whose
        // parts would go up for nothing) look first.
        let single = match &self.place {
            Place::Bucket { .. } => std::fs::metadata(src)
                .map_err(|e| self.io("reading", src, e))?
                .len()
                .le(&self.part_size),
            Place::Folder(_) => false,
        };
        if !single && let Some(have) = self.head(ark, version, rel).await? {
            let want = hash_file().await?;
            return self
                .same_or_conflict(ark, version, rel, want, have.size)
                .await;
        }
        match &self.place {
            Place::Folder(root) => {
                let want = hash_file().await?;
                let dst = self.folder_path(root, ark, version, rel);
                let (src, d2) = (src.to_path_buf(), dst.clone());
                let r = crate::blocking::run(move || copy_new(&src, &d2))
                    .await
                    .map_err(|e| NodeError {
                        what: e.to_string(),
                        fatal: false,
                        down: None,
                    })?;
                match r {
                    Ok(()) => Ok((want, false)),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        self.same_or_conflict(ark, version, rel, want, 0).await
                    }
                    Err(e) => Err(self.io("writing", &dst, e)),
                }
            }
            Place::Bucket { store, .. } => {
                let key = self.key(ark, version, rel)?;
                let size = std::fs::metadata(src)
                    .map_err(|e| self.io("reading", src, e))?
                    .len();
                // The file is read once: hashed as it goes up.
                let (r, want) = if size <= self.part_size {
                    let bytes = crate::blocking::read(src.to_path_buf())
                        .await
                        .map_err(|e| self.io("reading", src, e))?;
                    // Hashed while it goes up (the node checks its own SHA-256 of it).
                    let bytes = bytes::Bytes::from(bytes);
                    let len = bytes.len() as u64;
                    let b2 = bytes.clone();
                    let hashing = tokio::spawn(crate::blocking::run(move || {
                        hex(&sha2::Sha256::digest(&b2))
                    }));
                    let r = store.put_new(&key, PutPayload::from(bytes)).await;
                    let want = Copy {
                        size: len,
                        sha256: hashing
                            .await
                            .map_err(|e| e.to_string())
                            .and_then(|h| h.map_err(|e| e.to_string()))
                            .map_err(|what| NodeError {
                                what,
                                fatal: false,
                                down: None,
                            })?,
                    };
                    (r, want)
                } else {
                    self.multipart(store.as_ref(), &key, src, upload, true)
                        .await?
                };
                match r {
                    Ok(()) => {}
                    Err(
                        object_store::Error::AlreadyExists { .. }
                        | object_store::Error::Precondition { .. },
                    ) => {
                        return self.same_or_conflict(ark, version, rel, want, 0).await;
                    }
                    Err(e) => return Err(self.fail(&format!("PUT {key}"), e)),
                }
                // The server checked the body against the request's checksum, so a single
                // PUT that succeeded holds what was sent; a multipart upload's size is
                // checked here.
                if single {
                    return Ok((want, false));
                }
                match self.head(ark, version, rel).await? {
                    Some(m) if m.size == want.size => Ok((want, false)),
                    Some(m) => Err(NodeError {
                        what: format!(
                            "{}: {key} holds {} bytes after writing {}",
                            self.name(),
                            m.size,
                            want.size
                        ),
                        fatal: false,
                        down: None,
                    }),
                    None => Err(NodeError {
                        what: format!("{}: {key} is missing after it was written", self.name()),
                        fatal: false,
                        down: None,
                    }),
                }
            }
        }
    }

    /// A key that exists: the same bytes count as written; other bytes are a conflict.
    async fn same_or_conflict(
        &self,
        ark: &str,
        version: u32,
        rel: &str,
        want: Copy,
        size_hint: u64,
    ) -> Result<(Copy, bool), NodeError> {
        if (size_hint == 0 || size_hint == want.size)
            && let Some(have) = self.digest(ark, version, rel, None).await?
            && have == want
        {
            return Ok((want, true));
        }
        Err(NodeError {
            what: format!(
                "{}: {ark}|{version}|{rel} already holds other bytes; a stored version is never overwritten",
                self.name()
            ),
            fatal: true,
            down: None,
        })
    }

    /// A multipart upload of `src`, part by part (one part in memory at a time), completed
    /// only if the key is still absent; aborted on any failure.
    async fn multipart<'a>(
        &self,
        store: &dyn Bucket,
        key: &Key,
        src: &Path,
        upload: &mut (dyn FnMut(Option<String>) -> UploadNote<'a> + Send + 'a),
        if_absent: bool,
    ) -> Result<(Result<(), object_store::Error>, Copy), NodeError> {
        let id = match store.create_multipart(key).await {
            Ok(id) => id,
            Err(e) => return Err(self.fail(&format!("starting an upload of {key}"), e)),
        };
        if let Err(what) = upload(Some(id.clone())).await {
            // Not recorded, so no successor could abort it: aborted here.
            let _ = store.abort_multipart(key, &id).await;
            return Err(NodeError {
                what,
                fatal: false,
                down: None,
            });
        }
        let mut hasher = sha2::Sha256::new();
        let mut size = 0u64;
        let r: Result<(), object_store::Error> = async {
            let local = |e: std::io::Error| object_store::Error::Generic {
                store: "local",
                source: Box::new(e),
            };
            // Read and hashed through `crate::blocking` (in place where the simulator asks:
            // `tokio::fs` ends its work on another thread whenever the system says, so a
            // simulated run would not repeat).
            let src = src.to_path_buf();
            let mut f = crate::blocking::io(move || std::fs::File::open(src))
                .await
                .map_err(local)?;
            let part_size = self.part_size;
            let mut parts = Vec::new();
            loop {
                let h = std::mem::take(&mut hasher);
                let (file, buf, h) = crate::blocking::io(move || {
                    use std::io::Read;
                    let mut buf = Vec::with_capacity(part_size.min(64 << 20) as usize);
                    (&mut f).take(part_size).read_to_end(&mut buf)?;
                    let mut h = h;
                    h.update(&buf);
                    Ok((f, buf, h))
                })
                .await
                .map_err(local)?;
                f = file;
                hasher = h;
                if buf.is_empty() && !parts.is_empty() {
                    break;
                }
                let last = (buf.len() as u64) < part_size;
                size += buf.len() as u64;
                parts.push(
                    store
                        .put_part(key, &id, parts.len(), PutPayload::from(buf))
                        .await?,
                );
                if last {
                    break;
                }
            }
            // Cheap first; the completion itself is conditional too (a server that ignores
            // the condition still had this look).
            if if_absent && store.head(key).await.is_ok() {
                return Err(object_store::Error::AlreadyExists {
                    path: key.to_string(),
                    source: "the key appeared while its parts went up".into(),
                });
            }
            store.complete(key, &id, parts, if_absent).await
        }
        .await;
        // The recorded id goes once the upload is completed or aborted; an abort that fails
        // (the node is down) leaves it recorded for the next attempt to abort.
        if r.is_ok() || store.abort_multipart(key, &id).await.is_ok() {
            let _ = upload(None).await;
        }
        let want = Copy {
            size,
            sha256: hex(&hasher.finalize()),
        };
        Ok((r, want))
    }

    /// Aborts a multipart upload a predecessor left (an upload that finished or was aborted
    /// already is not an error). False when the node answered otherwise (the upload stays
    /// recorded); an error when the node is unavailable, to be waited for.
    pub async fn abort_upload(
        &self,
        ark: &str,
        version: u32,
        rel: &str,
        id: &str,
    ) -> Result<bool, NodeError> {
        if let Place::Bucket { store, .. } = &self.place
            && let Ok(key) = self.key(ark, version, rel)
        {
            // Gone only when the server says so: any other failure keeps it recorded.
            return match store.abort_multipart(&key, id).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(true),
                Err(e) => {
                    let e = self.fail("aborting an earlier attempt's upload", e);
                    if e.down.is_some() { Err(e) } else { Ok(false) }
                }
            };
        }
        Ok(true)
    }

    /// Aborts every multipart upload open under version `version` of `ark`, including those
    /// whose id no one learned (the client retries starting an upload when the answer is
    /// lost, so a server that dies mid-answer keeps one nobody recorded). Only the job that
    /// holds the version writes under it, so every such upload is its own or a fenced
    /// predecessor's. Returns how many were aborted.
    pub async fn abort_open_uploads(&self, ark: &str, version: u32) -> Result<usize, NodeError> {
        if let Place::Folder(_) = &self.place {
            return Ok(0);
        }
        let prefix = self.key(ark, version, "")?.to_string();
        self.abort_uploads_where(&prefix, |_| true).await
    }

    /// Aborts every multipart upload open on this node that began before `before_ms`
    /// (epoch ms, by the server's clock), whoever began it: an attempt that lost its lease
    /// and began one after the winner's last sweep, or a process that died between beginning
    /// one and aborting it. No writer keeps an upload open that long (see `[fixity]
    /// abort_uploads_after_s`). Uploads whose start the server does not date are left.
    /// Returns how many were aborted.
    pub async fn abort_abandoned_uploads(&self, before_ms: u64) -> Result<usize, NodeError> {
        let prefix = match &self.place {
            Place::Bucket { prefix, .. } => prefix.clone(),
            Place::Folder(_) => return Ok(0),
        };
        self.abort_uploads_where(&prefix, |u| u.initiated_ms.is_some_and(|t| t < before_ms))
            .await
    }

    /// Aborts the uploads open under `prefix` that `pick` picks.
    async fn abort_uploads_where(
        &self,
        prefix: &str,
        pick: impl Fn(&crate::bucket::OpenUpload) -> bool,
    ) -> Result<usize, NodeError> {
        let Place::Bucket { store, .. } = &self.place else {
            return Ok(0);
        };
        let mut aborted = 0;
        let mut marker: Option<(String, String)> = None;
        loop {
            let (open, next) =
                store
                    .list_uploads(prefix, marker.take())
                    .await
                    .map_err(|f| match f.down {
                        Some(cause) => NodeError {
                            what: format!(
                                "{}: listing open uploads: unavailable: {cause}",
                                self.name()
                            ),
                            fatal: false,
                            down: Some(cause),
                        },
                        None => NodeError {
                            what: format!("{}: listing open uploads: {}", self.name(), f.what),
                            fatal: f.fatal,
                            down: None,
                        },
                    })?;
            // Only keys under the prefix (S3 matches it as bytes), and only those picked.
            for u in open.iter().filter(|u| u.key.starts_with(prefix) && pick(u)) {
                let k = Key::parse(&u.key).map_err(|e| NodeError {
                    what: format!("{}: an open upload's key {:?}: {e}", self.name(), u.key),
                    fatal: false,
                    down: None,
                })?;
                match store.abort_multipart(&k, &u.id).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => aborted += 1,
                    Err(e) => {
                        return Err(self.fail(&format!("aborting the upload of {}", u.key), e));
                    }
                }
            }
            match next {
                Some(m) => marker = Some(m),
                None => return Ok(aborted),
            }
        }
    }

    /// Writes `src` over whatever `rel` of the version holds (fixity repair only, with a
    /// copy verified elsewhere), then reads it back.
    pub async fn replace(
        &self,
        ark: &str,
        version: u32,
        rel: &str,
        src: &Path,
    ) -> Result<Option<Copy>, NodeError> {
        match &self.place {
            Place::Folder(root) => {
                let dst = self.folder_path(root, ark, version, rel);
                let (s2, d2) = (src.to_path_buf(), dst.clone());
                crate::blocking::io(move || -> std::io::Result<()> {
                    let tmp = d2.with_extension("repair-tmp");
                    if let Some(p) = d2.parent() {
                        std::fs::create_dir_all(p)?;
                    }
                    std::fs::copy(&s2, &tmp)?;
                    std::fs::File::open(&tmp)?.sync_all()?;
                    std::fs::rename(&tmp, &d2)
                })
                .await
                .map_err(|e| self.io("writing", &dst, e))?;
            }
            Place::Bucket { store, .. } => {
                let key = self.key(ark, version, rel)?;
                let size = std::fs::metadata(src)
                    .map_err(|e| self.io("reading", src, e))?
                    .len();
                if size <= self.part_size {
                    let bytes = crate::blocking::read(src.to_path_buf())
                        .await
                        .map_err(|e| self.io("reading", src, e))?;
                    store
                        .put(&key, PutPayload::from(bytes))
                        .await
                        .map_err(|e| self.fail(&format!("PUT {key}"), e))?;
                } else {
                    let (r, _) = self
                        .multipart(
                            store.as_ref(),
                            &key,
                            src,
                            &mut |_| Box::pin(async { Ok(()) }),
                            false,
                        )
                        .await?;
                    r.map_err(|e| self.fail(&format!("PUT {key}"), e))?;
                }
            }
        }
        self.digest(ark, version, rel, None).await
    }
}

/// Copies `src` to `dst` (made through a temporary name, synced) only if `dst` is absent:
/// the final name is a hard link, which fails when it exists.
fn copy_new(src: &Path, dst: &Path) -> std::io::Result<()> {
    if let Some(p) = dst.parent() {
        std::fs::create_dir_all(p)?;
    }
    let tmp = dst.with_file_name(format!(
        ".{}.part-{}",
        dst.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    std::fs::copy(src, &tmp)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    let r = std::fs::hard_link(&tmp, dst);
    let _ = std::fs::remove_file(&tmp);
    r
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

#[cfg(test)]
mod tests {
    use super::*;
    use lading_testkit::seaweed::{ACCESS_KEY, SECRET_KEY, Weed};

    /// The completion of a multipart upload is conditional: a key another writer made while
    /// the parts went up is kept, and the completion is refused as `AlreadyExists`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_multipart_completion_never_replaces_a_key_made_meanwhile() {
        let weed = Weed::start().unwrap();
        weed.bucket("primary").unwrap();
        // Each checksum a node may ask the server for.
        for checksum in ["sha256", "crc64nvme"] {
            completion_is_conditional(&weed, checksum).await;
        }
    }

    async fn completion_is_conditional(weed: &Weed, checksum: &str) {
        let node = Node::open(
            &NodeSettings {
                id: 9501,
                url: "s3://primary/lading".into(),
                endpoint: Some(weed.endpoint()),
                region: None,
                access_key_id_env: None,
                secret_access_key_env: None,
                part_size: None,
                checksum: Some(checksum.into()),
            },
            |k| match k {
                "AWS_ACCESS_KEY_ID" => Some(ACCESS_KEY.into()),
                "AWS_SECRET_ACCESS_KEY" => Some(SECRET_KEY.into()),
                _ => None,
            },
        )
        .unwrap();
        let Place::Bucket { store, .. } = &node.place else {
            panic!("a bucket node")
        };
        let part = vec![7u8; MIN_PART_SIZE as usize];
        let upload = async |rel: &str| {
            let key = node
                .key(&format!("ark:/99999/fk4{checksum}"), 1, rel)
                .unwrap();
            let id = store.create_multipart(&key).await.unwrap();
            let p = store
                .put_part(&key, &id, 0, PutPayload::from(part.clone()))
                .await
                .unwrap();
            (key, id, p)
        };
        // Alone: completed.
        let (key, id, p) = upload("producer/alone|1 &.bin").await;
        store.complete(&key, &id, vec![p], true).await.unwrap();
        let got = store.get(&key).await.unwrap().bytes().await.unwrap();
        assert_eq!(got.len(), part.len());
        // Another writer made the key while the parts went up: refused, theirs kept.
        let (key, id, p) = upload("producer/raced.bin").await;
        store
            .put(&key, PutPayload::from_static(b"theirs"))
            .await
            .unwrap();
        let e = store.complete(&key, &id, vec![p], true).await.unwrap_err();
        assert!(
            matches!(e, object_store::Error::AlreadyExists { .. }),
            "{e}"
        );
        let got = store.get(&key).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], b"theirs");
        store.abort_multipart(&key, &id).await.unwrap();
        assert_eq!(weed.open_uploads("primary"), 0);
    }
}
