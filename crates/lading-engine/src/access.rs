//! The access queue: requests for a stored version as a zip, their leases and moves.

use super::*;

/// The token field listing the digests of the secrets of identical requests that share one
/// request's file.
pub const SHARED_SECRETS: &str = "shared_secret_sha256";

impl Engine {
    /// Queues an object assembly request on the small or large queue.
    pub async fn create_access(&self, queue: AccessQueue, token: &Value) -> Result<AccessId> {
        self.create_access_with(queue, |_| token.clone()).await
    }

    /// [`Engine::create_access`] with a token made once the request's id is known (Merritt's
    /// token fields name the request).
    pub async fn create_access_with(
        &self,
        queue: AccessQueue,
        token: impl FnOnce(&AccessId) -> Value,
    ) -> Result<AccessId> {
        let path = self
            .tree
            .create(
                &format!("{}/qid", access_folder(queue)),
                None,
                CreateMode::PersistentSequential,
            )
            .await?;
        let id = AccessId::parse(lading_core::tree::split_path(&path).1)?;
        let status = AccessStatus {
            status: AccessState::Pending,
            last_modified: self.now(),
            message: None,
            extra: Map::new(),
        };
        let r = self
            .tree
            .multi(vec![
                Op::create(format!("{path}/token"), Some(to_bytes(&token(&id)))),
                Op::create(format!("{path}/status"), json_bytes(&status)),
            ])
            .await;
        if let Err(e) = r {
            let _ = self.tree.delete(&path, None).await;
            return Err(e.into());
        }
        self.publish(
            crate::ChangeKind::Access,
            id.as_str(),
            None,
            None,
            AccessState::Pending.name(),
        );
        Ok(id)
    }

