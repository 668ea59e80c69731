//! The coordination tree: the one interface every backend implements.
//!
//! It is ZooKeeper's data model, no more: nodes addressed by slash paths, each with optional
//! bytes and a version that counts its `set`s; persistent, sequential and ephemeral nodes; an
//! all-or-nothing `multi`; one-shot watches. Everything the engine guarantees is built from
//! these, so a backend that implements them faithfully gets the guarantees for free — and a
//! ZooKeeper ensemble implements them natively.
//!
//! A [`Tree`] value is one *session*: the ephemeral nodes it creates live exactly as long as
//! the session, and an expired session can never commit again.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A boxed, sendable future; keeps [`Tree`] object-safe (`Arc<dyn Tree>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a tree operation returns: a boxed future of its result.
pub type TreeFuture<'a, T> = BoxFuture<'a, Result<T, TreeError>>;

/// A tree operation's list of child names.
pub type Names<'a> = TreeFuture<'a, Vec<String>>;

/// A change feed, when the backend has one (`Tree::changes`).
pub type Changes<'a> = TreeFuture<'a, Option<Box<dyn ChangeFeed>>>;

/// Node metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Number of `set`s since creation (ZooKeeper's `version`), 0 when new.
    pub version: i32,
    /// Session that owns this ephemeral node, 0 for a persistent one.
    pub ephemeral_owner: u64,
    pub ctime_ms: u64,
    pub mtime_ms: u64,
    /// The order of the last change to this node's children (ZooKeeper's `pzxid`: the zxid of
    /// the transaction that last made or removed a child), where the backend keeps one; `None`
    /// on the embedded store, whose writers are all Lading's (Merritt's tools speak ZooKeeper)
    /// and move a reference in one transaction. Comparable between nodes of one tree.
    pub pzxid: Option<i64>,
}

/// A node's data and metadata. `data` is `None` for an empty node (no bytes at all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub data: Option<Vec<u8>>,
    pub stat: Stat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateMode {
    Persistent,
    /// Appends a 10-digit, per-parent increasing counter to the name.
    PersistentSequential,
    /// Removed when the creating session ends.
    Ephemeral,
}

/// One operation of a [`Tree::multi`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Fails unless the node exists (and, with `Some(v)`, has version `v`).
    Check { path: String, version: Option<i32> },
    Create {
        path: String,
        data: Option<Vec<u8>>,
        mode: CreateMode,
    },
    /// With `Some(v)`, fails unless the current version is `v`.
    Set {
        path: String,
        data: Option<Vec<u8>>,
        version: Option<i32>,
    },
    /// With `Some(v)`, fails unless the current version is `v`. Fails on a node with children.
    Delete { path: String, version: Option<i32> },
}

impl Op {
    pub fn check(path: impl Into<String>, version: Option<i32>) -> Op {
        Op::Check {
            path: path.into(),
            version,
        }
    }
    pub fn create(path: impl Into<String>, data: Option<Vec<u8>>) -> Op {
        Op::Create {
            path: path.into(),
            data,
            mode: CreateMode::Persistent,
        }
    }
    pub fn create_mode(path: impl Into<String>, data: Option<Vec<u8>>, mode: CreateMode) -> Op {
        Op::Create {
            path: path.into(),
            data,
            mode,
        }
    }
    pub fn set(path: impl Into<String>, data: Option<Vec<u8>>, version: Option<i32>) -> Op {
        Op::Set {
            path: path.into(),
            data,
            version,
        }
    }
    pub fn delete(path: impl Into<String>, version: Option<i32>) -> Op {
        Op::Delete {
            path: path.into(),
            version,
        }
    }
    pub fn path(&self) -> &str {
        match self {
            Op::Check { path, .. }
            | Op::Create { path, .. }
            | Op::Set { path, .. }
            | Op::Delete { path, .. } => path,
        }
    }
}

/// The result of one successful operation of a `multi`, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    Check,
    /// The created path (with the sequence suffix, for a sequential node).
    Create(String),
    Set(Stat),
    Delete,
}

/// The most bytes of paths and data one request to a ZooKeeper ensemble may carry: its
/// `jute.maxbuffer` (1 MiB less one byte by default) less room for the request's framing.
pub const ZK_MAX_REQUEST_BYTES: usize = 1_000_000;

/// The bytes `ops` put on the wire, near enough: each op's path and data and a few bytes of
/// framing.
pub fn request_bytes(ops: &[Op]) -> usize {
    ops.iter()
        .map(|op| {
            let data = match op {
                Op::Create { data, .. } | Op::Set { data, .. } => data.as_ref().map_or(0, Vec::len),
                _ => 0,
            };
            op.path().len() + data + 32
        })
        .sum()
}

