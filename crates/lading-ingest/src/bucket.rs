//! What a bucket node asks of its S3-compatible server, as one trait: [`S3`], the real one
//! (`object_store`'s client, plus the two requests that client lacks, signed by its own
//! signer), and [`Memory`], a bucket in memory whose answers can be made to fail, come late,
//! or be lost after they took effect (the simulator's storage node).

use futures_util::future::BoxFuture;
use object_store::aws::AmazonS3;
use object_store::memory::InMemory;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path as Key;
use object_store::{GetResult, ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions};
use object_store::{PutPayload, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A multipart upload begun and neither completed nor aborted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenUpload {
    pub key: String,
    pub id: String,
    /// When the server says it began (epoch ms), if it says.
    pub initiated_ms: Option<u64>,
}

/// One page of open multipart uploads, and the markers of the next page when there is one.
pub type UploadPage = (Vec<OpenUpload>, Option<(String, String)>);

/// Why a listing of open uploads failed, and whether no retry can help.
#[derive(Debug, Clone)]
pub struct ListFailure {
    pub what: String,
    pub fatal: bool,
    /// Why the node is unavailable, plainly, when the failure says so (SPEC §11): the
    /// caller waits for the node instead of spending an attempt.
    pub down: Option<String>,
}

/// The requests a bucket node makes.
pub trait Bucket: Send + Sync + std::fmt::Debug {
    /// Lists under `prefix` (one page): a request every S3 server authenticates.
    fn probe<'a>(&'a self, prefix: &'a Key) -> BoxFuture<'a, Result<()>>;
    fn head<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<ObjectMeta>>;
    fn get<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<GetResult>>;
    /// Writes `body` at `key` only if the key is absent (`AlreadyExists` otherwise).
    fn put_new<'a>(&'a self, key: &'a Key, body: PutPayload) -> BoxFuture<'a, Result<()>>;
    /// Writes `body` over whatever `key` holds (fixity repair only).
    fn put<'a>(&'a self, key: &'a Key, body: PutPayload) -> BoxFuture<'a, Result<()>>;
    fn delete<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<()>>;
    /// Every key under `prefix` (tests, benches, sweeps of small buckets).
    fn keys<'a>(&'a self, prefix: Option<&'a Key>) -> BoxFuture<'a, Result<Vec<ObjectMeta>>>;
    fn create_multipart<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<String>>;
    fn put_part<'a>(
        &'a self,
        key: &'a Key,
        id: &'a str,
        index: usize,
        body: PutPayload,
    ) -> BoxFuture<'a, Result<PartId>>;
    /// Completes an upload; with `if_absent`, only if its key is still absent
    /// (`AlreadyExists` otherwise, the upload left open).
    fn complete<'a>(
        &'a self,
        key: &'a Key,
        id: &'a str,
        parts: Vec<PartId>,
        if_absent: bool,
    ) -> BoxFuture<'a, Result<()>>;
    fn abort_multipart<'a>(&'a self, key: &'a Key, id: &'a str) -> BoxFuture<'a, Result<()>>;
    /// One page of the uploads open under `prefix`, after `marker`.
    fn list_uploads<'a>(
        &'a self,
        prefix: &'a str,
        marker: Option<(String, String)>,
    ) -> BoxFuture<'a, std::result::Result<UploadPage, ListFailure>>;
}

/// A bucket on an S3-compatible server.
#[derive(Debug)]
pub struct S3 {
    pub store: AmazonS3,
    /// The same bucket through a client that does not retry: a probe is one request.
    pub probing: AmazonS3,
    /// The bucket's URL, path-style (`ENDPOINT/BUCKET`), for the requests the client
    /// library lacks (a conditional completion, the listing of open uploads).
    pub url: String,
    pub region: String,
}