    /// Lets request `id` also be read under the secret whose digest is `digest`: an identical
    /// request shares its file rather than making another (at most 64 sharers).
    pub async fn share_access(
        &self,
        queue: AccessQueue,
        id: &AccessId,
        digest: &str,
    ) -> Result<()> {
        let path = format!("{}/token", access_path(queue, id));
        loop {
            let (mut token, version) = self
                .read_json::<Value>(&path)
                .await?
                .ok_or_else(|| EngineError::NoAccess(id.to_string()))?;
            let Some(t) = token.as_object_mut() else {
                return Err(EngineError::NoAccess(id.to_string()));
            };
            let list = t
                .entry(SHARED_SECRETS)
                .or_insert_with(|| Value::Array(Vec::new()));
            let Some(list) = list.as_array_mut() else {
                return Err(EngineError::NoAccess(id.to_string()));
            };
            if list.len() >= 64 {
                list.remove(0);
            }
            list.push(Value::String(digest.to_string()));
            match self
                .tree
                .set(&path, Some(to_bytes(&token)), Some(version))
                .await
            {
                Ok(_) => return Ok(()),
                Err(lading_core::tree::TreeError::BadVersion { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub async fn access(&self, queue: AccessQueue, id: &AccessId) -> Result<AccessInfo> {
        let path = access_path(queue, id);
        let (status, _) = self
            .read_json(&format!("{path}/status"))
            .await?
            .ok_or_else(|| EngineError::NoAccess(id.to_string()))?;
        let token = self
            .read_json(&format!("{path}/token"))
            .await?
            .map(|(v, _)| v)
            .unwrap_or_default();
        let locked = self.tree.exists(&format!("{path}/lock")).await?.is_some();
        Ok(AccessInfo {
            queue,
            id: id.to_string(),
            status,
            token,
            locked,
        })
    }

    /// Acquires the oldest Pending request of a queue, or a Processing one its assembler
    /// left (its lock gone with its session), in order (nothing while the queue is paused).
    pub async fn acquire_access(&self, queue: AccessQueue) -> Result<Option<AccessLease>> {
        self.acquire_access_noting(queue, &mut Vec::new()).await
    }

    /// Waits until a request of `queue` can be taken, or `timeout` passes. Woken by new
    /// requests, by the queue's pause flag, and by the status of a request still being made
    /// (its node and its status are two commits, so a new request is seen before it can be
    /// taken).
    pub async fn wait_access(
        &self,
        queue: AccessQueue,
        timeout: Duration,
    ) -> Result<Option<AccessLease>> {
        self.wait_access_or(queue, timeout, std::future::pending())
            .await
    }

    /// [`Engine::wait_access`] that also gives up (with `None`) when `stop` completes. Only
    /// the waiting is cut short, never an acquisition half done.
    pub async fn wait_access_or(
        &self,
        queue: AccessQueue,
        timeout: Duration,
        stop: impl std::future::Future<Output = ()> + Send,
    ) -> Result<Option<AccessLease>> {
        let armed = &claims::Armed::default();
        self.wait_until(timeout, stop, armed, None, || async move {
            armed
                .watch(self, &access_folder(queue), WatchKind::Children)
                .await?;
            armed
                .watch(self, &queue_lock(queue.lock_name()), WatchKind::Data)
                .await?;
            let mut unmade = Vec::new();
            if let Some(lease) = self.acquire_access_noting(queue, &mut unmade).await? {
                return Ok(Round::Got(lease));
            }
            for path in unmade {
                armed.watch(self, &path, WatchKind::Data).await?;
                // Made between the scan and the watch: look again at once.
                if self.tree.exists(&path).await?.is_some() {
                    return Ok(Round::Again);
                }
            }
            Ok(Round::Wait { due: self.sweep })
        })
        .await
    }

    /// [`Engine::acquire_access`], noting in `unmade` the status paths of requests whose
    /// status is not written yet.
    async fn acquire_access_noting(
        &self,
        queue: AccessQueue,
        unmade: &mut Vec<String>,
    ) -> Result<Option<AccessLease>> {
        if self.queue_paused_watched(queue.lock_name()).await? {
            return Ok(None);
        }
        let mut after: Option<String> = None;
        loop {
            let page = self
                .tree
                .children_page(&access_folder(queue), after.as_deref(), PAGE)
                .await?;
            // A short page is the last (see `Tree::children_page`).
            let last = (page.len() == PAGE).then(|| page.last().cloned()).flatten();
            for name in &page {
                let Ok(id) = AccessId::parse(name) else {
                    continue;
                };
                let path = access_path(queue, &id);
                let Some((status, version)) = self
                    .read_json::<AccessStatus>(&format!("{path}/status"))
                    .await?
                else {
                    unmade.push(format!("{path}/status"));
                    continue;
                };
                // A Processing request whose lock is gone lost its assembler (a crash, an
                // expired session): taken again, or it stayed Processing for ever (found by
                // `lading-sim`). One whose assembler lives keeps its lock, and is passed by.
                if !matches!(
                    status.status,
                    AccessState::Pending | AccessState::Processing
                ) {
                    continue;
                }
                // Every Pending request is taken, whoever made it: one whose token cannot be
                // read, or lacks what assembling needs (Merritt's `Access.createAssembly` names
                // no `ark`), is failed by the stage with a message naming the problem, never
                // skipped for ever.
                let (token, unreadable) = match self.read_json(&format!("{path}/token")).await {
                    Ok(t) => (t.map(|(v, _)| v).unwrap_or_default(), None),
                    Err(EngineError::Corrupt { path, reason }) => (
                        Default::default(),
                        Some(format!("{path} is not a token: {reason}")),
                    ),
                    Err(e) => return Err(e),
                };
                let lock = format!("{path}/lock");
                let guard = Op::check(format!("{path}/status"), Some(version));
                let Some(session) = self.take_lock(&lock, guard).await? else {
                    continue;
                };
                return Ok(Some(AccessLease {
                    queue,
                    id,
                    status,
                    token,
                    unreadable,
                    status_version: version,
                    session,
                }));
            }
            if last.is_none() {
                return Ok(None);
            }
            after = last;
        }
    }

    /// Moves a leased access request and releases its lock.
    pub async fn access_transition(
        &self,
        lease: AccessLease,
        event: Event<AccessState>,
        message: Option<String>,
    ) -> Result<AccessStatus> {
        let lock = format!("{}/lock", access_path(lease.queue, &lease.id));
        let r = self.access_move(&lease, event, message, true).await;
        self.settle(&lock, lease.session, &r).await;
        Ok(r?.0)
    }

    /// Moves a leased access request but keeps the lock (Pending → Processing, then work).
    pub async fn access_advance(
        &self,
        mut lease: AccessLease,
        event: Event<AccessState>,
    ) -> Result<AccessLease> {
        let (status, version) = match self.access_move(&lease, event, None, false).await {
            Ok(r) => r,
            Err(e) => {
                let lock = format!("{}/lock", access_path(lease.queue, &lease.id));
                let e = Err(e);
                self.settle(&lock, lease.session, &e).await;
                return e;
            }
        };
        lease.status = status;
        lease.status_version = version;
        Ok(lease)
    }

    /// The one move of a leased request: its status, checked against the lease's version and
    /// lock; `release` drops the lock in the same `multi`. Returns the new status and version.
    async fn access_move(
        &self,
        lease: &AccessLease,
        event: Event<AccessState>,
        message: Option<String>,
        release: bool,
    ) -> Result<(AccessStatus, i32)> {
        let path = access_path(lease.queue, &lease.id);
        if lease.session != self.tree.session_id() {
            return Err(lost(lease.id.as_str()));
        }
        let to = lease.status.status.resolve(event)?;
        let mut status = lease.status.clone();
        status.status = to;
        status.last_modified = self.now();
        status.message = message;
        let lock = format!("{path}/lock");
        let mut ops = vec![
            Op::check(&lock, None),
            Op::set(
                format!("{path}/status"),
                json_bytes(&status),
                Some(lease.status_version),
            ),
        ];
        if release {
            ops.push(Op::delete(&lock, None));
        }
        self.tree
            .multi_on(lease.session, ops)
            .await
            .map_err(|e| self.lease_error(e, lease.id.as_str()))?;
        self.publish(
            crate::ChangeKind::Access,
            lease.id.as_str(),
            None,
            Some(lease.status.status.name()),
            to.name(),
        );
        Ok((status, lease.status_version + 1))
    }

    /// Gives back a request leased but not handled: it stays Pending for the next worker.
    pub async fn release_access_lease(&self, lease: AccessLease) -> Result<()> {
        let lock = format!("{}/lock", access_path(lease.queue, &lease.id));
        if lease.session != self.tree.session_id() {
            self.unclaim_on(&lock, lease.session);
            return Err(lost(lease.id.as_str()));
        }
        self.release_lock(&lock, lease.id.as_str(), lease.session)
            .await
    }
}