/// What the tree refuses. Each variant says whether retrying the same call can help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    #[error("no node at {0}")]
    NoNode(String),
    #[error("node already exists at {0}")]
    NodeExists(String),
    #[error("version mismatch at {path}: expected {expected}, found {actual}")]
    BadVersion {
        path: String,
        expected: i32,
        actual: i32,
    },
    #[error("node {0} has children")]
    NotEmpty(String),
    #[error("ephemeral node {0} cannot have children")]
    NoChildrenForEphemerals(String),
    #[error("invalid path {0:?}: {1}")]
    InvalidPath(String, &'static str),
    #[error("session expired")]
    SessionExpired,
    #[error("connection lost: {0}")]
    ConnectionLoss(String),
    #[error("operation {index} of multi failed ({op_path}): {cause}")]
    Multi {
        index: usize,
        op_path: String,
        cause: Box<TreeError>,
    },
    #[error("store {0} is not a Lading store: {1}")]
    NotOurs(String, String),
    /// A request larger than the store takes in one go (ZooKeeper's `jute.maxbuffer`):
    /// refused before it is sent, so the session is never put at risk.
    #[error(
        "a write of {bytes} bytes (first at {path}) is more than the store takes in one request ({limit} bytes)"
    )]
    TooLarge {
        path: String,
        bytes: usize,
        limit: usize,
    },
    #[error("backend error: {0}")]
    Backend(String),
}

impl TreeError {
    /// Whether the same call may succeed later without anything else changing.
    pub fn is_retryable(&self) -> bool {
        match self {
            TreeError::ConnectionLoss(_) => true,
            TreeError::Multi { cause, .. } => cause.is_retryable(),
            _ => false,
        }
    }

    /// The error of the failing operation, for a `multi` error; the error itself otherwise.
    pub fn root(&self) -> &TreeError {
        match self {
            TreeError::Multi { cause, .. } => cause.root(),
            e => e,
        }
    }

    /// Index of the failing operation of a `multi`.
    pub fn failed_op(&self) -> Option<usize> {
        match self {
            TreeError::Multi { index, .. } => Some(*index),
            _ => None,
        }
    }
}

/// What a watch waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WatchKind {
    /// The node is created, set or deleted.
    Data,
    /// A child of the node is created or deleted.
    Children,
}

/// A one-shot watch: a future that completes when the watched change happens (or, spuriously,
/// when the backend cannot tell; a waiter always re-reads). Registered before the future is
/// returned, so a change after `watch` returns is never missed.
pub struct Watch(BoxFuture<'static, ()>);

impl Watch {
    pub fn new(fut: impl Future<Output = ()> + Send + 'static) -> Watch {
        Watch(Box::pin(fut))
    }
}

/// Waits for the first of `futs` to be ready: its index and output (a future that has been
/// ready must not be polled again). Never ready when there are none, where
/// `futures_util::future::select_all` panics: a caller whose every watch failed to be set
/// (its session lost) waits on its other branches instead.
pub async fn first_ready<F: Future + Unpin>(
    futs: impl IntoIterator<Item = F>,
) -> (usize, F::Output) {
    let mut futs: Vec<F> = futs.into_iter().collect();
    std::future::poll_fn(|cx| {
        for (i, f) in futs.iter_mut().enumerate() {
            if let Poll::Ready(out) = Pin::new(f).poll(cx) {
                return Poll::Ready((i, out));
            }
        }
        Poll::Pending
    })
    .await
}

impl Future for Watch {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.as_mut().poll(cx)
    }
}

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Watch")
    }
}

/// One report of a change feed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The node at this path was created, set or deleted.
    Node(String),
    /// Changes may have been missed (the feed reconnected, or the backend reloaded the
    /// tree): whoever follows re-reads what it needs.
    Lost,
}

/// A feed of changes (see [`Tree::changes`]), with reads of its own: a read through the feed
/// after it reported a change sees that change or a later state (on ZooKeeper the feed's
/// session may be on another server than the tree's, which may not have it yet).
pub trait ChangeFeed: Send + Sync {
    /// The next change; `None` when the feed has ended (the tree was closed).
    fn next(&mut self) -> BoxFuture<'_, Option<Change>>;

    /// Several nodes, as [`Tree::get_many`].
    fn get_many<'a>(&'a self, paths: &'a [String]) -> TreeFuture<'a, Vec<Option<Node>>>;

    /// Names of all children, sorted, as [`Tree::children`].
    fn children<'a>(&'a self, path: &'a str) -> Names<'a>;
}