impl Bucket for S3 {
    fn probe<'a>(&'a self, prefix: &'a Key) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.probing
                .list_with_delimiter(Some(prefix))
                .await
                .map(|_| ())
        })
    }
    fn head<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<ObjectMeta>> {
        Box::pin(self.store.head(key))
    }
    fn get<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<GetResult>> {
        Box::pin(self.store.get(key))
    }
    fn put_new<'a>(&'a self, key: &'a Key, body: PutPayload) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let opts = PutOptions {
                mode: PutMode::Create,
                ..Default::default()
            };
            self.store.put_opts(key, body, opts).await.map(|_| ())
        })
    }
    fn put<'a>(&'a self, key: &'a Key, body: PutPayload) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { self.store.put(key, body).await.map(|_| ()) })
    }
    fn delete<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.store.delete(key))
    }
    fn keys<'a>(&'a self, prefix: Option<&'a Key>) -> BoxFuture<'a, Result<Vec<ObjectMeta>>> {
        use futures_util::TryStreamExt;
        Box::pin(self.store.list(prefix).try_collect())
    }
    fn create_multipart<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<String>> {
        Box::pin(self.store.create_multipart(key))
    }
    fn put_part<'a>(
        &'a self,
        key: &'a Key,
        id: &'a str,
        index: usize,
        body: PutPayload,
    ) -> BoxFuture<'a, Result<PartId>> {
        Box::pin(async move { self.store.put_part(key, &id.to_string(), index, body).await })
    }
    fn complete<'a>(
        &'a self,
        key: &'a Key,
        id: &'a str,
        parts: Vec<PartId>,
        if_absent: bool,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if if_absent {
                self.complete_if_absent(key, id, &parts).await
            } else {
                self.store
                    .complete_multipart(key, &id.to_string(), parts)
                    .await
                    .map(|_| ())
            }
        })
    }
    fn abort_multipart<'a>(&'a self, key: &'a Key, id: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { self.store.abort_multipart(key, &id.to_string()).await })
    }
    fn list_uploads<'a>(
        &'a self,
        prefix: &'a str,
        marker: Option<(String, String)>,
    ) -> BoxFuture<'a, std::result::Result<UploadPage, ListFailure>> {
        Box::pin(self.list_uploads_page(prefix, marker))
    }
}

impl S3 {
    /// Completes a multipart upload only if its key is still absent: S3's
    /// CompleteMultipartUpload with `If-None-Match: *`, which `object_store` does not send,
    /// signed by its own signer. A key that exists by then is `AlreadyExists` (412), so a
    /// second writer of a version can never replace the first's file with a mixture.
    pub async fn complete_if_absent(&self, key: &Key, id: &str, parts: &[PartId]) -> Result<()> {
        let cred = self.store.credentials().get_credential().await?;
        let target = format!(
            "{}/{}?uploadId={}",
            self.url.trim_end_matches('/'),
            strict_path(key.as_ref()),
            strict_path(id)
        );
        let mut body = String::from(
            "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">",
        );
        for (n, part) in parts.iter().enumerate() {
            // `object_store` keeps a part's ETag and checksums as a small XML document of
            // its own (`<e_tag>`, `<checksum_sha256>`, `<checksum_crc64nvme>`), or the bare
            // ETag.
            let c = &part.content_id;
            let etag = xml_text(c, "e_tag").unwrap_or_else(|| c.clone());
            let mut fields = format!("<ETag>{}</ETag>", xml_escape(&etag));
            for (ours, theirs) in [
                ("checksum_sha256", "ChecksumSHA256"),
                ("checksum_crc64nvme", "ChecksumCRC64NVME"),
            ] {
                if let Some(v) = xml_text(c, ours) {
                    fields.push_str(&format!("<{theirs}>{}</{theirs}>", xml_escape(&v)));
                }
            }
            body.push_str(&format!(
                "<Part><PartNumber>{}</PartNumber>{fields}</Part>",
                n + 1
            ));
        }
        body.push_str("</CompleteMultipartUpload>");
        let mut req = object_store::client::HttpRequest::new(
            object_store::client::HttpRequestBody::from(body.clone()),
        );
        *req.method_mut() = reqwest::Method::POST;
        *req.uri_mut() = target
            .parse()
            .map_err(|e| generic(&format!("the upload's address {target}: {e}")))?;
        req.headers_mut().insert(
            "if-none-match",
            reqwest::header::HeaderValue::from_static("*"),
        );
        object_store::aws::AwsAuthorizer::new(&cred, "s3", &self.region)
            .try_authorize(&mut req, None)?;
        let answer = upload_lister()
            .post(&target)
            .headers(req.headers().clone())
            .body(body)
            .send()
            .await
            .map_err(|e| generic(&format!("completing the upload of {key}: {e}")))?;
        let status = answer.status();
        let text = read_bounded(answer, MAX_LISTING_BYTES)
            .await
            .map_err(|e| generic(&format!("completing the upload of {key}: {e}")))?;
        if status.as_u16() == 412 {
            return Err(object_store::Error::AlreadyExists {
                path: key.to_string(),
                source: "another writer completed it first".into(),
            });
        }
        // S3 may answer 200 and put an error in the body.
        if !status.is_success() || text.contains("<Error>") {
            return Err(generic(&format!(
                "completing the upload of {key}: {status}: {} {}",
                xml_text(&text, "Code").unwrap_or_default(),
                xml_text(&text, "Message").unwrap_or_default()
            )));
        }
        Ok(())
    }

