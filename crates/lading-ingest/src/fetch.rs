//! Getting payloads: HEAD for sizes, GET for manifests and files (http, https and `file://`),
//! streamed to disk in constant memory with the digests computed on the way.

use crate::checkm::{Digest, HashAlg};
use sha2::Digest as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Why a fetch failed, and whether trying again can help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The network or the server may recover (refused, reset, timeout, 5xx, 429).
    #[error("{0}")]
    Transient(String),
    /// It will not work as asked (404, a bad URL, a digest that does not match).
    #[error("{0}")]
    Fatal(String),
}

/// Largest manifest read into memory.
pub const MANIFEST_LIMIT_BYTES: u64 = 64 << 20;

/// A running hash of one algorithm.
pub enum Hasher {
    Md5(md5::Md5),
    Sha1(sha1::Sha1),
    Sha256(sha2::Sha256),
    Sha512(sha2::Sha512),
}

impl Hasher {
    pub fn new(alg: HashAlg) -> Hasher {
        match alg {
            HashAlg::Md5 => Hasher::Md5(md5::Md5::new()),
            HashAlg::Sha1 => Hasher::Sha1(sha1::Sha1::new()),
            HashAlg::Sha256 => Hasher::Sha256(sha2::Sha256::new()),
            HashAlg::Sha512 => Hasher::Sha512(sha2::Sha512::new()),
        }
    }
    pub fn update(&mut self, b: &[u8]) {
        match self {
            Hasher::Md5(h) => h.update(b),
            Hasher::Sha1(h) => h.update(b),
            Hasher::Sha256(h) => h.update(b),
            Hasher::Sha512(h) => h.update(b),
        }
    }
    pub fn hex(self) -> String {
        match self {
            Hasher::Md5(h) => hex(&h.finalize()),
            Hasher::Sha1(h) => hex(&h.finalize()),
            Hasher::Sha256(h) => hex(&h.finalize()),
            Hasher::Sha512(h) => hex(&h.finalize()),
        }
    }
}

pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Size and sha256 of a file, read in blocks.
pub fn file_sha256(path: &Path) -> std::io::Result<(u64, String)> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 256 << 10];
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

/// What a finished download measured.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fetched {
    pub size: u64,
    pub sha256: String,
}

/// An HTTP client plus `file://` support.
#[derive(Clone)]
pub struct Fetcher {
    client: reqwest::Client,
    /// Payload bytes downloaded and verified by this process (for `/metrics`).
    downloaded: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Default for Fetcher {
    fn default() -> Self {
        Fetcher::new()
    }
}

fn file_path(url: &str) -> Option<PathBuf> {
    let rest = url.strip_prefix("file://")?;
    Some(PathBuf::from(rest))
}

fn classify(e: reqwest::Error, url: &str) -> FetchError {
    if e.is_builder() {
        FetchError::Fatal(format!("bad URL {url}: {e}"))
    } else {
        FetchError::Transient(format!("cannot fetch {url}: {e}"))
    }
}

fn status_error(status: reqwest::StatusCode, url: &str) -> FetchError {
    let msg = format!("{url} answered {status}");
    if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
        FetchError::Transient(msg)
    } else {
        FetchError::Fatal(msg)
    }
}