/// The op of a `multi` whose reply was lost that tells, read back, whether it was applied:
/// its first version-checked `set` or plain (not sequential) `create` whose node no later op
/// of the same `multi` touches again (a lock created and deleted in one `multi` is gone either
/// way: taken as the witness, it called an applied requeue "not applied", found by
/// `lading-sim`). `None`: only checks, deletes, sequential creates and nodes touched again,
/// which nothing read back can tell apart.
pub fn lost_reply_witness(ops: &[Op]) -> Option<&Op> {
    ops.iter().enumerate().find_map(|(i, op)| {
        let kind = matches!(
            op,
            Op::Set {
                version: Some(_),
                ..
            }
        ) || matches!(op, Op::Create { mode, .. } if *mode != CreateMode::PersistentSequential);
        let touched_again = ops[i + 1..]
            .iter()
            .any(|later| !matches!(later, Op::Check { .. }) && later.path() == op.path());
        (kind && !touched_again).then_some(op)
    })
}

/// Whether `witness` (see [`lost_reply_witness`]), read back as `node` on the multi's own live
/// `session`, shows the multi applied: a set's node one version on with its data, a create's
/// node with its data (and, for an ephemeral node, owned by the session). Anything else is
/// "not applied"; a multi sent again then fails cleanly on its own checks.
pub fn lost_reply_applied(witness: &Op, node: Option<&Node>, session: u64) -> bool {
    match (witness, node) {
        (
            Op::Set {
                data,
                version: Some(v),
                ..
            },
            Some(n),
        ) => {
            n.stat.version == v + 1
                && n.data.as_deref().unwrap_or_default() == data.as_deref().unwrap_or_default()
        }
        (Op::Create { data, mode, .. }, Some(n)) => {
            n.data.as_deref().unwrap_or_default() == data.as_deref().unwrap_or_default()
                && (*mode != CreateMode::Ephemeral || n.stat.ephemeral_owner == session)
        }
        _ => false,
    }
}

/// Whether `path` is `prefix` or below it.
pub fn is_under(path: &str, prefix: &str) -> bool {
    prefix == "/"
        || (path.starts_with(prefix)
            && (path.len() == prefix.len() || path.as_bytes()[prefix.len()] == b'/'))
}

/// The coordination tree, as one session sees it.
pub trait Tree: Send + Sync + 'static {
    /// A short name of the backend kind (`sqlite`, `zookeeper`).
    fn kind(&self) -> &'static str;

    /// The current session. Changes when an expired session is replaced by a new one; a lease
    /// taken under an older session is lost.
    fn session_id(&self) -> u64;

    fn get<'a>(&'a self, path: &'a str) -> TreeFuture<'a, Option<Node>>;

    /// Several nodes at once, in order (`None` for a missing one). A backend may read them
    /// as one snapshot and with one look for other writers' changes; the default reads them
    /// one by one.
    fn get_many<'a>(&'a self, paths: &'a [String]) -> TreeFuture<'a, Vec<Option<Node>>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(paths.len());
            for p in paths {
                out.push(self.get(p).await?);
            }
            Ok(out)
        })
    }

    fn exists<'a>(&'a self, path: &'a str) -> TreeFuture<'a, Option<Stat>> {
        Box::pin(async move { Ok(self.get(path).await?.map(|n| n.stat)) })
    }

    /// Names (not paths) of all children, sorted. `NoNode` when `path` does not exist.
    fn children<'a>(&'a self, path: &'a str) -> Names<'a>;

    /// At most `max` children, sorted, strictly after `after`. The way to read the head of a
    /// very long queue without paying for its length. Fewer than `max` means there are no
    /// more (as the folder was when read): a reader stops there, without reading an empty
    /// page after it (on ZooKeeper, a listing each).
    fn children_page<'a>(&'a self, path: &'a str, after: Option<&'a str>, max: usize) -> Names<'a>;

    /// Number of children (ZooKeeper's `numChildren`).
    fn count_children<'a>(&'a self, path: &'a str) -> TreeFuture<'a, u64>;

    /// Applies every op or none. On failure the error is [`TreeError::Multi`] naming the first
    /// failing op; nothing was changed.
    fn multi(&self, ops: Vec<Op>) -> TreeFuture<'_, Vec<OpResult>>;

    /// [`multi`](Tree::multi), on `session` only: `SessionExpired` when the tree's session is
    /// no longer it, decided where the commit is (a backend's own check of its session, not
    /// the caller's before the call). What a lease holder commits goes this way: a session
    /// replaced between the holder's look at its lease and its call would otherwise carry the
    /// commit, and a lock another session has taken since passes the `multi`'s checks (found
    /// by `lading-sim`). The default checks before the call; every backend does better.
    fn multi_on(&self, session: u64, ops: Vec<Op>) -> TreeFuture<'_, Vec<OpResult>> {
        Box::pin(async move {
            if self.session_id() != session {
                return Err(TreeError::SessionExpired);
            }
            self.multi(ops).await
        })
    }

    /// Registers a one-shot watch on `path`.
    fn watch<'a>(&'a self, path: &'a str, kind: WatchKind) -> TreeFuture<'a, Watch>;

    /// Ends the session: its ephemeral nodes are removed now, not at expiry.
    fn close(&self) -> TreeFuture<'_, ()>;

    /// Whether reads are served from this process's memory (no round trip), so issuing one
    /// early saves nothing.
    fn local_reads(&self) -> bool {
        false
    }

    /// Every change under `prefixes` (a node created, set or deleted), by any writer — this
    /// session, other sessions, other processes, other tools — in commit order, until the
    /// feed is dropped. `None` when the backend cannot follow changes.
    fn changes<'a>(&'a self, prefixes: &'a [String]) -> Changes<'a> {
        let _ = prefixes;
        Box::pin(async { Ok(None) })
    }

    fn create(
        &self,
        path: &str,
        data: Option<Vec<u8>>,
        mode: CreateMode,
    ) -> TreeFuture<'_, String> {
        let op = Op::create_mode(path, data, mode);
        Box::pin(async move {
            match self.multi(vec![op]).await.map_err(unwrap_single)?.pop() {
                Some(OpResult::Create(p)) => Ok(p),
                other => Err(TreeError::Backend(format!("create returned {other:?}"))),
            }
        })
    }

    fn set(&self, path: &str, data: Option<Vec<u8>>, version: Option<i32>) -> TreeFuture<'_, Stat> {
        let op = Op::set(path, data, version);
        Box::pin(async move {
            match self.multi(vec![op]).await.map_err(unwrap_single)?.pop() {
                Some(OpResult::Set(s)) => Ok(s),
                other => Err(TreeError::Backend(format!("set returned {other:?}"))),
            }
        })
    }

    fn delete(&self, path: &str, version: Option<i32>) -> TreeFuture<'_, ()> {
        let op = Op::delete(path, version);
        Box::pin(async move {
            self.multi(vec![op]).await.map_err(unwrap_single)?;
            Ok(())
        })
    }
}

