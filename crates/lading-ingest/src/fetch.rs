//! Getting payloads: HEAD for sizes, GET for manifests and files (http, https and `file://`),
//! streamed to disk in constant memory with the digests computed on the way.

use crate::checkm::{Digest, HashAlg};
use crate::config::PayloadSettings;
use crate::policy::{Policy, Trust};
use bytes::Bytes;
use sha2::Digest as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
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
    /// The payload's host cannot be reached (SPEC §11): the work waits for it, using no
    /// attempt.
    #[error("{message}")]
    Unavailable {
        dependency: lading_engine::deps::Dependency,
        cause: String,
        message: String,
    },
}

/// A payload host as a dependency (`payload-host HOST[:PORT]`).
pub fn payload_host(url: &str) -> lading_engine::deps::Dependency {
    let host = crate::weather::host_of(url);
    lading_engine::deps::Dependency::new("payload-host", host.clone(), host)
}

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

pub use crate::files::{file_sha256, hex};

/// What a finished download measured.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fetched {
    pub size: u64,
    pub sha256: String,
}

/// HTTP clients plus `file://` support, and the payload policy and bounds.
#[derive(Clone)]
pub struct Fetcher {
    /// For the operator's own URLs.
    client: reqwest::Client,
    /// For depositors' URLs: public addresses only (checked after resolution), each
    /// redirect checked, no proxy from the environment.
    depositor: reqwest::Client,
    policy: Arc<Policy>,
    limits: Arc<PayloadSettings>,
    /// Payload bytes downloaded and verified by this process (for `/metrics`).
    downloaded: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Where `http(s)` payloads come from instead of the network (the simulator's payload
    /// servers); none in a deployment.
    source: Option<Arc<dyn Source>>,
}

/// Payload servers that are not on the network: the simulator's, which are slow, fail, cut
/// bodies short and change manifests between attempts, as the seed says. The fetcher speaks
/// HTTP/1.1 to them (hyper's client) over connections in memory, and reads their statuses,
/// stated lengths and bodies as it reads a server's on the network.
pub trait Source: Send + Sync + 'static {
    /// A new connection to the server `url` names.
    fn connect<'a>(
        &'a self,
        url: &'a str,
    ) -> lading_core::BoxFuture<'a, std::io::Result<tokio::io::DuplexStream>>;
}

/// A successful response, its body not read yet.
enum Body {
    Net(reqwest::Response),
    Source(Option<u64>, Wire),
}

impl Body {
    fn content_length(&self) -> Option<u64> {
        match self {
            Body::Net(r) => r.content_length(),
            Body::Source(n, _) => *n,
        }
    }

    /// The next piece of the body; `None` at its end.
    async fn chunk(&mut self, url: &str) -> Result<Option<Bytes>, FetchError> {
        match self {
            Body::Net(r) => r.chunk().await.map_err(|e| classify(e, url)),
            Body::Source(_, w) => w.chunk().await.map_err(|e| unreached(url, e)),
        }
    }
}

/// A response's body from a [`Source`], with the connection it comes over.
struct Wire {
    body: hyper::body::Incoming,
    _send: hyper::client::conn::http1::SendRequest<NoBody>,
    _driving: AbortOnDrop,
}

impl Wire {
    /// The next piece of data; frames that are not data (trailers) are passed over.
    async fn chunk(&mut self) -> Result<Option<Bytes>, hyper::Error> {
        while let Some(frame) = std::future::poll_fn(|cx| {
            http_body::Body::poll_frame(std::pin::Pin::new(&mut self.body), cx)
        })
        .await
        {
            if let Ok(data) = frame?.into_data() {
                return Ok(Some(data));
            }
        }
        Ok(None)
    }
}

/// Stops a connection's task when what reads from it goes.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A request's body: none.
struct NoBody;

impl http_body::Body for NoBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(None)
    }
    fn is_end_stream(&self) -> bool {
        true
    }
}

/// A server that could not be reached, or broke off.
fn unreached(url: &str, e: impl std::fmt::Display) -> FetchError {
    FetchError::Transient(format!("cannot fetch {url}: {e}"))
}

