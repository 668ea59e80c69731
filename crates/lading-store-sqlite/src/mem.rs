//! The in-memory image of the tree, and the overlay that applies `multi`s to it.
//!
//! Every handle keeps the whole tree in memory: reads never touch SQLite, and the writer
//! validates a `multi` (versions, parents, emptiness) against memory instead of querying. A
//! group of `multi`s is applied to an [`Overlay`] first; only after its commit is durable is the
//! overlay folded into the shared [`Mem`], so readers never see a change that could still be
//! lost.
//!
//! Pure data, no I/O: the semantics of every tree operation live here.

use foldhash::{HashMap, HashSet};
use lading_core::tree::{join_path, split_path, validate_path};
use lading_core::{CreateMode, Op, OpResult, Stat, TreeError};
use std::collections::BTreeSet;
use std::hash::BuildHasher;
use std::sync::{Arc, LazyLock};

/// One hash function (randomly seeded once per process) for every map keyed by a path, so
/// that a path hashed once can be looked up in the committed tree and in each pending
/// overlay without hashing it again.
#[derive(Clone, Copy, Default)]
pub struct PathHash;

static PATH_HASH: LazyLock<foldhash::fast::RandomState> = LazyLock::new(Default::default);

impl BuildHasher for PathHash {
    type Hasher = foldhash::fast::FoldHasher<'static>;
    fn build_hasher(&self) -> Self::Hasher {
        PATH_HASH.build_hasher()
    }
}

/// A map keyed by path, hashed with [`PathHash`]. A key is shared, not copied, between an
/// overlay, its undo log and the committed tree it is folded into.
pub type PathMap<V> = hashbrown::HashMap<Arc<str>, V, PathHash>;

/// The hash of `path` in every [`PathMap`].
#[inline]
pub fn path_hash(path: &str) -> u64 {
    PathHash.hash_one(path)
}

fn get_hashed<'a, V>(map: &'a PathMap<V>, path: &str, h: u64) -> Option<&'a V> {
    map.raw_entry()
        .from_key_hashed_nocheck(h, path)
        .map(|(_, v)| v)
}

/// Largest node data accepted, as in ZooKeeper's default `jute.maxbuffer`.
pub const MAX_DATA_BYTES: usize = 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemNode {
    pub data: Option<Vec<u8>>,
    pub version: i32,
    /// Owning session of an ephemeral node; 0 for a persistent one.
    pub owner: u64,
    pub ctime: u64,
    pub mtime: u64,
    /// Next sequence number for sequential children.
    pub seq: i64,
}

impl MemNode {
    pub fn new(data: Option<Vec<u8>>, owner: u64, now: u64) -> MemNode {
        MemNode {
            data,
            version: 0,
            owner,
            ctime: now,
            mtime: now,
            seq: 0,
        }
    }

    pub fn stat(&self) -> Stat {
        Stat {
            version: self.version,
            ephemeral_owner: self.owner,
            ctime_ms: self.ctime,
            mtime_ms: self.mtime,
            pzxid: None,
        }
    }
}

/// The committed tree.
#[derive(Debug, Default)]
pub struct Mem {
    nodes: PathMap<MemNode>,
    kids: HashMap<String, BTreeSet<String>>,
    /// The last change-log entry folded in.
    pub synced: i64,
}

/// Enters `path` (not the root) in its parent's list of children.
fn add_child(kids: &mut HashMap<String, BTreeSet<String>>, path: &str) {
    let (parent, name) = split_path(path);
    // Looked up before it is made: a parent's key is allocated once, not per child.
    match kids.get_mut(parent) {
        Some(set) => set.insert(name.to_string()),
        None => kids
            .entry(parent.to_string())
            .or_default()
            .insert(name.to_string()),
    };
}

impl Mem {
    pub fn get(&self, path: &str) -> Option<&MemNode> {
        self.nodes.get(path)
    }

    /// Children names of `path`, sorted; `None` when `path` does not exist.
    pub fn children(&self, path: &str) -> Option<impl Iterator<Item = &String>> {
        self.nodes.get(path)?;
        Some(self.kids.get(path).into_iter().flatten())
    }