/// A single-op multi reports the op's own error, not a wrapper.
fn unwrap_single(e: TreeError) -> TreeError {
    match e {
        TreeError::Multi { cause, .. } => *cause,
        e => e,
    }
}

/// What [`validate_path`] looks for in a byte: an ASCII control character, a byte above
/// ASCII, a dot.
const CONTROL: u8 = 1;
const ABOVE_ASCII: u8 = 2;
const DOT: u8 = 4;
static BYTE_CLASS: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = match b {
            0..0x20 | 0x7f => CONTROL,
            0x80.. => ABOVE_ASCII,
            0x2e => DOT,
            _ => 0,
        };
        b += 1;
    }
    table
};

/// Checks a path is absolute, has no empty segment and no trailing slash (`/` alone is the
/// root).
pub fn validate_path(path: &str) -> Result<(), TreeError> {
    if path == "/" {
        return Ok(());
    }
    if !path.starts_with('/') {
        return Err(TreeError::InvalidPath(path.into(), "must start with /"));
    }
    if path.ends_with('/') {
        return Err(TreeError::InvalidPath(path.into(), "must not end with /"));
    }
    // Every call on a tree checks every path it names (`lading-sim` seeds 1-4: 180,000
    // checks), so the usual path is checked in one pass over a table of byte classes, and
    // a search for two slashes in a row: a byte-by-byte `match` took 2.5 times the
    // instructions. Only a path with a dot has its segments looked at one by one, and only
    // one with a byte above ASCII has its characters decoded (for C1, U+0080–U+009F).
    let classes = path
        .bytes()
        .fold(0u8, |found, b| found | BYTE_CLASS[b as usize]);
    if classes & CONTROL != 0 {
        return Err(TreeError::InvalidPath(
            path.into(),
            "contains a control character",
        ));
    }
    if path.contains("//")
        || (classes & DOT != 0
            && path[1..]
                .split('/')
                .any(|seg| seg.is_empty() || seg == "." || seg == ".."))
    {
        return Err(TreeError::InvalidPath(
            path.into(),
            "empty, . or .. segment",
        ));
    }
    if classes & ABOVE_ASCII != 0 && path.chars().any(char::is_control) {
        return Err(TreeError::InvalidPath(
            path.into(),
            "contains a control character",
        ));
    }
    Ok(())
}