    /// One page of S3's ListMultipartUploads under `prefix`. Signed by the client
    /// library's own SigV4 signer.
    async fn list_uploads_page(
        &self,
        prefix: &str,
        marker: Option<(String, String)>,
    ) -> std::result::Result<UploadPage, ListFailure> {
        let failed = |what: String| ListFailure {
            what,
            fatal: false,
            down: None,
        };
        let cred = self
            .store
            .credentials()
            .get_credential()
            .await
            .map_err(|e| failed(e.to_string()))?;
        let mut u = url::Url::parse(&self.url).map_err(|e| failed(e.to_string()))?;
        {
            let mut q = u.query_pairs_mut();
            q.append_key_only("uploads").append_pair("prefix", prefix);
            if let Some((k, id)) = &marker {
                q.append_pair("key-marker", k)
                    .append_pair("upload-id-marker", id);
            }
        }
        let mut req =
            object_store::client::HttpRequest::new(object_store::client::HttpRequestBody::empty());
        *req.uri_mut() = match u.as_str().parse() {
            Ok(uri) => uri,
            Err(e) => return Err(failed(format!("{e}"))),
        };
        object_store::aws::AwsAuthorizer::new(&cred, "s3", &self.region)
            .try_authorize(&mut req, None)
            .map_err(|e| failed(e.to_string()))?;
        let answer = upload_lister()
            .get(u.as_str())
            .headers(req.headers().clone())
            .send()
            .await
            .map_err(|e| ListFailure {
                down: crate::weather::reqwest_cause(&e),
                ..failed(e.to_string())
            })?;
        let status = answer.status();
        let text = read_bounded(answer, MAX_LISTING_BYTES)
            .await
            .map_err(failed)?;
        if !status.is_success() {
            let fatal =
                status.as_u16() == 401 || status.as_u16() == 403 || text.contains("NoSuchBucket");
            let n = status.as_u16();
            return Err(ListFailure {
                what: format!(
                    "{status}: {}",
                    xml_text(&text, "Message").unwrap_or_default()
                ),
                fatal,
                down: (n >= 500 || n == 408 || n == 429).then(|| format!("answered {n}")),
            });
        }
        let open = xml_elements(&text, "Upload")
            .into_iter()
            .filter_map(|u| {
                Some(OpenUpload {
                    key: xml_text(u, "Key")?,
                    id: xml_text(u, "UploadId")?,
                    initiated_ms: xml_text(u, "Initiated")
                        .and_then(|t| lading_core::time::parse_ts(&t)),
                })
            })
            .collect();
        let next = (xml_text(&text, "IsTruncated").as_deref() == Some("true"))
            .then(|| {
                Some((
                    xml_text(&text, "NextKeyMarker")?,
                    xml_text(&text, "NextUploadIdMarker")?,
                ))
            })
            .flatten();
        Ok((open, next))
    }
}

/// What a [`Memory`] bucket does with one request, as its [`Faults`] decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Answered as asked.
    None,
    /// Refused before it took effect: the server is unavailable.
    Refused,
    /// Took effect, and its answer was lost: the caller sees an error.
    AnswerLost,
    /// Answered after this long.
    Slow(Duration),
    /// Refused at the door: the server is down (its connection refused), an outage rather
    /// than a request's bad luck.
    Down,
}

