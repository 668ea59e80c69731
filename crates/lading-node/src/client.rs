//! A client of this API, for the command line (`lading --server URL --token T …`) and
//! anything else that talks to a `lading serve`: bearer auth, JSON answers, errors as
//! [`HttpError`] with the server's message and status, multipart uploads streamed from disk.

use crate::error::Context;
use crate::error::Result;
use futures_util::StreamExt;
use lading_core::layout::{AccessId, BatchId, JobId};
use lading_engine::{AccessInfo, BatchInfo, JobInfo, OutboxItem, Summary};
use lading_server::api::{
    ActionResult, BatchAction, CollectionHold, JobAction, QueuePause, RequeueFailedRequest,
    Requeued, SubmitRequest, Submitted,
};
use lading_server::ops::{Changes, Ops};
use serde_json::Value;
use std::collections::VecDeque;
use std::path::Path;

pub use crate::error::{HttpError, exit_code};

pub struct Client {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Client {
    pub fn new(server: &str, token: Option<String>) -> crate::Result<Client> {
        let token = token.ok_or_else(|| {
            crate::NodeError::Other(
                "--server needs --token (or LADING_TOKEN): the API wants a bearer token".into(),
            )
        })?;
        Ok(Client {
            base: server.trim_end_matches('/').to_string(),
            token,
            http: reqwest::Client::builder().build()?,
        })
    }

    /// A request with the bearer token, to a path of the API.
    pub fn request(&self, method: &str, path: &str) -> crate::Result<reqwest::RequestBuilder> {
        Ok(self
            .http
            .request(
                method
                    .parse()
                    .map_err(|e| crate::NodeError::Other(format!("{e}")))?,
                format!("{}{path}", self.base),
            )
            .bearer_auth(&self.token))
    }

    /// Sends a request (with `body` as JSON) and reads the answer as a `T`; an error status
    /// is an [`HttpError`] with the server's message.
    pub async fn json<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&impl serde::Serialize>,
    ) -> crate::Result<T> {
        let mut r = self.request(method, path)?;
        if let Some(b) = body {
            r = r.json(b);
        }
        self.answer(r).await
    }

    async fn answer<T: serde::de::DeserializeOwned>(
        &self,
        r: reqwest::RequestBuilder,
    ) -> crate::Result<T> {
        let resp = r
            .send()
            .await
            .map_err(|e| crate::NodeError::Other(format!("cannot reach {}: {e}", self.base)))?;
        let status = resp.status();
        let text = read_bounded(resp, MAX_ANSWER).await?;
        if !status.is_success() {
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
            let message = v["error"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string());
            return Err(HttpError {
                status: status.as_u16(),
                message,
            }
            .into());
        }
        serde_json::from_str(&text).with_context(|| {
            format!("the server's answer is not what this client reads: {text:.200}")
        })
    }

    /// Uploads a local file as a batch (multipart, streamed from disk), described by `req`
    /// (without a `payload_url`: the file is the payload).
    pub async fn upload(&self, file: &Path, req: &SubmitRequest) -> crate::Result<Submitted> {
        let name = file.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
            crate::NodeError::Other(format!("{} has no usable file name", file.display()))
        })?;
        let f = tokio::fs::File::open(file)
            .await
            .map_err(|e| crate::NodeError::Other(format!("cannot read {}: {e}", file.display())))?;
        let len = f.metadata().await?.len();
        let boundary = format!("lading-{}", std::process::id());
        let head = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        );
        let tail = format!("\r\n--{boundary}--\r\n");
        let total = head.len() as u64 + len + tail.len() as u64;
        let part = |s: String| {
            futures_util::stream::once(async move {
                Ok::<_, std::io::Error>(tokio_util::bytes::Bytes::from(s))
            })
        };
        let body = part(head)
            .chain(tokio_util::io::ReaderStream::new(f))
            .chain(part(tail));
        let r = self
            .request("POST", "/api/v1/batches/upload")?
            .query(req)
            .header(
                "content-type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .header("content-length", total)
            .body(reqwest::Body::wrap_stream(body));
        self.answer(r).await
    }
}

/// Largest answer the client reads (a page of records is far smaller).
const MAX_ANSWER: usize = 64 << 20;

