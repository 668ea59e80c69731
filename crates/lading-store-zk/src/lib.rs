//! The coordination tree on Apache ZooKeeper: the tree *is* the ZooKeeper tree, in Merritt's
//! layout, so Merritt's own tools read and drive what Lading writes.
//!
//! A [`ZkTree`] is one ZooKeeper session at a time. What it adds to the plain client:
//!
//! - **Expiry is told from connection loss.** A lost connection is waited out (the client
//!   reconnects to any server of the ensemble on the same session, with backoff); reads are
//!   retried. An expired session is replaced by a new one on the next call, and
//!   [`Tree::session_id`] changes, so every lease taken under the old one is lost. A `multi` is
//!   never moved silently to the new session: it fails with `SessionExpired`.
//! - **A `multi` whose reply was lost is resolved by reading back**, never by blindly sending
//!   it again: its first version-checked `set` (or plain `create`) is read to tell "applied"
//!   from "not applied". Only a `multi` found not applied is sent again, and because it carries
//!   version checks a second application is impossible anyway.
//! - **Long queues** (`/jobs/states/*`, the access queues) are served from a per-session cache
//!   kept fresh by one persistent recursive watch (see `cache`), so acquisition reads the head
//!   of a 100,000-job queue without listing it.
//! - **Empty nodes** are written with zero-length data, as Merritt's Java library writes them
//!   (`new byte[0]`); zero-length and null data both read back as "no data".

mod cache;
mod multi;
mod watch;

use cache::{Cache, Lookup};
use lading_core::CreateMode;
use lading_core::tree::{
    BoxFuture, Names, Node, Op, OpResult, Stat, Tree, TreeError, TreeFuture, Watch, WatchKind,
};
use lading_core::tree::{Change, ChangeFeed, Changes, validate_path};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::task::JoinHandle;
use watch::{Feed, feed, feed_session, follow};
use zookeeper_client as zk;

/// How a [`ZkTree`] connects and what it caches.
#[derive(Debug, Clone)]
pub struct ZkOptions {
    /// Session timeout asked of the server (it may clamp it to its own bounds).
    pub session_timeout: Duration,
    /// How long [`ZkTree::open`] waits for a server to answer.
    pub connect_timeout: Duration,
    /// Folders whose descendants' child lists are cached (see the crate docs).
    pub cached_roots: Vec<String>,
}

impl Default for ZkOptions {
    fn default() -> Self {
        ZkOptions {
            session_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(15),
            cached_roots: vec![
                "/jobs/states".into(),
                "/batches".into(),
                "/access/small".into(),
                "/access/large".into(),
            ],
        }
    }
}

/// One session and what hangs off it.
struct Conn {
    client: zk::Client,
    session: u64,
    cache: Arc<Cache>,
    events: Vec<JoinHandle<()>>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        for h in &self.events {
            h.abort();
        }
    }
}

impl Conn {
    fn terminated(&self) -> bool {
        self.client.state().is_terminated()
    }
}

/// The coordination tree on a ZooKeeper ensemble.
pub struct ZkTree {
    /// `host:port[,host:port…][/chroot]`, as the client takes it.
    connect: String,
    opts: ZkOptions,
    /// `None` once closed.
    current: RwLock<Option<Arc<Conn>>>,
    renewing: tokio::sync::Mutex<()>,
    closed: AtomicBool,
    /// Set when closed: ends the change feeds.
    shut: tokio::sync::watch::Sender<bool>,
    stats: Counters,
}

#[derive(Default)]
struct Counters {
    multis: AtomicU64,
    reads: AtomicU64,
    cached_reads: AtomicU64,
    sessions: AtomicU64,
    read_backs: AtomicU64,
}

/// What a [`ZkTree`] has done since it was opened.
#[derive(Debug, Clone, Copy, Default)]
pub struct ZkStats {
    /// `multi` requests sent (each one round trip and one ZooKeeper transaction).
    pub multis: u64,
    /// Read requests sent to a server.
    pub reads: u64,
    /// Child listings served from the watched cache without a round trip.
    pub cached_reads: u64,
    /// Sessions opened (1 + renewals after expiry).
    pub sessions: u64,
    /// `multi`s whose reply was lost and whose outcome was read back.
    pub read_backs: u64,
}

