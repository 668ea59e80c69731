//! Persistent recursive watches: the change feeds (`Tree::changes`) and the events that keep
//! a session's cache of long queues current.

use super::*;

/// A change feed: its own session (so it outlives any session of the tree's), with one
/// persistent recursive watch per prefix; its reads go through that session, so they see
/// what its events reported.
pub(crate) struct Feed {
    pub(crate) rx: tokio::sync::mpsc::UnboundedReceiver<Change>,
    pub(crate) client: Arc<std::sync::Mutex<Option<zk::Client>>>,
}

impl Feed {
    fn client(&self) -> Result<zk::Client, TreeError> {
        self.client
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| TreeError::ConnectionLoss("the change feed is reconnecting".into()))
    }
}

impl ChangeFeed for Feed {
    fn next(&mut self) -> BoxFuture<'_, Option<Change>> {
        Box::pin(self.rx.recv())
    }

    fn get_many<'a>(&'a self, paths: &'a [String]) -> TreeFuture<'a, Vec<Option<Node>>> {
        Box::pin(async move {
            let first = first_of(paths)?;
            read_many(&self.client()?, paths)
                .await
                .map_err(|e| tree_error(e, first))
        })
    }

    fn children<'a>(&'a self, path: &'a str) -> Names<'a> {
        Box::pin(async move {
            validate_path(path)?;
            let mut c = self
                .client()?
                .list_children(path)
                .await
                .map_err(|e| tree_error(e, path))?;
            c.sort();
            Ok(c)
        })
    }
}

/// Opens a client for a change feed and sets its watches.
pub(crate) async fn feed_session(
    connect: &str,
    opts: &ZkOptions,
    prefixes: &[String],
) -> Result<(zk::Client, Vec<zk::PersistentWatcher>), TreeError> {
    let connector = zk::Client::connector().with_session_timeout(opts.session_timeout);
    let client = tokio::time::timeout(opts.connect_timeout, connector.connect(connect))
        .await
        .map_err(|_| unreachable_error(hosts_of(connect), opts.connect_timeout))?
        .map_err(|e| tree_error(e, "/"))?;
    let watchers = watch_all(&client, prefixes).await?;
    Ok((client, watchers))
}

async fn watch_all(
    client: &zk::Client,
    prefixes: &[String],
) -> Result<Vec<zk::PersistentWatcher>, TreeError> {
    let mut ws = Vec::new();
    for p in prefixes {
        ws.push(
            client
                .watch(p, zk::AddWatchMode::PersistentRecursive)
                .await
                .map_err(|e| tree_error(e, p))?,
        );
    }
    Ok(ws)
}