    /// At most `limit` children strictly after `after`.
    pub fn children_page(
        &self,
        path: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Option<Vec<String>> {
        self.nodes.get(path)?;
        let Some(set) = self.kids.get(path) else {
            return Some(vec![]);
        };
        let it: Box<dyn Iterator<Item = &String>> = match after {
            Some(a) => Box::new(
                set.range::<str, _>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded)),
            ),
            None => Box::new(set.iter()),
        };
        Some(it.take(limit).cloned().collect())
    }

    pub fn count_children(&self, path: &str) -> Option<u64> {
        self.nodes.get(path)?;
        Some(self.kids.get(path).map_or(0, |s| s.len() as u64))
    }

    pub fn put(&mut self, path: Arc<str>, node: MemNode) {
        if &*path != "/" && !self.nodes.contains_key(&*path) {
            add_child(&mut self.kids, &path);
        }
        self.nodes.insert(path, node);
    }

    /// A parent's (possibly empty) set of children stays as long as the parent does: a
    /// queue folder that empties and fills again all the time keeps its set.
    pub fn remove(&mut self, path: &str) {
        if self.nodes.remove(path).is_some() {
            self.kids.remove(path);
            if path != "/" {
                let (parent, name) = split_path(path);
                if let Some(set) = self.kids.get_mut(parent) {
                    set.remove(name);
                }
            }
        }
    }

    /// Builds every parent's list of children again from the nodes.
    pub fn index_children(&mut self) {
        self.kids.clear();
        for path in self.nodes.keys().filter(|p| &***p != "/") {
            add_child(&mut self.kids, path);
        }
    }

    pub fn clear(&mut self) {
        self.nodes.clear();
        self.kids.clear();
    }

    /// Paths of the nodes a session owns.
    pub fn owned_by(&self, session: u64) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.owner == session)
            .map(|(p, _)| p.to_string())
            .collect()
    }
}

/// What an overlay is applied on top of: the committed tree, possibly with groups that are
/// committed but not yet folded in (awaiting their fsync).
pub trait Below {
    fn get(&self, path: &str) -> Option<&MemNode> {
        self.get_hashed(path, path_hash(path))
    }
    /// [`Below::get`] with the path's [`path_hash`] already computed.
    fn get_hashed(&self, path: &str, h: u64) -> Option<&MemNode>;
    /// Names that may be children of `path` (a superset; callers check each).
    fn child_candidates(&self, path: &str) -> Vec<String>;
    /// Paths that may be owned by `session` (a superset; callers check each).
    fn owned_candidates(&self, session: u64) -> Vec<String>;
}

impl Below for Mem {
    fn get_hashed(&self, path: &str, h: u64) -> Option<&MemNode> {
        get_hashed(&self.nodes, path, h)
    }
    fn child_candidates(&self, path: &str) -> Vec<String> {
        self.kids
            .get(path)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
    fn owned_candidates(&self, session: u64) -> Vec<String> {
        self.owned_by(session)
    }
}

/// The committed tree plus overlays still awaiting their fsync, oldest first.
pub struct Layers<'a> {
    pub mem: &'a Mem,
    pub pending: &'a [std::sync::Arc<Overlay>],
}

impl Below for Layers<'_> {
    fn get_hashed(&self, path: &str, h: u64) -> Option<&MemNode> {
        for ov in self.pending.iter().rev() {
            if let Some(v) = get_hashed(&ov.changed, path, h) {
                return v.as_ref();
            }
        }
        get_hashed(&self.mem.nodes, path, h)
    }
    fn child_candidates(&self, path: &str) -> Vec<String> {
        let mut names = self.mem.child_candidates(path);
        for ov in self.pending {
            if let Some(added) = ov.added.get(path) {
                names.extend(added.iter().map(|p| split_path(p).1.to_string()));
            }
        }
        names
    }
    fn owned_candidates(&self, session: u64) -> Vec<String> {
        let mut paths = self.mem.owned_by(session);
        for ov in self.pending {
            for (p, n) in &ov.changed {
                if n.as_ref().is_some_and(|n| n.owner == session) {
                    paths.push(p.to_string());
                }
            }
        }
        paths
    }
}

/// One entry of a `multi`'s undo log: a path's previous state in the overlay, and what
/// became of its name in its parent's `added` set (the parent and name are the path's own,
/// so they need no copies of their own).
struct Undo(Arc<str>, Option<Option<MemNode>>, Kid);

enum Kid {
    Same,
    Added,
    Removed,
}