/// `method` `url` over a new connection to `source`: the status, the stated length and the
/// body.
async fn over_source(
    source: &dyn Source,
    method: hyper::Method,
    url: &str,
) -> Result<(reqwest::StatusCode, Option<u64>, Wire), FetchError> {
    let u =
        reqwest::Url::parse(url).map_err(|e| FetchError::Fatal(format!("bad URL {url}: {e}")))?;
    let io = source.connect(url).await.map_err(|e| unreached(url, e))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
        .await
        .map_err(|e| unreached(url, e))?;
    let driving = AbortOnDrop(tokio::spawn(async move {
        let _ = conn.await;
    }));
    let target = match u.query() {
        Some(q) => format!("{}?{q}", u.path()),
        None => u.path().to_string(),
    };
    let req = hyper::Request::builder()
        .method(method)
        .uri(target)
        .header(hyper::header::HOST, u.host_str().unwrap_or_default())
        .header(hyper::header::USER_AGENT, USER_AGENT)
        .body(NoBody)
        .map_err(|e| FetchError::Fatal(format!("bad URL {url}: {e}")))?;
    let resp = send
        .send_request(req)
        .await
        .map_err(|e| unreached(url, e))?;
    let status =
        reqwest::StatusCode::from_u16(resp.status().as_u16()).map_err(|e| unreached(url, e))?;
    let len = resp
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    Ok((
        status,
        len,
        Wire {
            body: resp.into_body(),
            _send: send,
            _driving: driving,
        },
    ))
}

/// What Lading calls itself on the wire.
const USER_AGENT: &str = concat!("lading/", env!("CARGO_PKG_VERSION"));

impl Default for Fetcher {
    fn default() -> Self {
        Fetcher::new()
    }
}

fn file_path(url: &str) -> Option<PathBuf> {
    let scheme = url.get(..7)?;
    if !scheme.eq_ignore_ascii_case("file://") {
        return None;
    }
    // Percent-escapes decoded as a file URL means them; a URL that is not one is used as is.
    let p = reqwest::Url::parse(url)
        .ok()
        .and_then(|u| u.to_file_path().ok())
        .unwrap_or_else(|| PathBuf::from(&url[7..]));
    Some(p)
}

