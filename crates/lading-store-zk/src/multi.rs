//! Multis: sending one, keeping the cache in step with it, and finding out what happened to one whose answer was lost (read back, never sent twice).

use super::*;

impl ZkTree {
    /// The creates and deletes of `ops` in primed cached folders: what the cache must see.
    pub(crate) fn cached_changes(conn: &Conn, ops: &[Op]) -> Vec<(bool, String)> {
        ops.iter()
            .filter_map(|op| match op {
                Op::Create { path, mode, .. } if *mode != CreateMode::PersistentSequential => {
                    Some((true, path.clone()))
                }
                Op::Delete { path, .. } => Some((false, path.clone())),
                _ => None,
            })
            .filter(|(_, p)| conn.cache.is_ready(lading_core::tree::split_path(p).0))
            .collect()
    }

    /// After a `multi` succeeded, waits until the cache has applied the events of its own
    /// changes, so this session reads its writes.
    pub(crate) async fn sync_cache(conn: &Conn, mark: u64, changes: &[(bool, String)]) {
        if changes.is_empty() {
            return;
        }
        if !conn
            .cache
            .wait_seen(mark, changes, Duration::from_secs(2))
            .await
        {
            tracing::warn!("ZooKeeper watch events late by 2 s; forgetting cached folders");
            for (_, p) in changes {
                conn.cache.forget(lading_core::tree::split_path(p).0);
            }
        }
    }

    pub(crate) async fn send_multi(
        conn: &Conn,
        ops: &[Op],
    ) -> Result<Vec<zk::MultiWriteResult>, zk::MultiWriteError> {
        let mut w = conn.client.new_multi_writer();
        for op in ops {
            let r = match op {
                Op::Check { path, version } => w.add_check_version(path, version.unwrap_or(-1)),
                Op::Create { path, data, mode } => w.add_create(
                    path,
                    data.as_deref().unwrap_or_default(),
                    &create_options(*mode),
                ),
                Op::Set {
                    path,
                    data,
                    version,
                } => w.add_set_data(path, data.as_deref().unwrap_or_default(), *version),
                Op::Delete { path, version } => w.add_delete(path, *version),
            };
            r?;
        }
        w.commit().await
    }