/// Splits a valid non-root path into (parent, name).
pub fn split_path(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(0) => ("/", &path[1..]),
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("/", path),
    }
}

/// Joins a parent path and a child name.
pub fn join_path(parent: &str, name: &str) -> String {
    let parent = if parent == "/" { "" } else { parent };
    crate::layout::slashed([parent, name])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Of none, never ready (a waker whose every watch failed waits on its sleep; a
    /// `select_all` of none panicked there, found by the simulator); of some, the first ready.
    #[test]
    fn first_ready_of_none_waits_and_of_some_names_the_first_ready() {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let none: Vec<std::future::Ready<u8>> = Vec::new();
        let mut none = std::pin::pin!(first_ready(none));
        assert!(none.as_mut().poll(&mut cx).is_pending());
        let futs: Vec<BoxFuture<'static, u8>> = vec![
            Box::pin(std::future::pending()),
            Box::pin(std::future::ready(7)),
            Box::pin(std::future::ready(8)),
        ];
        let mut some = std::pin::pin!(first_ready(futs));
        assert_eq!(some.as_mut().poll(&mut cx), Poll::Ready((1, 7)));
    }

    /// An admin's requeue takes the job's lock, moves it and drops the lock in one `multi`:
    /// the lock is gone whether or not it was applied, so the status set tells (seed 157 of
    /// `lading-sim` found the lock taken as the witness).
    #[test]
    fn a_lost_replys_witness_is_a_node_no_later_op_touches() {
        let ops = vec![
            Op::create_mode("/jobs/j/lock", None, CreateMode::Ephemeral),
            Op::set("/jobs/j/status", Some(b"x".to_vec()), Some(9)),
            Op::delete("/jobs/states/failed/05-j", None),
            Op::create("/jobs/states/recording/05-j", None),
            Op::delete("/jobs/j/lock", None),
        ];
        assert_eq!(
            lost_reply_witness(&ops).map(Op::path),
            Some("/jobs/j/status")
        );
        // A create then set in the same multi: the set is the witness.
        let ops = vec![
            Op::create("/a", None),
            Op::set("/a", Some(b"y".to_vec()), Some(0)),
        ];
        assert_eq!(lost_reply_witness(&ops), Some(&ops[1]));
        // Nothing but a node created and deleted: no witness.
        let ops = vec![Op::create("/l", None), Op::delete("/l", None)];
        assert_eq!(lost_reply_witness(&ops), None);
    }

    #[test]
    fn paths_are_validated_and_split() {
        assert!(validate_path("/").is_ok());
        assert!(validate_path("/jobs/jid0000000001").is_ok());
        assert!(validate_path("jobs").is_err());
        assert!(validate_path("/jobs/").is_err());
        assert!(validate_path("/jobs//x").is_err());
        assert!(validate_path("/jobs/../x").is_err());
        assert!(validate_path("/jobs/a\nb").is_err());
        assert!(validate_path("/jobs/a\u{7f}b").is_err());
        assert!(
            validate_path("/jobs/a\u{85}b").is_err(),
            "a C1 control character"
        );
        assert!(validate_path("/jobs/.").is_err());
        assert!(validate_path("/../jobs").is_err());
        assert!(validate_path("/jobs/.x/..y/é").is_ok());
        assert_eq!(split_path("/jobs"), ("/", "jobs"));
        assert_eq!(
            split_path("/jobs/states/pending"),
            ("/jobs/states", "pending")
        );
        assert_eq!(join_path("/", "jobs"), "/jobs");
        assert_eq!(join_path("/jobs", "x"), "/jobs/x");
    }

    /// The checks agree with the rule read plainly, on every path of up to six characters
    /// drawn from slashes, dots, a letter, control characters (C0, DEL, C1) and a non-ASCII
    /// letter.
    #[test]
    fn paths_are_validated_as_the_rule_reads() {
        let plain = |p: &str| {
            p == "/"
                || (p.starts_with('/')
                    && !p.ends_with('/')
                    && p[1..]
                        .split('/')
                        .all(|s| !s.is_empty() && s != "." && s != "..")
                    && !p.chars().any(char::is_control))
        };
        let alphabet = ['/', '.', 'a', '\n', '\u{7f}', '\u{85}', 'é'];
        let mut paths = vec![String::new()];
        for _ in 0..6 {
            paths = paths
                .iter()
                .flat_map(|p| alphabet.iter().map(move |c| format!("{p}{c}")))
                .collect();
            for p in &paths {
                assert_eq!(validate_path(p).is_ok(), plain(p), "{p:?}");
            }
        }
    }
}