/// Changes of one commit group on top of [`Mem`], not yet durable.
#[derive(Default)]
pub struct Overlay {
    /// Path → its new state (`None`: deleted).
    pub changed: PathMap<Option<MemNode>>,
    /// Children created in this overlay (their paths, shared with `changed`), per parent (for
    /// emptiness checks).
    added: HashMap<String, HashSet<Arc<str>>>,
}

impl Overlay {
    fn lookup<'a>(&'a self, base: &'a dyn Below, path: &str) -> Option<&'a MemNode> {
        let h = path_hash(path);
        match get_hashed(&self.changed, path, h) {
            Some(v) => v.as_ref(),
            None => base.get_hashed(path, h),
        }
    }

    /// Whether the node at `path` currently has a child (in base, pending or this overlay).
    fn has_children(&self, base: &dyn Below, path: &str) -> bool {
        let present = |name: &String| self.lookup(base, &join_path(path, name)).is_some();
        self.added
            .get(path)
            .is_some_and(|s| s.iter().any(|p| self.lookup(base, p).is_some()))
            || base.child_candidates(path).iter().any(present)
    }

    fn set(&mut self, path: &str, node: Option<MemNode>, undo: &mut Vec<Undo>) {
        let present = node.is_some();
        let key: Arc<str> = Arc::from(path);
        let prev = self.changed.insert(key.clone(), node);
        let mut kid = Kid::Same;
        if path != "/" {
            let (parent, _) = split_path(path);
            if present {
                let kids = match self.added.get_mut(parent) {
                    Some(k) => k,
                    None => self.added.entry(parent.to_string()).or_default(),
                };
                if kids.insert(key.clone()) {
                    kid = Kid::Added;
                }
            } else if self.added.get_mut(parent).is_some_and(|s| s.remove(path)) {
                kid = Kid::Removed;
            }
        }
        undo.push(Undo(key, prev, kid));
    }

    fn rollback(&mut self, undo: Vec<Undo>) {
        for Undo(p, prev, kid) in undo.into_iter().rev() {
            match kid {
                Kid::Same => {}
                Kid::Added => {
                    if let Some(s) = self.added.get_mut(split_path(&p).0) {
                        s.remove(&*p);
                    }
                }
                Kid::Removed => {
                    self.added
                        .entry(split_path(&p).0.to_string())
                        .or_default()
                        .insert(p.clone());
                }
            }
            match prev {
                None => {
                    self.changed.remove(&*p);
                }
                Some(prev) => {
                    self.changed.insert(p, prev);
                }
            }
        }
    }

    /// Applies every op or none (ZooKeeper's `multi`). On failure the error names the op.
    /// The paths must have passed [`validate_ops`] (on the caller's thread, not the writer's).
    pub fn apply_multi(
        &mut self,
        base: &dyn Below,
        ops: &[Op],
        session: u64,
        now: u64,
    ) -> Result<Vec<OpResult>, TreeError> {
        let mut undo = Vec::with_capacity(ops.len() + 1);
        let mut out = Vec::with_capacity(ops.len());
        for (index, op) in ops.iter().enumerate() {
            match self.apply_op(base, op, session, now, &mut undo) {
                Ok(r) => out.push(r),
                Err(e) => {
                    self.rollback(undo);
                    return Err(TreeError::Multi {
                        index,
                        op_path: op.path().to_string(),
                        cause: Box::new(e),
                    });
                }
            }
        }
        Ok(out)
    }