/// Parses `zk://host:port[,host:port…][/chroot]` into the client's connect string.
pub fn parse_url(url: &str) -> Result<String, TreeError> {
    let rest = url.strip_prefix("zk://").ok_or_else(|| {
        TreeError::Backend(format!(
            "{url:?} is not a ZooKeeper URL; expected zk://host:port[,host:port…][/chroot]"
        ))
    })?;
    let (hosts, chroot) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if hosts.is_empty() {
        return Err(TreeError::Backend(format!(
            "{url:?} names no ZooKeeper server"
        )));
    }
    for h in hosts.split(',') {
        let ok = h
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !ok {
            return Err(TreeError::Backend(format!(
                "{url:?}: {h:?} is not host:port"
            )));
        }
    }
    if !chroot.is_empty() && chroot != "/" {
        validate_path(chroot)?;
    }
    Ok(format!(
        "{hosts}{}",
        if chroot == "/" { "" } else { chroot }
    ))
}

/// Splits `zk://hosts[/chroot]` into (hosts, chroot), chroot `/` when none.
pub fn split_url(url: &str) -> Result<(String, String), TreeError> {
    let c = parse_url(url)?;
    Ok((hosts_of(&c).to_string(), chroot_of(&c).to_string()))
}

fn chroot_of(connect: &str) -> &str {
    connect.find('/').map(|i| &connect[i..]).unwrap_or("/")
}

fn hosts_of(connect: &str) -> &str {
    connect.find('/').map(|i| &connect[..i]).unwrap_or(connect)
}

/// Maps a client error about `path` to the tree's error.
fn tree_error(e: zk::Error, path: &str) -> TreeError {
    match e {
        zk::Error::NoNode => TreeError::NoNode(path.into()),
        zk::Error::NodeExists => TreeError::NodeExists(path.into()),
        zk::Error::BadVersion => TreeError::BadVersion {
            path: path.into(),
            expected: -1,
            actual: -1,
        },
        zk::Error::NotEmpty => TreeError::NotEmpty(path.into()),
        zk::Error::NoChildrenForEphemerals => TreeError::NoChildrenForEphemerals(path.into()),
        zk::Error::SessionExpired => TreeError::SessionExpired,
        zk::Error::ConnectionLoss | zk::Error::Timeout | zk::Error::Custom(_) => {
            TreeError::ConnectionLoss(format!("{e} (at {path})"))
        }
        zk::Error::BadArguments(msg) => TreeError::InvalidPath(path.into(), msg),
        e => TreeError::Backend(format!("ZooKeeper: {e} (at {path})")),
    }
}

fn stat(s: &zk::Stat) -> Stat {
    Stat {
        version: s.version,
        ephemeral_owner: s.ephemeral_owner as u64,
        ctime_ms: s.ctime.max(0) as u64,
        mtime_ms: s.mtime.max(0) as u64,
        pzxid: Some(s.pzxid),
    }
}

fn data_of(d: Vec<u8>) -> Option<Vec<u8>> {
    if d.is_empty() { None } else { Some(d) }
}

fn acls() -> zk::Acls<'static> {
    zk::Acls::anyone_all()
}

fn create_options(mode: CreateMode) -> zk::CreateOptions<'static> {
    match mode {
        CreateMode::Persistent => zk::CreateMode::Persistent.with_acls(acls()),
        CreateMode::PersistentSequential => zk::CreateMode::PersistentSequential.with_acls(acls()),
        CreateMode::Ephemeral => zk::CreateMode::Ephemeral.with_acls(acls()),
    }
}

/// What reading back a `multi` whose reply was lost found.
enum Outcome {
    Applied(Vec<OpResult>),
    NotApplied,
}

