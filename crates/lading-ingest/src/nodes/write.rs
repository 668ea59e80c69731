//! Writing to a node: a file put only where absent (in one PUT or a multipart upload whose
//! id the caller keeps), multipart uploads aborted, and a bad copy replaced by a repair.

use super::*;

impl Node {
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

impl Node {
    /// Removes `rel` of the version (an approved deletion only); a copy already gone counts
    /// as removed.
    pub async fn remove(&self, ark: &str, version: u32, rel: &str) -> Result<(), NodeError> {
        match &self.place {
            Place::Folder(root) => {
                let p = self.folder_path(root, ark, version, rel);
                let q = p.clone();
                crate::blocking::io(move || match std::fs::remove_file(&q) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                })
                .await
                .map_err(|e| self.io("removing", &p, e))
            }
            Place::Bucket { store, .. } => {
                let key = self.key(ark, version, rel)?;
                match store.delete(&key).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                    Err(e) => Err(self.fail(&format!("DELETE {key}"), e)),
                }
            }
        }
    }

    /// Writes the small `bytes` at `rel` of the version, over whatever is there (a deleted
    /// version's mark).
    pub async fn mark(
        &self,
        ark: &str,
        version: u32,
        rel: &str,
        bytes: Vec<u8>,
    ) -> Result<(), NodeError> {
        match &self.place {
            Place::Folder(root) => {
                let p = self.folder_path(root, ark, version, rel);
                let q = p.clone();
                crate::blocking::io(move || {
                    if let Some(d) = q.parent() {
                        std::fs::create_dir_all(d)?;
                    }
                    std::fs::write(&q, bytes)
                })
                .await
                .map_err(|e| self.io("writing", &p, e))
            }
            Place::Bucket { store, .. } => {
                let key = self.key(ark, version, rel)?;
                store
                    .put(&key, PutPayload::from(bytes))
                    .await
                    .map_err(|e| self.fail(&format!("PUT {key}"), e))
            }
        }
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