impl Fetcher {
    pub fn new() -> Fetcher {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .read_timeout(Duration::from_secs(120))
            .user_agent(concat!("lading/", env!("CARGO_PKG_VERSION")))
            .build()
            .unwrap_or_default();
        Fetcher {
            client,
            downloaded: Default::default(),
        }
    }

    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// Payload bytes downloaded and verified by this process.
    pub fn bytes_downloaded(&self) -> u64 {
        self.downloaded.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A successful GET response, its body not read yet.
    async fn get(&self, url: &str) -> Result<reqwest::Response, FetchError> {
        let r = self
            .client
            .get(url)
            .send()
            .await
            .map_err(|e| classify(e, url))?;
        if !r.status().is_success() {
            return Err(status_error(r.status(), url));
        }
        Ok(r)
    }

    /// The length a HEAD request reports; `None` when unknown, refused or unsupported.
    pub async fn head_len(&self, url: &str) -> Option<u64> {
        if let Some(p) = file_path(url) {
            return tokio::fs::metadata(p).await.ok().map(|m| m.len());
        }
        let r = self
            .client
            .head(url)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .ok()?;
        if !r.status().is_success() {
            return None;
        }
        r.headers()
            .get(reqwest::header::CONTENT_LENGTH)?
            .to_str()
            .ok()?
            .parse()
            .ok()
    }

    /// A small text document (a manifest), at most [`MANIFEST_LIMIT_BYTES`].
    pub async fn get_text(&self, url: &str) -> Result<String, FetchError> {
        let bytes = if let Some(p) = file_path(url) {
            let meta = tokio::fs::metadata(&p)
                .await
                .map_err(|e| FetchError::Fatal(format!("cannot read {url}: {e}")))?;
            if meta.len() > MANIFEST_LIMIT_BYTES {
                return Err(FetchError::Fatal(format!(
                    "{url} is larger than {MANIFEST_LIMIT_BYTES} bytes"
                )));
            }
            tokio::fs::read(&p)
                .await
                .map_err(|e| FetchError::Fatal(format!("cannot read {url}: {e}")))?
        } else {
            let mut r = self.get(url).await?;
            let mut out = Vec::new();
            while let Some(chunk) = r.chunk().await.map_err(|e| classify(e, url))? {
                out.extend_from_slice(&chunk);
                if out.len() as u64 > MANIFEST_LIMIT_BYTES {
                    return Err(FetchError::Fatal(format!(
                        "{url} is larger than {MANIFEST_LIMIT_BYTES} bytes"
                    )));
                }
            }
            out
        };
        String::from_utf8(bytes).map_err(|_| FetchError::Fatal(format!("{url} is not UTF-8 text")))
    }

    /// Streams `url` into `dest` (through `dest.part`, renamed only once verified), checking
    /// the expected size and digest. Memory use does not depend on the file's size.
    pub async fn download(
        &self,
        url: &str,
        dest: &Path,
        size: Option<u64>,
        digest: Option<&Digest>,
    ) -> Result<Fetched, FetchError> {
        if let Some(parent) = dest.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| local(parent, e))?;
        }
        let part = dest.with_extension(match dest.extension() {
            Some(e) => format!("{}.part", e.to_string_lossy()),
            None => "part".into(),
        });
        let file = std::fs::File::create(&part).map_err(|e| local(&part, e))?;
        // Blocks of WRITE_BLOCK bytes are hashed and written on a blocking thread, one block
        // in flight while the next is received: network, hashing and disk overlap, and
        // memory stays at two blocks whatever the file's size.
        let mut sink = Sink {
            file: Some(file),
            sha: Some(Hasher::new(HashAlg::Sha256)),
            other: digest
                .filter(|d| d.alg != HashAlg::Sha256)
                .map(|d| Hasher::new(d.alg)),
            pending: None,
            buf: Vec::with_capacity(WRITE_BLOCK),
            n: 0,
            part: part.clone(),
        };
        if let Some(p) = file_path(url) {
            use tokio::io::AsyncReadExt;
            let mut f = tokio::fs::File::open(&p)
                .await
                .map_err(|e| FetchError::Fatal(format!("cannot read {url}: {e}")))?;
            let mut buf = vec![0u8; WRITE_BLOCK];
            loop {
                let k = f
                    .read(&mut buf)
                    .await
                    .map_err(|e| FetchError::Transient(format!("reading {url}: {e}")))?;
                if k == 0 {
                    break;
                }
                sink.push(&buf[..k]).await?;
            }
        } else {
            let mut r = self.get(url).await?;
            while let Some(chunk) = r.chunk().await.map_err(|e| classify(e, url))? {
                sink.push(&chunk).await?;
            }
        }
        let (n, sha, other) = sink.finish().await?;
        let sha256 = sha;
        if let Some(expected) = size
            && expected != n
        {
            let _ = tokio::fs::remove_file(&part).await;
            return Err(FetchError::Fatal(format!(
                "size mismatch for {url}: the manifest says {expected} bytes, got {n}"
            )));
        }
        if let Some(d) = digest {
            let got = match other {
                Some(h) => h,
                None => sha256.clone(),
            };
            if got != d.hex {
                let _ = tokio::fs::remove_file(&part).await;
                return Err(FetchError::Fatal(format!(
                    "{} digest mismatch for {url}: the manifest says {}, got {got}",
                    d.alg.name(),
                    d.hex
                )));
            }
        }
        tokio::fs::rename(&part, dest)
            .await
            .map_err(|e| local(dest, e))?;
        self.downloaded
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        Ok(Fetched { size: n, sha256 })
    }
}