    /// `ops` in one `multi`; with `on`, only on that session (the connection carrying it is
    /// that session's, so a replaced session fails here, not on the server).
    pub(crate) async fn multi_inner(
        &self,
        ops: Vec<Op>,
        on: Option<u64>,
    ) -> Result<Vec<OpResult>, TreeError> {
        if ops.is_empty() {
            // A contact with the server: it lets an expired session be noticed and replaced.
            self.conn()
                .await?
                .client
                .check_stat("/")
                .await
                .map_err(|e| tree_error(e, "/"))?;
            return Ok(Vec::new());
        }
        for op in &ops {
            validate_path(op.path())?;
        }
        // ZooKeeper drops the connection of a request over its buffer: refused here instead.
        let bytes = lading_core::tree::request_bytes(&ops);
        if bytes > lading_core::tree::ZK_MAX_REQUEST_BYTES {
            return Err(TreeError::TooLarge {
                path: ops[0].path().to_string(),
                bytes,
                limit: lading_core::tree::ZK_MAX_REQUEST_BYTES,
            });
        }
        let conn = self.conn_now()?;
        if on.is_some_and(|s| s != conn.session) {
            return Err(TreeError::SessionExpired);
        }
        if conn.terminated() {
            // Never move a multi to a new session: its checks were made under the old one.
            self.renew(&conn).await?;
            return Err(TreeError::SessionExpired);
        }
        let changes = Self::cached_changes(&conn, &ops);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let mark = conn.cache.mark();
            self.stats.multis.fetch_add(1, Ordering::Relaxed);
            match Self::send_multi(&conn, &ops).await {
                Ok(results) => {
                    Self::sync_cache(&conn, mark, &changes).await;
                    return Ok(ops
                        .iter()
                        .zip(results)
                        .map(|(_, r)| match r {
                            zk::MultiWriteResult::Check => OpResult::Check,
                            zk::MultiWriteResult::Delete => OpResult::Delete,
                            zk::MultiWriteResult::Create { path, .. } => OpResult::Create(path),
                            zk::MultiWriteResult::SetData { stat: s } => OpResult::Set(stat(&s)),
                            _ => OpResult::Check,
                        })
                        .collect());
                }
                Err(zk::MultiWriteError::OperationFailed { index, source }) => {
                    let path = ops.get(index).map(Op::path).unwrap_or("/").to_string();
                    let mut cause = match (&source, ops.get(index)) {
                        // A create finds no node when its parent is missing: name the parent.
                        (zk::Error::NoNode, Some(Op::Create { path, .. })) => {
                            TreeError::NoNode(lading_core::tree::split_path(path).0.to_string())
                        }
                        _ => tree_error(source, &path),
                    };
                    if let (TreeError::BadVersion { .. }, Some(op)) = (&cause, ops.get(index)) {
                        cause = self.bad_version(&conn, op).await;
                    }
                    // The server just told us about one child; a cached folder that said
                    // otherwise is fixed now (its event follows).
                    match (&cause, ops.get(index)) {
                        (TreeError::NoNode(p), Some(Op::Check { .. } | Op::Delete { .. })) => {
                            conn.cache.fix(p, false)
                        }
                        (TreeError::NodeExists(p), Some(Op::Create { .. })) => {
                            conn.cache.fix(p, true)
                        }
                        _ => {}
                    }
                    return Err(TreeError::Multi {
                        index,
                        op_path: path,
                        cause: Box::new(cause),
                    });
                }
                Err(zk::MultiWriteError::RequestFailed { source }) => match source {
                    zk::Error::ConnectionLoss
                    | zk::Error::Timeout
                    | zk::Error::SessionExpired
                    | zk::Error::Custom(_)
                        if attempts < 5 =>
                    {
                        self.stats.read_backs.fetch_add(1, Ordering::Relaxed);
                        match self.read_back(&conn, &ops).await? {
                            Outcome::Applied(results) => return Ok(results),
                            Outcome::NotApplied if conn.terminated() => {
                                self.renew(&conn).await?;
                                return Err(TreeError::SessionExpired);
                            }
                            Outcome::NotApplied => continue,
                        }
                    }
                    zk::Error::SessionExpired => {
                        self.renew(&conn).await?;
                        return Err(TreeError::SessionExpired);
                    }
                    e => return Err(tree_error(e, ops[0].path())),
                },
            }
        }
    }

    /// The full BadVersion error for a failed versioned op (reads the actual version).
    pub(crate) async fn bad_version(&self, conn: &Conn, op: &Op) -> TreeError {
        let (path, expected) = match op {
            Op::Check { path, version }
            | Op::Set { path, version, .. }
            | Op::Delete { path, version } => (path.clone(), version.unwrap_or(-1)),
            Op::Create { path, .. } => (path.clone(), -1),
        };
        let actual = match conn.client.check_stat(&path).await {
            Ok(Some(s)) => s.version,
            _ => -1,
        };
        TreeError::BadVersion {
            path,
            expected,
            actual,
        }
    }

    /// Waits for the connection to come back (or the session to end), then reads back whether
    /// `ops` were applied.
    pub(crate) async fn read_back(
        &self,
        conn: &Arc<Conn>,
        ops: &[Op],
    ) -> Result<Outcome, TreeError> {
        let witness = lading_core::tree::lost_reply_witness(ops);
        let Some(witness) = witness else {
            // Only checks, deletes and sequential creates: sending again is harmless except that
            // a lost sequential create leaves an empty id node behind (as a crash would).
            tracing::warn!("multi reply lost; sending it again (no witness to read back)");
            return Ok(Outcome::NotApplied);
        };
        // The witness is read on the multi's own session. If that session has expired, the
        // lease the multi was checked under is gone, and the data cannot tell ours from a live
        // worker's identical move made since (same state, same second): the only safe answer
        // is "not applied". A read that succeeds on the old session proves it alive, so no one
        // else can have moved the item.
        if conn.terminated() {
            return Ok(Outcome::NotApplied);
        }
        let deadline = tokio::time::Instant::now() + self.patience();
        let read = on_session(conn, deadline, |c| {
            let path = witness.path().to_string();
            async move { c.client.get_data(&path).await }
        });
        let node = match read.await {
            Ok((d, st)) => Some(Node {
                data: data_of(d),
                stat: stat(&st),
            }),
            Err(zk::Error::NoNode) => None,
            Err(zk::Error::SessionExpired | zk::Error::ClientClosed) => {
                return Ok(Outcome::NotApplied);
            }
            Err(_) if conn.terminated() => return Ok(Outcome::NotApplied),
            Err(e) => return Err(tree_error(e, witness.path())),
        };
        // Changed by someone else since counts as not applied: sending again fails
        // cleanly on the version check, which is the truthful answer for the caller.
        let applied = lading_core::tree::lost_reply_applied(witness, node.as_ref(), conn.session);
        tracing::warn!(
            path = witness.path(),
            applied,
            "multi reply lost in a connection drop; resolved by reading back"
        );
        if !applied {
            return Ok(Outcome::NotApplied);
        }
        let mut results = Vec::with_capacity(ops.len());
        for op in ops {
            results.push(match op {
                Op::Check { .. } => OpResult::Check,
                Op::Delete { .. } => OpResult::Delete,
                Op::Create { path, .. } => OpResult::Create(path.clone()),
                Op::Set { path, .. } => match self.exists(path).await? {
                    Some(s) => OpResult::Set(s),
                    None => return Err(TreeError::NoNode(path.clone())),
                },
            });
        }
        Ok(Outcome::Applied(results))
    }
}