/// Follows `prefixes` for a feed until the feed is dropped or the tree closed. A
/// disconnection or a new session is reported as [`Change::Lost`] (events of the gap are not
/// replayed by ZooKeeper), then the watches are set again.
pub(crate) async fn feed(
    connect: String,
    opts: ZkOptions,
    prefixes: Vec<String>,
    tx: tokio::sync::mpsc::UnboundedSender<Change>,
    mut shut: tokio::sync::watch::Receiver<bool>,
    first: (zk::Client, Vec<zk::PersistentWatcher>),
    shared: Arc<std::sync::Mutex<Option<zk::Client>>>,
) {
    let mut current = Some(first);
    let mut kept: Option<zk::Client> = None;
    let mut gap = false;
    loop {
        let (client, watchers) = match current.take() {
            Some(cw) => cw,
            None => {
                let again = async {
                    match kept.take() {
                        // The same session, reconnected: watch again.
                        Some(c) => match watch_all(&c, &prefixes).await {
                            Ok(ws) => Ok((c, ws)),
                            Err(e) => Err(e),
                        },
                        None => feed_session(&connect, &opts, &prefixes).await,
                    }
                };
                let r = tokio::select! {
                    r = again => r,
                    _ = shut.wait_for(|s| *s) => return,
                    _ = tx.closed() => return,
                };
                match r {
                    Ok(cw) => cw,
                    Err(e) => {
                        tracing::warn!("change feed: {e}; trying again");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                }
            }
        };
        *shared.lock().unwrap_or_else(|p| p.into_inner()) = Some(client.clone());
        // A gap is reported once the watches are back: whoever re-reads then misses nothing.
        if std::mem::take(&mut gap) && tx.send(Change::Lost).is_err() {
            return;
        }
        let (etx, mut erx) = tokio::sync::mpsc::unbounded_channel();
        let mut forwarders = tokio::task::JoinSet::new();
        for mut w in watchers {
            let etx = etx.clone();
            forwarders.spawn(async move {
                loop {
                    let ev = w.changed().await;
                    let end = ev.event_type == zk::EventType::Session;
                    if etx.send(ev).is_err() || end {
                        return;
                    }
                }
            });
        }
        drop(etx);
        loop {
            let ev = tokio::select! {
                ev = erx.recv() => ev,
                _ = shut.wait_for(|s| *s) => return,
                _ = tx.closed() => return,
            };
            let Some(ev) = ev else { break };
            let node = matches!(
                ev.event_type,
                zk::EventType::NodeCreated
                    | zk::EventType::NodeDeleted
                    | zk::EventType::NodeDataChanged
            );
            if node && tx.send(Change::Node(ev.path.to_string())).is_err() {
                return;
            }
            if ev.event_type == zk::EventType::Session {
                break;
            }
        }
        forwarders.abort_all();
        gap = true;
        // Back on the same session when it recovers, else on a new one.
        let mut state = client.state_watcher();
        loop {
            let st = state.peek_state();
            if st == zk::SessionState::SyncConnected {
                kept = Some(client.clone());
                break;
            }
            if st.is_terminated() {
                break;
            }
            tokio::select! {
                _ = state.changed() => {}
                _ = shut.wait_for(|s| *s) => return,
                _ = tx.closed() => return,
            }
        }
    }
}

/// Applies the persistent recursive watches' events to the cache until the session ends.
/// After a disconnection the watches are set up afresh and the cache forgotten: events of the
/// gap are lost (ZOOKEEPER-4698), and a watch may not survive a move to another server.
pub(crate) async fn follow(
    client: zk::Client,
    cache: Arc<Cache>,
    mut watchers: Vec<zk::PersistentWatcher>,
) {
    let mut state = client.state_watcher();
    loop {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut forwarders = tokio::task::JoinSet::new();
        for mut w in watchers.drain(..) {
            let tx = tx.clone();
            forwarders.spawn(async move {
                loop {
                    let ev = w.changed().await;
                    let end = ev.event_type == zk::EventType::Session
                        && ev.session_state != zk::SessionState::SyncConnected;
                    if tx.send(ev).is_err() || end {
                        // A watcher must not be polled after a terminal event; after a
                        // disconnection it is replaced anyway.
                        return;
                    }
                }
            });
        }
        drop(tx);
        // Follow events until the connection is lost.
        loop {
            tokio::select! {
                s = state.changed() => {
                    if s.is_terminated() {
                        cache.invalidate();
                        return;
                    }
                    if s == zk::SessionState::Disconnected {
                        break;
                    }
                }
                ev = rx.recv() => match ev {
                    Some(ev) => match ev.event_type {
                        zk::EventType::NodeCreated => cache.apply(&ev.path, true),
                        zk::EventType::NodeDeleted => cache.apply(&ev.path, false),
                        _ => {}
                    },
                    None => break,
                },
            }
        }
        forwarders.abort_all();
        // Said here, not where the state changed: the watchers' own session events may end
        // the loop first (each of the two is taken up in turn, at random).
        if state.peek_state().is_terminated() {
            cache.invalidate();
            return;
        }
        tracing::warn!(
            "ZooKeeper connection lost; reconnecting (the store's operations wait for it)"
        );
        // Wait for the session to come back, then watch again from scratch.
        loop {
            let s = state.peek_state();
            if s.is_terminated() {
                cache.invalidate();
                return;
            }
            if s == zk::SessionState::SyncConnected {
                break;
            }
            state.changed().await;
        }
        for root in cache.roots() {
            match client
                .watch(root, zk::AddWatchMode::PersistentRecursive)
                .await
            {
                Ok(w) => watchers.push(w),
                Err(e) => {
                    tracing::warn!(root, "cannot watch again after reconnecting: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        cache.invalidate();
        if watchers.len() < cache.roots().len() {
            // Try the whole reconnection step again shortly.
            watchers.clear();
            continue;
        }
    }
}