    fn expect<'a>(
        &'a self,
        base: &'a dyn Below,
        path: &str,
        version: Option<i32>,
    ) -> Result<&'a MemNode, TreeError> {
        let node = self
            .lookup(base, path)
            .ok_or_else(|| TreeError::NoNode(path.into()))?;
        match version {
            Some(v) if v != node.version => Err(TreeError::BadVersion {
                path: path.into(),
                expected: v,
                actual: node.version,
            }),
            _ => Ok(node),
        }
    }

    fn apply_op(
        &mut self,
        base: &dyn Below,
        op: &Op,
        session: u64,
        now: u64,
        undo: &mut Vec<Undo>,
    ) -> Result<OpResult, TreeError> {
        match op {
            Op::Check { path, version } => {
                self.expect(base, path, *version)?;
                Ok(OpResult::Check)
            }
            Op::Create { path, data, mode } => {
                if path == "/" {
                    return Err(TreeError::NodeExists("/".into()));
                }
                check_size(path, data)?;
                let (parent, name) = split_path(path);
                let pnode = self
                    .lookup(base, parent)
                    .ok_or_else(|| TreeError::NoNode(parent.into()))?;
                if pnode.owner != 0 {
                    return Err(TreeError::NoChildrenForEphemerals(parent.into()));
                }
                let full = if *mode == CreateMode::PersistentSequential {
                    let mut pnode = pnode.clone();
                    let full = join_path(parent, &format!("{name}{:010}", pnode.seq));
                    pnode.seq += 1;
                    self.set(parent, Some(pnode), undo);
                    full
                } else {
                    path.clone()
                };
                if self.lookup(base, &full).is_some() {
                    return Err(TreeError::NodeExists(full));
                }
                let owner = if *mode == CreateMode::Ephemeral {
                    session
                } else {
                    0
                };
                self.set(&full, Some(MemNode::new(data.clone(), owner, now)), undo);
                Ok(OpResult::Create(full))
            }
            Op::Set {
                path,
                data,
                version,
            } => {
                check_size(path, data)?;
                let old = self.expect(base, path, *version)?;
                // Everything but the data, which is replaced (not copied first).
                let node = MemNode {
                    data: data.clone(),
                    version: old.version + 1,
                    owner: old.owner,
                    ctime: old.ctime,
                    mtime: now,
                    seq: old.seq,
                };
                let stat = node.stat();
                self.set(path, Some(node), undo);
                Ok(OpResult::Set(stat))
            }
            Op::Delete { path, version } => {
                if path == "/" {
                    return Err(TreeError::InvalidPath(
                        "/".into(),
                        "the root cannot be deleted",
                    ));
                }
                self.expect(base, path, *version)?;
                if self.has_children(base, path) {
                    return Err(TreeError::NotEmpty(path.clone()));
                }
                self.set(path, None, undo);
                Ok(OpResult::Delete)
            }
        }
    }

    /// Deletes a node unconditionally (session cleanup; ephemeral nodes have no children).
    pub fn force_delete(&mut self, base: &dyn Below, path: &str) {
        if self.lookup(base, path).is_some() {
            let mut undo = Vec::new();
            self.set(path, None, &mut undo);
        }
    }

    /// Nodes a session owns, committed or in this overlay.
    pub fn owned_by(&self, base: &dyn Below, session: u64) -> Vec<String> {
        let mut paths: HashSet<String> = base.owned_candidates(session).into_iter().collect();
        for (p, n) in &self.changed {
            match n {
                Some(n) if n.owner == session => {
                    paths.insert(p.to_string());
                }
                _ => {}
            }
        }
        paths
            .into_iter()
            .filter(|p| self.lookup(base, p).is_some_and(|n| n.owner == session))
            .collect()
    }

    /// Folds the overlay into the committed tree.
    pub fn apply_to(&self, mem: &mut Mem) {
        for (path, node) in &self.changed {
            match node {
                Some(n) => mem.put(path.clone(), n.clone()),
                None => mem.remove(path),
            }
        }
    }
}

/// Checks every op's path, as ZooKeeper's client does before it sends a `multi`; the error
/// names the first bad op.
pub fn validate_ops(ops: &[Op]) -> Result<(), TreeError> {
    for (index, op) in ops.iter().enumerate() {
        if let Err(e) = validate_path(op.path()) {
            return Err(TreeError::Multi {
                index,
                op_path: op.path().to_string(),
                cause: Box::new(e),
            });
        }
    }
    Ok(())
}