/// Bytes written per blocking write.
const WRITE_BLOCK: usize = 1 << 20;

/// The running hashes, handed to the thread hashing a block and back.
type Hashes = (Hasher, Option<Hasher>);

/// The writing end of a download: hashes and writes blocks off the async threads, each
/// block hashed on one thread while another writes it (both take about as long).
struct Sink {
    file: Option<std::fs::File>,
    sha: Option<Hasher>,
    other: Option<Hasher>,
    /// The block being written, and the one being hashed.
    pending: Option<(
        tokio::task::JoinHandle<std::io::Result<std::fs::File>>,
        tokio::task::JoinHandle<Hashes>,
    )>,
    buf: Vec<u8>,
    n: u64,
    part: PathBuf,
}

impl Sink {
    async fn push(&mut self, b: &[u8]) -> Result<(), FetchError> {
        self.buf.extend_from_slice(b);
        self.n += b.len() as u64;
        if self.buf.len() >= WRITE_BLOCK {
            self.flush_block().await?;
        }
        Ok(())
    }

    async fn settle(&mut self) -> Result<(), FetchError> {
        if let Some((write, hash)) = self.pending.take() {
            let joined = |e: tokio::task::JoinError| FetchError::Transient(e.to_string());
            let (sha, other) = hash.await.map_err(joined)?;
            let f = write
                .await
                .map_err(joined)?
                .map_err(|e| local(&self.part, e))?;
            self.file = Some(f);
            self.sha = Some(sha);
            self.other = other;
        }
        Ok(())
    }

    async fn flush_block(&mut self) -> Result<(), FetchError> {
        self.settle().await?;
        let block = std::sync::Arc::new(std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(WRITE_BLOCK),
        ));
        let (Some(mut f), Some(mut sha)) = (self.file.take(), self.sha.take()) else {
            return Err(FetchError::Transient("download sink lost its file".into()));
        };
        let mut other = self.other.take();
        let to_hash = block.clone();
        let hash = tokio::task::spawn_blocking(move || {
            sha.update(&to_hash);
            if let Some(h) = other.as_mut() {
                h.update(&to_hash);
            }
            (sha, other)
        });
        let write = tokio::task::spawn_blocking(move || {
            use std::io::Write;
            f.write_all(&block)?;
            Ok(f)
        });
        self.pending = Some((write, hash));
        Ok(())
    }

    /// Writes what is left; returns the size and the hex digests (sha256, other).
    async fn finish(mut self) -> Result<(u64, String, Option<String>), FetchError> {
        if !self.buf.is_empty() {
            self.flush_block().await?;
        }
        self.settle().await?;
        let sha = self.sha.take().map(Hasher::hex).unwrap_or_default();
        Ok((self.n, sha, self.other.take().map(Hasher::hex)))
    }
}

/// A local file error: a full disk may clear, so it is transient.
fn local(path: &Path, e: std::io::Error) -> FetchError {
    FetchError::Transient(format!("writing {}: {e}", path.display()))
}