/// The body as text, refused past `max` bytes.
async fn read_bounded(mut resp: reqwest::Response, max: usize) -> crate::Result<String> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        if body.len() + chunk.len() > max {
            return Err(crate::NodeError::Other(format!(
                "the server's answer is larger than {max} bytes; not read"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// Query-string escaping of one value.
pub fn enc(v: &str) -> String {
    let mut out = String::new();
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The operator's verbs through a `lading serve`.
impl Ops for Client {
    type Error = crate::NodeError;

    async fn copies(&self, job: &JobId) -> Result<Vec<lading_ingest::inventory::NodeCopies>> {
        let path = format!("/api/v1/jobs/{job}/files");
        let f: lading_server::api::JobFiles = self.json("GET", &path, None::<&()>).await?;
        Ok(f.copies)
    }

    async fn submit(&self, mut req: SubmitRequest) -> Result<Submitted> {
        match req.payload_url.take() {
            Some(url) if !url.contains("://") => {
                self.upload(std::path::Path::new(&url), &req).await
            }
            url => {
                req.payload_url = url;
                self.json("POST", "/api/v1/batches", Some(&req)).await
            }
        }
    }

    async fn summary(&self) -> Result<Summary> {
        self.json("GET", "/api/v1/status", None::<&()>).await
    }

    async fn batch(&self, id: &str) -> Result<BatchInfo> {
        let path = format!("/api/v1/batches/{}", enc(id));
        self.json("GET", &path, None::<&()>).await
    }

    async fn job(&self, id: &JobId) -> Result<JobInfo> {
        let path = format!("/api/v1/jobs/{id}");
        self.json("GET", &path, None::<&()>).await
    }

    async fn access(&self, id: &AccessId) -> Result<AccessInfo> {
        let path = format!("/api/v1/access-requests/{id}");
        self.json("GET", &path, None::<&()>).await
    }

    async fn job_action(
        &self,
        id: &JobId,
        act: JobAction,
        to: Option<&str>,
    ) -> Result<ActionResult> {
        let path = format!("/api/v1/jobs/{id}/{}", act.name());
        let body = lading_server::api::RequeueRequest {
            to: to.map(str::to_string),
        };
        self.json("POST", &path, Some(&body)).await
    }

    async fn batch_action(&self, id: &BatchId, action: BatchAction) -> Result<ActionResult> {
        let path = format!("/api/v1/batches/{id}/{}", action.name());
        self.json("POST", &path, None::<&()>).await
    }

    async fn requeue_failed(&self, id: &BatchId, req: RequeueFailedRequest) -> Result<Requeued> {
        let path = format!("/api/v1/batches/{id}/requeue-failed");
        self.json("POST", &path, Some(&req)).await
    }

    async fn collection(&self, name: &str, hold: bool) -> Result<CollectionHold> {
        let method = if hold { "PUT" } else { "DELETE" };
        let path = format!("/api/v1/collections/{}/hold", enc(name));
        self.json(method, &path, None::<&()>).await
    }

    async fn queue(&self, name: &str, pause: bool) -> Result<QueuePause> {
        let method = if pause { "PUT" } else { "DELETE" };
        let path = format!("/api/v1/queues/{}/pause", enc(name));
        self.json(method, &path, None::<&()>).await
    }

    async fn outbox(&self) -> Result<Vec<OutboxItem>> {
        let list: lading_server::api::OutboxList =
            self.json("GET", "/api/v1/outbox", None::<&()>).await?;
        Ok(list.entries)
    }

    async fn retry_outbox(&self, name: &str) -> Result<()> {
        let path = format!("/api/v1/outbox/{}/retry", enc(name));
        let _: lading_server::api::OutboxRetried = self.json("POST", &path, None::<&()>).await?;
        Ok(())
    }

    async fn deletion(
        &self,
        verb: lading_server::ops::DeletionVerb,
    ) -> Result<Vec<lading_server::ops::Deletion>> {
        use lading_server::ops::DeletionVerb as V;
        let one = |d| Ok(vec![d]);
        match verb {
            V::Request {
                ark,
                version,
                reason,
            } => {
                let body = serde_json::json!({"ark": ark, "version": version, "reason": reason});
                one(self.json("POST", "/api/v1/deletions", Some(&body)).await?)
            }
            V::Approve(id) | V::Cancel(id) if id.is_empty() => {
                Err(crate::NodeError::Other("name the deletion (del…)".into()))
            }
            V::Approve(id) => {
                let path = format!("/api/v1/deletions/{}/approve", enc(&id));
                one(self.json("POST", &path, None::<&()>).await?)
            }
            V::Cancel(id) => {
                let path = format!("/api/v1/deletions/{}/cancel", enc(&id));
                one(self.json("POST", &path, None::<&()>).await?)
            }
            V::Show(id) => {
                let path = format!("/api/v1/deletions/{}", enc(&id));
                one(self.json("GET", &path, None::<&()>).await?)
            }
            V::List(ark) => {
                let path = match ark {
                    Some(a) => format!("/api/v1/deletions?ark={}", enc(&a)),
                    None => "/api/v1/deletions".to_string(),
                };
                self.json("GET", &path, None::<&()>).await
            }
        }
    }

    async fn find_jobs(
        &self,
        filter: &lading_server::bulk::JobFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<lading_server::api::JobRowPage> {
        let mut r = self.request("GET", "/api/v1/jobs")?.query(filter);
        r = r.query(&[("limit", limit.to_string())]);
        if let Some(a) = after {
            r = r.query(&[("after", a)]);
        }
        self.answer(r).await
    }

    async fn count_jobs(
        &self,
        filter: &lading_server::bulk::JobFilter,
    ) -> Result<lading_server::bulk::JobCount> {
        self.answer(self.request("GET", "/api/v1/jobs/count")?.query(filter))
            .await
    }

    async fn bulk(
        &self,
        req: lading_server::bulk::BulkRequest,
    ) -> Result<lading_engine::audit::AdminOperation> {
        let started: lading_engine::audit::AdminOperation =
            self.json("POST", "/api/v1/jobs/bulk", Some(&req)).await?;
        // It runs on in the server: its record in the audit log, until it is finished.
        loop {
            let log: Vec<lading_engine::audit::AdminOperation> = self
                .json("GET", "/api/v1/audit?limit=100", None::<&()>)
                .await?;
            match log.into_iter().find(|o| o.id == started.id) {
                Some(o) if o.state != "running" => return Ok(o),
                Some(_) => {}
                None => {
                    return Err(crate::NodeError::Other(format!(
                        "operation {} left the audit log",
                        started.id
                    )));
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    }

    async fn clear_lock(&self, kind: &str, name: &str) -> Result<()> {
        let path = format!("/api/v1/locks/{}/{}", enc(kind), enc(name));
        let _: lading_server::api::LockCleared = self.json("DELETE", &path, None::<&()>).await?;
        Ok(())
    }

    async fn changes(&self, batch: &BatchId) -> Result<Changes> {
        let path = format!("/api/v1/events?batch={batch}");
        let resp = self.request("GET", &path)?.send().await?;
        Ok(Changes::Remote {
            resp: resp.error_for_status()?,
            buf: String::new(),
            ready: VecDeque::new(),
        })
    }
}