fn check_size(path: &str, data: &Option<Vec<u8>>) -> Result<(), TreeError> {
    match data {
        Some(d) if d.len() > MAX_DATA_BYTES => Err(TreeError::Backend(format!(
            "data for {path} is {} bytes, over the {MAX_DATA_BYTES}-byte node limit",
            d.len()
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> Mem {
        let mut m = Mem::default();
        m.put("/".into(), MemNode::new(None, 0, 0));
        m
    }

    #[test]
    fn a_failed_multi_leaves_the_overlay_as_it_was() {
        let m = mem();
        let mut ov = Overlay::default();
        ov.apply_multi(&m, &[Op::create("/a", None)], 1, 0).unwrap();
        let err = ov
            .apply_multi(
                &m,
                &[Op::create("/a/b", None), Op::create("/a/b", None)],
                1,
                0,
            )
            .unwrap_err();
        assert_eq!(err.failed_op(), Some(1));
        assert_eq!(ov.changed.len(), 1, "only /a remains");
        assert!(!ov.has_children(&m, "/a"));
        ov.apply_multi(&m, &[Op::delete("/a", None)], 1, 0).unwrap();
    }

    #[test]
    fn emptiness_sees_base_and_overlay() {
        let mut m = mem();
        m.put("/p".into(), MemNode::new(None, 0, 0));
        m.put("/p/x".into(), MemNode::new(None, 0, 0));
        let mut ov = Overlay::default();
        let e = ov
            .apply_multi(&m, &[Op::delete("/p", None)], 1, 0)
            .unwrap_err();
        assert!(matches!(e.root(), TreeError::NotEmpty(_)));
        ov.apply_multi(
            &m,
            &[Op::delete("/p/x", None), Op::delete("/p", None)],
            1,
            0,
        )
        .unwrap();
        ov.apply_to(&mut m);
        assert!(m.get("/p").is_none());
        assert_eq!(m.count_children("/"), Some(0));
    }

    #[test]
    fn sequential_names_come_from_the_parent_counter() {
        let mut m = mem();
        let mut ov = Overlay::default();
        ov.apply_multi(&m, &[Op::create("/q", None)], 1, 0).unwrap();
        let r = ov
            .apply_multi(
                &m,
                &[
                    Op::create_mode("/q/n", None, CreateMode::PersistentSequential),
                    Op::create_mode("/q/n", None, CreateMode::PersistentSequential),
                ],
                1,
                0,
            )
            .unwrap();
        assert_eq!(
            r,
            vec![
                OpResult::Create("/q/n0000000000".into()),
                OpResult::Create("/q/n0000000001".into())
            ]
        );
        ov.apply_to(&mut m);
        assert_eq!(
            m.children_page("/q", Some("n0000000000"), 5).unwrap(),
            vec!["n0000000001".to_string()]
        );
    }
}

/// The overlay against a deliberately naive model of ZooKeeper's rules, over random multis,
/// with groups split across pending layers as the writer and syncer split them.
#[cfg(test)]
mod model {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    const PATHS: &[&str] = &["/a", "/a/b", "/a/c", "/a/b/d", "/b", "/b/x", "/q", "/q/n"];

    /// path → (data, version, owner, seq)
    type Model = BTreeMap<String, (Option<Vec<u8>>, i32, u64, i64)>;

    fn parent(p: &str) -> &str {
        split_path(p).0
    }

    fn model_multi(
        m: &Model,
        ops: &[Op],
        session: u64,
    ) -> (Result<Vec<OpResult>, (usize, String)>, Model) {
        let mut t = m.clone();
        let mut out = vec![];
        for (i, op) in ops.iter().enumerate() {
            let fail = |why: &str| Err((i, why.to_string()));
            match op {
                Op::Check { path, version } => match t.get(path) {
                    None => return (fail("NoNode"), m.clone()),
                    Some(n) if version.is_some_and(|v| v != n.1) => {
                        return (fail("BadVersion"), m.clone());
                    }
                    _ => out.push(OpResult::Check),
                },
                Op::Create { path, data, mode } => {
                    let par = parent(path).to_string();
                    let Some(pn) = t.get(&par).cloned() else {
                        return (fail("NoNode"), m.clone());
                    };
                    if pn.2 != 0 {
                        return (fail("NoChildrenForEphemerals"), m.clone());
                    }
                    let full = if *mode == CreateMode::PersistentSequential {
                        t.insert(par.clone(), (pn.0.clone(), pn.1, pn.2, pn.3 + 1));
                        format!("{path}{:010}", pn.3)
                    } else {
                        path.clone()
                    };
                    if t.contains_key(&full) {
                        return (fail("NodeExists"), m.clone());
                    }
                    let owner = if *mode == CreateMode::Ephemeral {
                        session
                    } else {
                        0
                    };
                    t.insert(full.clone(), (data.clone(), 0, owner, 0));
                    out.push(OpResult::Create(full));
                }
                Op::Set {
                    path,
                    data,
                    version,
                } => match t.get(path).cloned() {
                    None => return (fail("NoNode"), m.clone()),
                    Some(n) if version.is_some_and(|v| v != n.1) => {
                        return (fail("BadVersion"), m.clone());
                    }
                    Some(n) => {
                        t.insert(path.clone(), (data.clone(), n.1 + 1, n.2, n.3));
                        out.push(OpResult::Set(Stat {
                            version: n.1 + 1,
                            ephemeral_owner: n.2,
                            ctime_ms: 0,
                            mtime_ms: 0,
                            pzxid: None,
                        }));
                    }
                },
                Op::Delete { path, version } => match t.get(path).cloned() {
                    None => return (fail("NoNode"), m.clone()),
                    Some(n) if version.is_some_and(|v| v != n.1) => {
                        return (fail("BadVersion"), m.clone());
                    }
                    Some(_) => {
                        let prefix = format!("{path}/");
                        if t.keys().any(|k| k.starts_with(&prefix)) {
                            return (fail("NotEmpty"), m.clone());
                        }
                        t.remove(path);
                        out.push(OpResult::Delete);
                    }
                },
            }
        }
        (Ok(out), t)
    }

    fn kind(e: &TreeError) -> String {
        let s = format!("{:?}", e.root());
        s.split(['(', ' ', '{']).next().unwrap_or("").to_string()
    }

    fn op() -> impl Strategy<Value = Op> {
        let path = proptest::sample::select(PATHS).prop_map(str::to_string);
        let version = proptest::option::of(0i32..3);
        let data = proptest::option::of(proptest::collection::vec(any::<u8>(), 0..3));
        let mode = prop_oneof![
            Just(CreateMode::Persistent),
            Just(CreateMode::Ephemeral),
            Just(CreateMode::PersistentSequential)
        ];
        prop_oneof![
            (path.clone(), version.clone()).prop_map(|(p, v)| Op::check(p, v)),
            (path.clone(), data.clone(), mode).prop_map(|(p, d, m)| Op::create_mode(p, d, m)),
            (path.clone(), data, version.clone()).prop_map(|(p, d, v)| Op::set(p, d, v)),
            (path, version).prop_map(|(p, v)| Op::delete(p, v)),
        ]
    }

    fn stats_free(r: &[OpResult]) -> Vec<OpResult> {
        r.iter()
            .map(|x| match x {
                OpResult::Set(s) => OpResult::Set(Stat {
                    ctime_ms: 0,
                    mtime_ms: 0,
                    ..*s
                }),
                o => o.clone(),
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn overlay_layers_agree_with_the_model(
            multis in proptest::collection::vec(proptest::collection::vec(op(), 1..5), 1..30),
            cuts in proptest::collection::vec(any::<bool>(), 30),
        ) {
            let mut mem = Mem::default();
            mem.put("/".into(), MemNode::new(None, 0, 0));
            let mut model: Model = BTreeMap::new();
            model.insert("/".into(), (None, 0, 0, 0));
            let mut pending: Vec<Arc<Overlay>> = vec![];
            let mut ov = Overlay::default();
            for (i, ops) in multis.iter().enumerate() {
                let session = 7;
                let (want, next) = model_multi(&model, ops, session);
                let got = ov.apply_multi(&Layers { mem: &mem, pending: &pending }, ops, session, 0);
                match (&want, &got) {
                    (Ok(w), Ok(g)) => prop_assert_eq!(stats_free(w), stats_free(g)),
                    (Err((wi, wk)), Err(e)) => {
                        prop_assert_eq!(Some(*wi), e.failed_op());
                        prop_assert_eq!(wk, &kind(e));
                    }
                    _ => prop_assert!(false, "model {:?} vs overlay {:?} for {:?}", want, got, ops),
                }
                model = next;
                // End the group here sometimes: it becomes a pending layer; sometimes also fold
                // the oldest pending layer into memory, as the syncer does.
                if cuts[i] {
                    pending.push(Arc::new(std::mem::take(&mut ov)));
                    if i % 3 == 0 {
                        let first = pending.remove(0);
                        first.apply_to(&mut mem);
                    }
                }
            }
            pending.push(Arc::new(ov));
            for p in pending {
                p.apply_to(&mut mem);
            }
            let got: Model = mem.nodes.iter().map(|(p, n)| (p.to_string(), (n.data.clone(), n.version, n.owner, n.seq))).collect();
            prop_assert_eq!(&got, &model);
            // The children index agrees with the nodes.
            for p in model.keys() {
                let want: Vec<String> = model.keys().filter(|k| *k != "/" && parent(k) == p).map(|k| split_path(k).1.to_string()).collect();
                let have: Vec<String> = mem.children(p).unwrap().cloned().collect();
                prop_assert_eq!(want, have);
            }
        }
    }
}