fn classify(e: reqwest::Error, url: &str) -> FetchError {
    if let Some(r) = crate::policy::refusal_in(&e) {
        return FetchError::Fatal(format!("{url}: refused by the payload policy: {r}"));
    }
    if e.is_builder() {
        FetchError::Fatal(format!("bad URL {url}: {e}"))
    } else if let Some(cause) = crate::weather::reqwest_cause(&e) {
        tracing::warn!(url = %lading_core::text::without_passwords(url), error = %e,
            "payload host unavailable");
        FetchError::Unavailable {
            dependency: payload_host(url),
            message: format!("cannot fetch {url}: {cause}"),
            cause: format!("{cause} (fetching {url})"),
        }
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

/// A local file opened for reading a payload: a regular file, or a fatal error (a folder, a
/// device, a pipe or a missing file will not become one by trying again).
fn open_regular(p: &Path, url: &str) -> Result<std::fs::File, FetchError> {
    let f =
        std::fs::File::open(p).map_err(|e| FetchError::Fatal(format!("cannot read {url}: {e}")))?;
    let meta = f
        .metadata()
        .map_err(|e| FetchError::Fatal(format!("cannot read {url}: {e}")))?;
    if !meta.is_file() {
        return Err(FetchError::Fatal(format!("{url} is not a regular file")));
    }
    Ok(f)
}

impl Fetcher {
    /// A fetcher with the default policy and bounds.
    pub fn new() -> Fetcher {
        Fetcher::with_settings(&PayloadSettings::default())
            .expect("the default payload settings are valid")
    }

    /// A fetcher with the config's payload policy and bounds; an invalid `allow` entry or a
    /// missing file root is named.
    pub fn with_settings(p: &PayloadSettings) -> Result<Fetcher, String> {
        let policy = Arc::new(Policy::new(&p.allow, &p.allow_file_roots)?);
        let base = || {
            reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(30))
                .read_timeout(Duration::from_secs(120))
                .user_agent(USER_AGENT)
        };
        let client = base().build().map_err(|e| e.to_string())?;
        let depositor = base()
            .no_proxy()
            .dns_resolver(policy.resolver())
            .redirect(policy.redirects())
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Fetcher {
            client,
            depositor,
            policy,
            limits: Arc::new(p.clone()),
            downloaded: Default::default(),
            source: None,
        })
    }

    /// The operator's client (callbacks).
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// The bounds in force.
    pub fn limits(&self) -> &PayloadSettings {
        &self.limits
    }

    /// The payload policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Payload bytes downloaded and verified by this process.
    pub fn bytes_downloaded(&self) -> u64 {
        self.downloaded.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The client for `url` under `trust`, once the policy allows it (a refusal is fatal and
    /// names the rule; nothing is fetched).
    fn client_for(&self, url: &str, trust: &Trust) -> Result<&reqwest::Client, FetchError> {
        match trust {
            Trust::Operator => Ok(&self.client),
            Trust::Depositor { upload } if upload.as_deref() == Some(url) => Ok(&self.client),
            Trust::Depositor { .. } => {
                self.policy.check(url).map_err(|r| {
                    FetchError::Fatal(format!("{url}: refused by the payload policy: {r}"))
                })?;
                Ok(&self.depositor)
            }
        }
    }

    /// The same fetcher, with `http(s)` payloads from `source` instead of the network.
    pub fn with_source(mut self, source: Arc<dyn Source>) -> Fetcher {
        self.source = Some(source);
        self
    }

    /// A successful GET response, its body not read yet.
    async fn get(&self, client: &reqwest::Client, url: &str) -> Result<Body, FetchError> {
        if let Some(s) = &self.source {
            let (status, n, wire) = over_source(&**s, hyper::Method::GET, url).await?;
            if !status.is_success() {
                return Err(status_error(status, url));
            }
            return Ok(Body::Source(n, wire));
        }
        let r = client.get(url).send().await.map_err(|e| classify(e, url))?;
        if !r.status().is_success() {
            return Err(status_error(r.status(), url));
        }
        Ok(Body::Net(r))
    }

    /// The length a HEAD request reports; `None` when unknown, refused or unsupported.
    pub async fn head_len(&self, url: &str, trust: &Trust) -> Option<u64> {
        let client = self.client_for(url, trust).ok()?;
        if let Some(p) = file_path(url) {
            return crate::blocking::metadata(p)
                .await
                .ok()
                .filter(|m| m.is_file())
                .map(|m| m.len());
        }
        if let Some(s) = &self.source {
            let (status, n, _) = over_source(&**s, hyper::Method::HEAD, url).await.ok()?;
            return n.filter(|_| status.is_success());
        }
        let r = client
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

    /// A small text document (a manifest), at most `max_manifest_bytes`, counted while it
    /// streams in (never trusting a stated size); a leading byte-order mark is dropped.
    pub async fn get_text(&self, url: &str, trust: &Trust) -> Result<String, FetchError> {
        let limit = self.limits.max_manifest_bytes;
        let too_large = || {
            FetchError::Fatal(format!(
                "{url} is larger than the manifest limit of {limit} bytes (payload.max_manifest_bytes)"
            ))
        };
        let client = self.client_for(url, trust)?;
        let bytes = if let Some(p) = file_path(url) {
            let u = url.to_string();
            crate::blocking::run(move || -> Result<Vec<u8>, FetchError> {
                use std::io::Read;
                let f = open_regular(&p, &u)?;
                let mut out = Vec::new();
                f.take(limit + 1)
                    .read_to_end(&mut out)
                    .map_err(|e| FetchError::Transient(format!("reading {u}: {e}")))?;
                Ok(out)
            })
            .await
            .map_err(|e| FetchError::Transient(e.to_string()))??
        } else {
            let mut r = self.get(client, url).await?;
            if r.content_length().is_some_and(|n| n > limit) {
                return Err(too_large());
            }
            let mut out = Vec::new();
            while let Some(chunk) = r.chunk(url).await? {
                out.extend_from_slice(&chunk);
                if out.len() as u64 > limit {
                    return Err(too_large());
                }
            }
            out
        };
        if bytes.len() as u64 > limit {
            return Err(too_large());
        }
        let mut text = String::from_utf8(bytes)
            .map_err(|_| FetchError::Fatal(format!("{url} is not UTF-8 text")))?;
        if text.starts_with('\u{feff}') {
            text.drain(..3);
        }
        Ok(text)
    }

    /// Streams `url` into `dest` (through `dest.part`, renamed only once verified), checking
    /// the expected size and digest. Memory use does not depend on the file's size. At most
    /// the declared `size` (or `max_file_bytes`) is read, and a transfer slower than
    /// `min_rate_bytes_per_s` over `rate_window_s` is cut off.
    pub async fn download(
        &self,
        url: &str,
        dest: &Path,
        size: Option<u64>,
        digest: Option<&Digest>,
        trust: &Trust,
    ) -> Result<Fetched, FetchError> {
        let client = self.client_for(url, trust)?;
        let max = self.limits.max_file_bytes;
        let cap = size.map_or(max, |s| s.min(max));
        let over = |n: u64| {
            FetchError::Fatal(match size {
                Some(s) if s <= max => {
                    format!("{url} sends more than the {s} bytes declared for it (at least {n})")
                }
                _ => format!(
                    "{url} is larger than the file limit of {max} bytes (payload.max_file_bytes)"
                ),
            })
        };
        if let Some(parent) = dest.parent() {
            crate::blocking::create_dir_all(parent)
                .await
                .map_err(|e| local(parent, e))?;
        }
        let part = dest.with_extension(match dest.extension() {
            Some(e) => format!("{}.part", e.to_string_lossy()),
            None => "part".into(),
        });
        let file = std::fs::File::create(&part).map_err(|e| local(&part, e))?;
        let mut sink = Sink::new(
            file,
            digest
                .filter(|d| d.alg != HashAlg::Sha256)
                .map(|d| Hasher::new(d.alg)),
            part.clone(),
        );
        let r = async {
            if let Some(p) = file_path(url) {
                use futures_util::StreamExt;
                let u = url.to_string();
                let f = crate::blocking::run(move || open_regular(&p, &u))
                    .await
                    .map_err(|e| FetchError::Transient(e.to_string()))??;
                let mut chunks = std::pin::pin!(file_chunks(f));
                while let Some(c) = chunks.next().await {
                    let c = c.map_err(|e| FetchError::Transient(format!("reading {url}: {e}")))?;
                    if sink.n + c.len() as u64 > cap {
                        return Err(over(sink.n + c.len() as u64));
                    }
                    sink.push(c).await?;
                }
            } else {
                let mut r = self.get(client, url).await?;
                if let Some(n) = r.content_length()
                    && n > cap
                {
                    return Err(over(n));
                }
                let mut rate = Rate::new(&self.limits);
                loop {
                    // Cut off at the end of a window that brought too few bytes, whether or
                    // not a chunk arrived (a dripping server may send one byte at a time).
                    let Ok(chunk) = tokio::time::timeout_at(rate.deadline, r.chunk(url)).await
                    else {
                        rate.check(sink.n, url)?;
                        continue;
                    };
                    let Some(chunk) = chunk? else {
                        break;
                    };
                    rate.check(sink.n + chunk.len() as u64, url)?;
                    if sink.n + chunk.len() as u64 > cap {
                        return Err(over(sink.n + chunk.len() as u64));
                    }
                    sink.push(chunk).await?;
                }
            }
            Ok(())
        }
        .await;
        if let Err(e) = r {
            drop(sink);
            let _ = crate::blocking::remove_file(&part).await;
            return Err(e);
        }
        let (n, sha, other) = sink.finish().await?;
        let sha256 = sha;
        if let Some(expected) = size
            && expected != n
        {
            let _ = crate::blocking::remove_file(&part).await;
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
                let _ = crate::blocking::remove_file(&part).await;
                return Err(FetchError::Fatal(format!(
                    "{} digest mismatch for {url}: the manifest says {}, got {got}",
                    d.alg.name(),
                    d.hex
                )));
            }
        }
        crate::blocking::rename(&part, dest)
            .await
            .map_err(|e| local(dest, e))?;
        self.downloaded
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        Ok(Fetched { size: n, sha256 })
    }
}

/// The minimum transfer rate: every `rate_window_s` the bytes received in the window are
/// counted; too few cut the download off.
struct Rate {
    deadline: tokio::time::Instant,
    window: Duration,
    /// Bytes received when the window started.
    start_n: u64,
    min_bytes: u64,
}

impl Rate {
    fn new(l: &PayloadSettings) -> Rate {
        let window = Duration::from_secs(l.rate_window_s.max(1));
        Rate {
            deadline: tokio::time::Instant::now() + window,
            window,
            start_n: 0,
            min_bytes: l
                .min_rate_bytes_per_s
                .saturating_mul(l.rate_window_s.max(1)),
        }
    }

    /// Called after each chunk (or at the deadline with an empty one): at the end of a
    /// window, fails when it brought too few bytes.
    fn check(&mut self, n: u64, url: &str) -> Result<(), FetchError> {
        if tokio::time::Instant::now() < self.deadline {
            return Ok(());
        }
        let got = n - self.start_n;
        if got < self.min_bytes {
            return Err(FetchError::Transient(format!(
                "{url} sent {got} bytes in {} s, slower than the minimum of {} bytes/s \
                 (payload.min_rate_bytes_per_s)",
                self.window.as_secs(),
                self.min_bytes / self.window.as_secs().max(1)
            )));
        }
        self.start_n = n;
        self.deadline = tokio::time::Instant::now() + self.window;
        Ok(())
    }
}

/// Bytes written per blocking write.
const WRITE_BLOCK: usize = 1 << 20;

/// Blocks received but not yet hashed (or not yet written): the memory a download holds.
const BLOCKS_IN_FLIGHT: usize = 4;

/// Received chunks, handed to the hashing and the writing thread together.
type Block = Arc<Vec<Bytes>>;

/// The writing end of a download. The chunks received are gathered, without copying them,
/// into blocks of about [`WRITE_BLOCK`] bytes, which go to two blocking threads, one hashing
/// them and one writing them (one `writev` per block), each through a queue of
/// [`BLOCKS_IN_FLIGHT`]: receiving goes on while a block is hashed and written, and memory
/// stays at a few blocks whatever the file's size.
struct Sink {
    /// Where the blocks go: two threads, or (on a thread that runs blocking work in place,
    /// see [`crate::blocking`]) this task itself.
    to: SinkTo,
    /// The chunks of the block being gathered, and their length.
    chunks: Vec<Bytes>,
    len: usize,
    n: u64,
    part: PathBuf,
}

enum SinkTo {
    Threads {
        to_hash: tokio::sync::mpsc::Sender<Block>,
        to_write: tokio::sync::mpsc::Sender<Block>,
        hashing: tokio::task::JoinHandle<(Hasher, Option<Hasher>)>,
        writing: tokio::task::JoinHandle<std::io::Result<()>>,
    },
    InPlace(Box<InPlace>),
}

/// A sink's file and hashers, when the task writes and hashes itself.
struct InPlace {
    file: std::fs::File,
    sha: Hasher,
    other: Option<Hasher>,
}

impl Sink {
    fn new(mut file: std::fs::File, mut other: Option<Hasher>, part: PathBuf) -> Sink {
        let to = if crate::blocking::in_place() {
            SinkTo::InPlace(Box::new(InPlace {
                file,
                sha: Hasher::new(HashAlg::Sha256),
                other,
            }))
        } else {
            let (to_hash, mut hash_rx) = tokio::sync::mpsc::channel::<Block>(BLOCKS_IN_FLIGHT);
            let (to_write, mut write_rx) = tokio::sync::mpsc::channel::<Block>(BLOCKS_IN_FLIGHT);
            let hashing = tokio::task::spawn_blocking(move || {
                let mut sha = Hasher::new(HashAlg::Sha256);
                while let Some(block) = hash_rx.blocking_recv() {
                    for c in block.iter() {
                        sha.update(c);
                        if let Some(h) = other.as_mut() {
                            h.update(c);
                        }
                    }
                }
                (sha, other)
            });
            let writing = tokio::task::spawn_blocking(move || {
                while let Some(block) = write_rx.blocking_recv() {
                    write_all_vectored(&mut file, &block)?;
                }
                Ok(())
            });
            SinkTo::Threads {
                to_hash,
                to_write,
                hashing,
                writing,
            }
        };
        Sink {
            to,
            chunks: Vec::new(),
            len: 0,
            n: 0,
            part,
        }
    }

    async fn push(&mut self, b: Bytes) -> Result<(), FetchError> {
        if b.is_empty() {
            return Ok(());
        }
        self.len += b.len();
        self.n += b.len() as u64;
        self.chunks.push(b);
        if self.len >= WRITE_BLOCK {
            self.flush_block().await?;
        }
        Ok(())
    }

    async fn flush_block(&mut self) -> Result<(), FetchError> {
        let block = Arc::new(std::mem::take(&mut self.chunks));
        self.len = 0;
        match &mut self.to {
            SinkTo::InPlace(p) => {
                let InPlace { file, sha, other } = &mut **p;
                for c in block.iter() {
                    sha.update(c);
                    if let Some(h) = other.as_mut() {
                        h.update(c);
                    }
                }
                write_all_vectored(file, &block).map_err(|e| local(&self.part, e))
            }
            SinkTo::Threads {
                to_hash,
                to_write,
                writing,
                ..
            } => {
                // A queue closes only when its thread ended early: the writer on an error
                // (which says why), the hasher only by a panic.
                if to_write.send(block.clone()).await.is_err() {
                    return Err(match writing.await {
                        Ok(Err(e)) => local(&self.part, e),
                        Ok(Ok(())) => FetchError::Transient("download writer stopped".into()),
                        Err(e) => FetchError::Transient(e.to_string()),
                    });
                }
                if to_hash.send(block).await.is_err() {
                    return Err(FetchError::Transient("download hasher stopped".into()));
                }
                Ok(())
            }
        }
    }

    /// Writes what is left; returns the size and the hex digests (sha256, other).
    async fn finish(mut self) -> Result<(u64, String, Option<String>), FetchError> {
        if !self.chunks.is_empty() {
            self.flush_block().await?;
        }
        let Sink { to, n, part, .. } = self;
        let (sha, other) = match to {
            SinkTo::InPlace(p) => (p.sha, p.other),
            SinkTo::Threads {
                to_hash,
                to_write,
                hashing,
                writing,
            } => {
                drop((to_hash, to_write));
                let joined = |e: tokio::task::JoinError| FetchError::Transient(e.to_string());
                writing
                    .await
                    .map_err(joined)?
                    .map_err(|e| local(&part, e))?;
                hashing.await.map_err(joined)?
            }
        };
        Ok((n, sha.hex(), other.map(Hasher::hex)))
    }
}

/// A file's bytes in chunks of `WRITE_BLOCK`, read by a blocking thread straight into the
/// buffers handed on (no copy on the way), at most a few chunks ahead of the reader: the
/// `file://` downloads here, and the payload server's responses.
pub fn file_chunks(
    mut f: std::fs::File,
) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> {
    use futures_util::StreamExt;
    fn chunk(f: &mut std::fs::File) -> Option<std::io::Result<bytes::Bytes>> {
        use std::io::{Read, Seek};
        // What is left of the file, when it can be told: a small file's buffer is its size,
        // not a whole block (a fresh megabyte is a megabyte of pages for the kernel to zero).
        let left = f
            .metadata()
            .and_then(|m| Ok(m.len().saturating_sub(f.stream_position()?)))
            .map_or(WRITE_BLOCK, |n| (n as usize).clamp(1, WRITE_BLOCK));
        let mut buf = Vec::with_capacity(left);
        match Read::take(&mut *f, WRITE_BLOCK as u64).read_to_end(&mut buf) {
            Ok(0) => None,
            Ok(_) => Some(Ok(bytes::Bytes::from(buf))),
            Err(e) => Some(Err(e)),
        }
    }
    if crate::blocking::in_place() {
        // Read as they are asked for, by this task (see [`crate::blocking`]); after an error,
        // nothing more.
        return futures_util::stream::unfold(Some(f), |f| async move {
            let mut f = f?;
            match chunk(&mut f)? {
                Ok(c) => Some((Ok(c), Some(f))),
                Err(e) => Some((Err(e), None)),
            }
        })
        .boxed();
    }
    let (tx, rx) = tokio::sync::mpsc::channel(BLOCKS_IN_FLIGHT);
    tokio::task::spawn_blocking(move || {
        while let Some(c) = chunk(&mut f) {
            let failed = c.is_err();
            if tx.blocking_send(c).is_err() || failed {
                return;
            }
        }
    });
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) })
        .boxed()
}

fn write_all_vectored(file: &mut std::fs::File, chunks: &[Bytes]) -> std::io::Result<()> {
    use std::io::{IoSlice, Write};
    let mut slices: Vec<IoSlice> = chunks.iter().map(|c| IoSlice::new(c)).collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        match file.write_vectored(rest) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(k) => IoSlice::advance_slices(&mut rest, k),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A local file error: a full disk or an I/O error may clear, so it is transient; a name
/// that cannot exist here (too long, a file where a folder must be) never will.
fn local(path: &Path, e: std::io::Error) -> FetchError {
    match crate::files::io_err("writing", path, e) {
        lading_worker::Outcome::Fatal(m) => FetchError::Fatal(m),
        lading_worker::Outcome::Transient(m) => FetchError::Transient(m),
        other => FetchError::Transient(format!("{other:?}")),
    }
}

#[cfg(test)]
mod tests;