/// Decides each request's [`Fault`] from its name (`PUT`, `HEAD`, …) and key.
pub type Faults = Arc<dyn Fn(&str, &str) -> Fault + Send + Sync>;

/// A bucket in memory (`object_store`'s own), with the open uploads it keeps listed, and
/// faults decided per request.
pub struct Memory {
    store: InMemory,
    /// Open uploads: id → (key, when it began).
    open: Mutex<BTreeMap<String, (String, u64)>>,
    faults: Faults,
    /// The server's clock, which dates each upload it begins.
    clock: lading_core::time::SharedClock,
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Memory bucket")
    }
}

impl Memory {
    pub fn new(faults: Faults) -> Memory {
        Memory::with_clock(faults, lading_core::time::system_clock())
    }

    /// A bucket whose server reads `clock` (the simulator's).
    pub fn with_clock(faults: Faults, clock: lading_core::time::SharedClock) -> Memory {
        Memory {
            store: InMemory::new(),
            open: Mutex::default(),
            faults,
            clock,
        }
    }

    /// Runs `op` named `name` on `key` under its fault.
    async fn faulty<T>(
        &self,
        name: &str,
        key: &str,
        op: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let unavailable = |why: &str| {
            Err(generic(&format!(
                "{name} {key}: {why} (the simulated node)"
            )))
        };
        match (self.faults)(name, key) {
            Fault::None => op.await,
            Fault::Refused => unavailable("503 Service Unavailable"),
            Fault::Down => Err(object_store::Error::Generic {
                store: "S3",
                source: Box::new(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    format!("{name} {key}: the simulated node is down"),
                )),
            }),
            Fault::AnswerLost => {
                let _ = op.await;
                unavailable("connection reset after the request was sent")
            }
            Fault::Slow(d) => {
                tokio::time::sleep(d).await;
                op.await
            }
        }
    }

    /// Writes `bytes` over `key` with no fault and no condition: a copy gone bad on the
    /// server's disks, for the fixity audit to find.
    /// `key` as listed ([`Bucket::keys`]).
    pub async fn rot(&self, key: &str, bytes: Vec<u8>) -> Result<()> {
        let key = Key::parse(key).map_err(|e| generic(&e.to_string()))?;
        self.store
            .put(&key, PutPayload::from(bytes))
            .await
            .map(|_| ())
    }

    fn opened(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (String, u64)>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Bucket for Memory {
    fn probe<'a>(&'a self, prefix: &'a Key) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.faulty("LIST", prefix.as_ref(), async {
            self.store
                .list_with_delimiter(Some(prefix))
                .await
                .map(|_| ())
        }))
    }
    fn head<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<ObjectMeta>> {
        Box::pin(self.faulty("HEAD", key.as_ref(), self.store.head(key)))
    }
    fn get<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<GetResult>> {
        Box::pin(self.faulty("GET", key.as_ref(), self.store.get(key)))
    }
    fn put_new<'a>(&'a self, key: &'a Key, body: PutPayload) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.faulty("PUT", key.as_ref(), async move {
            let opts = PutOptions {
                mode: PutMode::Create,
                ..Default::default()
            };
            self.store.put_opts(key, body, opts).await.map(|_| ())
        }))
    }
    fn put<'a>(&'a self, key: &'a Key, body: PutPayload) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.faulty("PUT", key.as_ref(), async move {
            self.store.put(key, body).await.map(|_| ())
        }))
    }
    fn delete<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.faulty("DELETE", key.as_ref(), self.store.delete(key)))
    }
    fn keys<'a>(&'a self, prefix: Option<&'a Key>) -> BoxFuture<'a, Result<Vec<ObjectMeta>>> {
        use futures_util::TryStreamExt;
        Box::pin(self.store.list(prefix).try_collect())
    }
    fn create_multipart<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<String>> {
        Box::pin(self.faulty("CREATE-UPLOAD", key.as_ref(), async move {
            let id = self.store.create_multipart(key).await?;
            let now = self.clock.now_ms();
            self.opened().insert(id.clone(), (key.to_string(), now));
            Ok(id)
        }))
    }
    fn put_part<'a>(
        &'a self,
        key: &'a Key,
        id: &'a str,
        index: usize,
        body: PutPayload,
    ) -> BoxFuture<'a, Result<PartId>> {
        Box::pin(self.faulty("PUT-PART", key.as_ref(), async move {
            self.store.put_part(key, &id.to_string(), index, body).await
        }))
    }
    fn complete<'a>(
        &'a self,
        key: &'a Key,
        id: &'a str,
        parts: Vec<PartId>,
        if_absent: bool,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.faulty("COMPLETE", key.as_ref(), async move {
            // One step (nothing awaits in between), as a server's conditional completion.
            if if_absent && self.store.head(key).await.is_ok() {
                return Err(object_store::Error::AlreadyExists {
                    path: key.to_string(),
                    source: "another writer completed it first".into(),
                });
            }
            self.store
                .complete_multipart(key, &id.to_string(), parts)
                .await?;
            self.opened().remove(id);
            Ok(())
        }))
    }
    fn abort_multipart<'a>(&'a self, key: &'a Key, id: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.faulty("ABORT", key.as_ref(), async move {
            if self.opened().remove(id).is_none() {
                return Err(object_store::Error::NotFound {
                    path: key.to_string(),
                    source: "no such upload".into(),
                });
            }
            self.store.abort_multipart(key, &id.to_string()).await
        }))
    }
    fn list_uploads<'a>(
        &'a self,
        prefix: &'a str,
        _marker: Option<(String, String)>,
    ) -> BoxFuture<'a, std::result::Result<UploadPage, ListFailure>> {
        Box::pin(async move {
            let page = self
                .faulty("LIST-UPLOADS", prefix, async {
                    Ok(self
                        .opened()
                        .iter()
                        .filter(|(_, (k, _))| k.starts_with(prefix))
                        .map(|(id, (k, at))| OpenUpload {
                            key: k.clone(),
                            id: id.clone(),
                            initiated_ms: Some(*at),
                        })
                        .collect::<Vec<_>>())
                })
                .await
                .map_err(|e| ListFailure {
                    down: crate::weather::object_store_cause(&e),
                    what: e.to_string(),
                    fatal: false,
                })?;
            Ok((page, None))
        })
    }
}