impl ZkTree {
    /// Opens a session on the ensemble named by `url` (`zk://h1:p,h2:p/chroot`). Fails with a
    /// clear error when no server answers within the connect timeout or the chroot is missing.
    pub async fn open(url: &str, opts: ZkOptions) -> Result<ZkTree, TreeError> {
        let connect = parse_url(url)?;
        let conn = Self::connect(&connect, &opts).await?;
        let chroot = chroot_of(&connect);
        if chroot != "/" {
            match conn.client.check_stat("/").await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    return Err(TreeError::Backend(format!(
                        "the chroot {chroot} does not exist on ZooKeeper {}; create it first \
                         (e.g. `zkCli.sh create {chroot}`) or fix the URL",
                        hosts_of(&connect)
                    )));
                }
                Err(e) => return Err(tree_error(e, chroot)),
            }
        }
        Ok(ZkTree {
            connect,
            opts,
            current: RwLock::new(Some(conn)),
            renewing: tokio::sync::Mutex::new(()),
            closed: AtomicBool::new(false),
            shut: tokio::sync::watch::channel(false).0,
            stats: Counters {
                sessions: AtomicU64::new(1),
                ..Counters::default()
            },
        })
    }

    /// Counters since the tree was opened.
    pub fn stats(&self) -> ZkStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ZkStats {
            multis: g(&self.stats.multis),
            reads: g(&self.stats.reads),
            cached_reads: g(&self.stats.cached_reads),
            sessions: g(&self.stats.sessions),
            read_backs: g(&self.stats.read_backs),
        }
    }

    /// Deletes `path` and everything below it: the subtree is listed a level at a time with
    /// read-only multis of up to 500 listings, then deleted children first in multis of up to
    /// 500 deletes. About 2 round trips per 500 nodes, whatever the shape.
    pub async fn delete_tree(&self, path: &str) -> Result<(), TreeError> {
        validate_path(path)?;
        let conn = self.conn().await?;
        let mut levels: Vec<Vec<String>> = Vec::new();
        let mut level = vec![path.to_string()];
        while !level.is_empty() {
            let mut next = Vec::new();
            for chunk in level.chunks(500) {
                let mut r = conn.client.new_multi_reader();
                for p in chunk {
                    r.add_get_children(p).map_err(|e| tree_error(e, p))?;
                }
                let results = r.commit().await.map_err(|e| tree_error(e, path))?;
                for (p, res) in chunk.iter().zip(results) {
                    if let zk::MultiReadResult::Children { children } = res {
                        next.extend(children.iter().map(|c| lading_core::tree::join_path(p, c)));
                    }
                }
            }
            levels.push(std::mem::replace(&mut level, next));
        }
        for level in levels.iter().rev() {
            for chunk in level.chunks(500) {
                let ops = chunk.iter().map(|p| Op::delete(p.clone(), None)).collect();
                match self.multi(ops).await {
                    Ok(_) => {}
                    // Someone else deleted one meanwhile: delete the rest one by one.
                    Err(e) if matches!(e.root(), TreeError::NoNode(_)) => {
                        for p in chunk {
                            match self.delete(p, None).await {
                                Ok(()) | Err(TreeError::NoNode(_)) => {}
                                Err(e) => return Err(e),
                            }
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Creates `chroot` (and its parents) on the ensemble at `hosts` if missing.
    pub async fn ensure_chroot(hosts: &str, chroot: &str) -> Result<(), TreeError> {
        validate_path(chroot)?;
        let within = Duration::from_secs(15);
        let client = tokio::time::timeout(within, zk::Client::connect(hosts))
            .await
            .map_err(|_| unreachable_error(hosts, within))?
            .map_err(|e| tree_error(e, "/"))?;
        let mut path = String::new();
        for seg in chroot[1..].split('/') {
            path.push('/');
            path.push_str(seg);
            match client
                .create(&path, &[], &create_options(CreateMode::Persistent))
                .await
            {
                Ok(_) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(tree_error(e, &path)),
            }
        }
        Ok(())
    }

    async fn connect(connect: &str, opts: &ZkOptions) -> Result<Arc<Conn>, TreeError> {
        // Servers that are down or unreachable are tried again, with backoff, until the
        // connect timeout has passed.
        let deadline = tokio::time::Instant::now() + opts.connect_timeout;
        let mut backoff = Duration::from_millis(100);
        let client = loop {
            let connector = zk::Client::connector().with_session_timeout(opts.session_timeout);
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(left, connector.connect(connect)).await {
                Ok(Ok(c)) => break c,
                Ok(Err(zk::Error::Timeout | zk::Error::NoHosts | zk::Error::ConnectionLoss))
                    if tokio::time::Instant::now() + backoff < deadline =>
                {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Ok(Err(zk::Error::Timeout | zk::Error::NoHosts | zk::Error::ConnectionLoss))
                | Err(_) => {
                    return Err(unreachable_error(hosts_of(connect), opts.connect_timeout));
                }
                Ok(Err(e)) => return Err(tree_error(e, "/")),
            }
        };
        let cache = Arc::new(Cache::new(opts.cached_roots.clone()));
        // The watches are in place before the session is handed out, so no change made through
        // it can be missed by the cache.
        let mut watchers = Vec::new();
        for root in cache.roots() {
            let w = client
                .watch(root, zk::AddWatchMode::PersistentRecursive)
                .await
                .map_err(|e| tree_error(e, root))?;
            watchers.push(w);
        }
        let events = vec![tokio::spawn(follow(
            client.clone(),
            cache.clone(),
            watchers,
        ))];
        let session = client.session_id().0 as u64;
        tracing::debug!(
            session = format!("{session:#x}"),
            "ZooKeeper session opened"
        );
        Ok(Arc::new(Conn {
            client,
            session,
            cache,
            events,
        }))
    }

    fn conn_now(&self) -> Result<Arc<Conn>, TreeError> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| TreeError::Backend("the ZooKeeper session was closed".into()))
    }

    /// The live session, replacing an expired one first.
    async fn conn(&self) -> Result<Arc<Conn>, TreeError> {
        let c = self.conn_now()?;
        if c.terminated() {
            self.renew(&c).await
        } else {
            Ok(c)
        }
    }

    async fn renew(&self, old: &Arc<Conn>) -> Result<Arc<Conn>, TreeError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(TreeError::Backend(
                "the ZooKeeper session was closed".into(),
            ));
        }
        let _g = self.renewing.lock().await;
        let cur = self.conn_now()?;
        if !Arc::ptr_eq(&cur, old) {
            return Ok(cur);
        }
        tracing::warn!(
            session = format!("{:#x}", old.session),
            "ZooKeeper session expired; opening a new one (its leases are lost)"
        );
        let new = Self::connect(&self.connect, &self.opts).await?;
        self.stats.sessions.fetch_add(1, Ordering::Relaxed);
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(new.clone());
        Ok(new)
    }

    /// How long a lost connection is waited out before an operation gives up.
    fn patience(&self) -> Duration {
        self.opts.session_timeout + Duration::from_secs(2)
    }

    /// Runs a read of `path` (given to `f` with the session), waiting out connection loss and
    /// moving to a new session after expiry (reads carry no lease, so they may).
    async fn read<T, F, Fut>(&self, path: &str, f: F) -> Result<T, TreeError>
    where
        F: Fn(Arc<Conn>, String) -> Fut,
        Fut: std::future::Future<Output = Result<T, zk::Error>>,
    {
        validate_path(path)?;
        let deadline = tokio::time::Instant::now() + self.patience();
        loop {
            let conn = self.conn().await?;
            self.stats.reads.fetch_add(1, Ordering::Relaxed);
            match on_session(&conn, deadline, |c| f(c, path.to_string())).await {
                Ok(v) => return Ok(v),
                Err(zk::Error::SessionExpired) => {
                    self.renew(&conn).await?;
                }
                Err(e) => return Err(tree_error(e, path)),
            }
        }
    }

    /// A node's stat, `None` when it is missing.
    async fn stat_of(&self, path: &str) -> Result<Option<zk::Stat>, TreeError> {
        self.read(
            path,
            |c, path| async move { c.client.check_stat(&path).await },
        )
        .await
    }

    /// A read where a missing node is `None`.
    async fn read_opt<T, F, Fut>(&self, path: &str, f: F) -> Result<Option<T>, TreeError>
    where
        F: Fn(Arc<Conn>, String) -> Fut,
        Fut: std::future::Future<Output = Result<T, zk::Error>>,
    {
        match self.read(path, f).await {
            Ok(v) => Ok(Some(v)),
            Err(TreeError::NoNode(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The session's ZooKeeper client (for tests that reach past the tree).
    pub fn session_info(&self) -> Option<zk::SessionInfo> {
        self.conn_now().ok().map(|c| c.client.session().clone())
    }

    /// The connect string this tree uses.
    pub fn connect_string(&self) -> &str {
        &self.connect
    }

    /// Waits until the client has seen its session expire (for tests).
    pub async fn wait_expired(&self, within: Duration) -> bool {
        let Ok(c) = self.conn_now() else {
            return true;
        };
        let mut w = c.client.state_watcher();
        let wait = async {
            loop {
                if w.peek_state().is_terminated() {
                    return;
                }
                w.changed().await;
            }
        };
        tokio::time::timeout(within, wait).await.is_ok()
    }

    async fn children_listing(&self, path: &str) -> Result<Option<Vec<String>>, TreeError> {
        self.read_opt(path, |c, path| async move {
            c.client.list_children(&path).await
        })
        .await
    }

    /// A page of a cached folder, priming it first when needed. `None` when not cached.
    async fn cached_page(
        &self,
        path: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Option<Vec<String>>, TreeError> {
        let conn = self.conn().await?;
        if !conn.cache.covers(path) {
            return Ok(None);
        }
        if let Lookup::Hit(p) = conn.cache.page(path, after, limit) {
            self.stats.cached_reads.fetch_add(1, Ordering::Relaxed);
            return Ok(Some(p));
        }
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        let Some(generation) = conn.cache.begin_prime(path) else {
            return Ok(None);
        };
        match conn.client.list_children(path).await {
            Ok(l) => conn.cache.finish_prime(path, generation, Some(l)),
            Err(zk::Error::NoNode) => conn.cache.finish_prime(path, generation, None),
            Err(_) => {
                conn.cache.abort_prime(path, generation);
                return Ok(None);
            }
        }
        match conn.cache.page(path, after, limit) {
            Lookup::Hit(p) => Ok(Some(p)),
            Lookup::Miss => Ok(None),
        }
    }
}

/// Runs `f` on `conn`'s session, waiting out connection loss (with backoff) until `deadline`.
/// Never moves to another session: expiry comes back as `SessionExpired`.
async fn on_session<T, F, Fut>(
    conn: &Arc<Conn>,
    deadline: tokio::time::Instant,
    f: F,
) -> Result<T, zk::Error>
where
    F: Fn(Arc<Conn>) -> Fut,
    Fut: std::future::Future<Output = Result<T, zk::Error>>,
{
    let mut backoff = Duration::from_millis(20);
    loop {
        match f(conn.clone()).await {
            Err(zk::Error::ConnectionLoss | zk::Error::Timeout | zk::Error::Custom(_))
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
            r => return r,
        }
    }
}

fn unreachable_error(hosts: &str, within: Duration) -> TreeError {
    TreeError::ConnectionLoss(format!(
        "no ZooKeeper server at {hosts} answered within {} s; is it running?",
        within.as_secs()
    ))
}

/// Reads `paths` (validated by the caller), one read-only `multi` per 500 of them.
/// The first of `paths` (`/` for none), named by an error of a read of them all, once all
/// are checked to be paths.
fn first_of(paths: &[String]) -> Result<&str, TreeError> {
    paths.iter().try_for_each(|p| validate_path(p))?;
    Ok(paths.first().map(String::as_str).unwrap_or("/"))
}

async fn read_many(client: &zk::Client, paths: &[String]) -> Result<Vec<Option<Node>>, zk::Error> {
    let mut out = Vec::with_capacity(paths.len());
    for chunk in paths.chunks(500) {
        let mut r = client.new_multi_reader();
        for p in chunk {
            r.add_get_data(p)?;
        }
        for res in r.commit().await? {
            out.push(match res {
                zk::MultiReadResult::Data { data, stat: st } => Some(Node {
                    data: data_of(data),
                    stat: stat(&st),
                }),
                zk::MultiReadResult::Error {
                    err: zk::Error::NoNode,
                } => None,
                zk::MultiReadResult::Error { err } => return Err(err),
                _ => {
                    return Err(zk::Error::UnexpectedError(
                        "a read answered with a child list".into(),
                    ));
                }
            });
        }
    }
    Ok(out)
}

impl Tree for ZkTree {
    fn kind(&self) -> &'static str {
        "zookeeper"
    }

    fn session_id(&self) -> u64 {
        self.conn_now().map(|c| c.session).unwrap_or(0)
    }

    fn get<'a>(&'a self, path: &'a str) -> TreeFuture<'a, Option<Node>> {
        Box::pin(async move {
            let get = |c: Arc<Conn>, path: String| async move { c.client.get_data(&path).await };
            let r = self.read_opt(path, get).await?;
            Ok(r.map(|(d, s)| Node {
                data: data_of(d),
                stat: stat(&s),
            }))
        })
    }

    /// One read-only `multi` per 500 paths: one round trip where `get` would take one each.
    fn get_many<'a>(&'a self, paths: &'a [String]) -> TreeFuture<'a, Vec<Option<Node>>> {
        Box::pin(async move {
            let first = first_of(paths)?;
            // Connection loss and expiry are waited out as for any read.
            self.read(first, |c, _| {
                let paths = paths.to_vec();
                async move { read_many(&c.client, &paths).await }
            })
            .await
        })
    }

    fn exists<'a>(&'a self, path: &'a str) -> TreeFuture<'a, Option<Stat>> {
        Box::pin(async move { Ok(self.stat_of(path).await?.as_ref().map(stat)) })
    }

    fn children<'a>(&'a self, path: &'a str) -> Names<'a> {
        Box::pin(async move {
            if let Some(all) = self.cached_page(path, None, usize::MAX).await? {
                return Ok(all);
            }
            let mut v = self
                .children_listing(path)
                .await?
                .ok_or_else(|| TreeError::NoNode(path.into()))?;
            v.sort();
            Ok(v)
        })
    }

    fn children_page<'a>(&'a self, path: &'a str, after: Option<&'a str>, max: usize) -> Names<'a> {
        Box::pin(async move {
            validate_path(path)?;
            if let Some(p) = self.cached_page(path, after, max).await? {
                return Ok(p);
            }
            let mut v = self.children_listing(path).await?.unwrap_or_default();
            v.sort();
            Ok(v.into_iter()
                .filter(|n| after.is_none_or(|a| n.as_str() > a))
                .take(max)
                .collect())
        })
    }

    fn count_children<'a>(&'a self, path: &'a str) -> TreeFuture<'a, u64> {
        Box::pin(async move {
            let s = self.stat_of(path).await?;
            Ok(s.map(|s| s.num_children.max(0) as u64).unwrap_or(0))
        })
    }

    fn multi(&self, ops: Vec<Op>) -> TreeFuture<'_, Vec<OpResult>> {
        // Inside the caller's span (a job's, a batch's), so its ids go with it.
        let span =
            tracing::debug_span!("multi", ops = ops.len(), first = ops.first().map(Op::path));
        Box::pin(tracing::Instrument::instrument(
            self.multi_inner(ops, None),
            span,
        ))
    }

    fn multi_on(&self, session: u64, ops: Vec<Op>) -> TreeFuture<'_, Vec<OpResult>> {
        let span =
            tracing::debug_span!("multi", ops = ops.len(), first = ops.first().map(Op::path));
        Box::pin(tracing::Instrument::instrument(
            self.multi_inner(ops, Some(session)),
            span,
        ))
    }

    fn watch<'a>(&'a self, path: &'a str, kind: WatchKind) -> TreeFuture<'a, Watch> {
        Box::pin(async move {
            validate_path(path)?;
            let conn = self.conn().await?;
            if kind == WatchKind::Children && conn.cache.covers(path) {
                let mut rx = conn.cache.subscribe(path);
                let mut state = conn.client.state_watcher();
                return Ok(Watch::new(async move {
                    tokio::select! {
                        _ = rx.changed() => {}
                        _ = state.changed() => {}
                    }
                }));
            }
            let watcher = match kind {
                WatchKind::Data => {
                    self.read(path, |c, path| async move {
                        c.client.check_and_watch_stat(&path).await.map(|(_, w)| w)
                    })
                    .await?
                }
                WatchKind::Children => {
                    let r = self
                        .read(path, |c, path| async move {
                            match c.client.get_and_watch_children(&path).await {
                                Ok((_, _, w)) => Ok(w),
                                // No folder yet: wake when it is created.
                                Err(zk::Error::NoNode) => {
                                    c.client.check_and_watch_stat(&path).await.map(|(_, w)| w)
                                }
                                Err(e) => Err(e),
                            }
                        })
                        .await;
                    r?
                }
            };
            Ok(Watch::new(async move {
                watcher.changed().await;
            }))
        })
    }

    fn changes<'a>(&'a self, prefixes: &'a [String]) -> Changes<'a> {
        Box::pin(async move {
            for p in prefixes {
                validate_path(p)?;
            }
            // The watches are set before this returns: nothing after it is missed.
            let first = feed_session(&self.connect, &self.opts, prefixes).await?;
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let client = Arc::new(std::sync::Mutex::new(Some(first.0.clone())));
            tokio::spawn(feed(
                self.connect.clone(),
                self.opts.clone(),
                prefixes.to_vec(),
                tx,
                self.shut.subscribe(),
                first,
                client.clone(),
            ));
            Ok(Some(Box::new(Feed { rx, client }) as Box<dyn ChangeFeed>))
        })
    }

    fn close(&self) -> TreeFuture<'_, ()> {
        Box::pin(async move {
            self.closed.store(true, Ordering::SeqCst);
            self.shut.send_replace(true);
            let conn = self
                .current
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            let Some(conn) = conn else {
                return Ok(());
            };
            // Dropping the last handle of the client ends the session, but the client sends
            // closeSession in the background. Delete this session's ephemeral nodes first, so
            // they are gone when `close` returns.
            if !conn.terminated()
                && let Ok(paths) = conn.client.list_ephemerals("/").await
            {
                for p in paths {
                    let _ = conn.client.delete(&p, None).await;
                }
            }
            drop(conn);
            Ok(())
        })
    }
}