/// The largest ListMultipartUploads answer read (1,000 uploads of long keys).
const MAX_LISTING_BYTES: u64 = 4 << 20;

/// An error of a request made here rather than by `object_store`.
pub(crate) fn generic(what: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "S3",
        source: what.to_string().into(),
    }
}

/// A path for a request's address: every byte but S3's unreserved ones and `/` escaped, as
/// `object_store` escapes its own (the signature is computed over it as written).
fn strict_path(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for b in p.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A response's body as text, read up to `max` bytes.
async fn read_bounded(
    mut answer: reqwest::Response,
    max: u64,
) -> std::result::Result<String, String> {
    let mut body = Vec::new();
    while let Some(chunk) = answer.chunk().await.map_err(|e| e.to_string())? {
        if (body.len() + chunk.len()) as u64 > max {
            return Err(format!("the answer exceeds {max} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

fn upload_lister() -> &'static reqwest::Client {
    static C: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    C.get_or_init(|| {
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap_or_default()
    })
}

/// The bodies of every `<tag>…</tag>` in `xml` (S3's answers have no attributes on these).
fn xml_elements<'x>(xml: &'x str, tag: &str) -> Vec<&'x str> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find(&open) {
        let after = &rest[i + open.len()..];
        let Some(j) = after.find(&close) else { break };
        out.push(&after[..j]);
        rest = &after[j + close.len()..];
    }
    out
}

/// The text of the first `<tag>` in `xml`, with XML's escapes undone.
fn xml_text(xml: &str, tag: &str) -> Option<String> {
    let raw = xml_elements(xml, tag).into_iter().next()?;
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let j = after.find(';')?;
        let c = match &after[..j] {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "quot" => '"',
            "apos" => '\'',
            n if n.starts_with("#x") => char::from_u32(u32::from_str_radix(&n[2..], 16).ok()?)?,
            n if n.starts_with('#') => char::from_u32(n[1..].parse().ok()?)?,
            _ => return None,
        };
        out.push(c);
        rest = &after[j + 1..];
    }
    out.push_str(rest);
    Some(out)
}
