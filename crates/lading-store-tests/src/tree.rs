//! The tree's own guarantees, the same on every backend: versions, sequential names, paging, `multi`, ephemeral nodes, watches.

use super::*;

pub async fn tree_nodes_have_versions_and_sorted_children(h: &dyn Harness) {
    let s = h.open().await;
    let t = &s.tree;
    t.create("/t", None, CreateMode::Persistent).await.unwrap();
    t.create("/t/b", bytes("2"), CreateMode::Persistent)
        .await
        .unwrap();
    t.create("/t/a", bytes("1"), CreateMode::Persistent)
        .await
        .unwrap();
    assert_eq!(t.children("/t").await.unwrap(), vec!["a", "b"]);
    let n = t.get("/t/a").await.unwrap().unwrap();
    assert_eq!((n.data.as_deref(), n.stat.version), (Some(&b"1"[..]), 0));
    assert_eq!(
        t.get("/t").await.unwrap().unwrap().data,
        None,
        "empty nodes carry no data"
    );
    let st = t.set("/t/a", bytes("x"), Some(0)).await.unwrap();
    assert_eq!(st.version, 1);
    assert!(matches!(
        t.set("/t/a", bytes("y"), Some(0)).await,
        Err(TreeError::BadVersion {
            expected: 0,
            actual: 1,
            ..
        })
    ));
    assert_eq!(
        t.get("/t/a").await.unwrap().unwrap().data.as_deref(),
        Some(&b"x"[..]),
        "a refused set changes nothing"
    );
    assert!(matches!(
        t.create("/t/a", None, CreateMode::Persistent).await,
        Err(TreeError::NodeExists(_))
    ));
    assert!(
        matches!(t.create("/nope/x", None, CreateMode::Persistent).await, Err(TreeError::NoNode(p)) if p == "/nope")
    );
    assert!(matches!(
        t.delete("/t", None).await,
        Err(TreeError::NotEmpty(_))
    ));
    assert!(matches!(
        t.delete("/t/a", Some(0)).await,
        Err(TreeError::BadVersion { .. })
    ));
    t.delete("/t/a", Some(1)).await.unwrap();
    assert!(t.get("/t/a").await.unwrap().is_none());
    assert!(matches!(
        t.children("/missing").await,
        Err(TreeError::NoNode(_))
    ));
    assert!(matches!(
        t.get("relative").await,
        Err(TreeError::InvalidPath(..))
    ));
}

pub async fn tree_sequential_names_have_ten_digits_and_increase(h: &dyn Harness) {
    let s = h.open().await;
    let t = &s.tree;
    t.create("/seq", None, CreateMode::Persistent)
        .await
        .unwrap();
    let a = t
        .create("/seq/item", None, CreateMode::PersistentSequential)
        .await
        .unwrap();
    let b = t
        .create("/seq/item", None, CreateMode::PersistentSequential)
        .await
        .unwrap();
    assert_eq!(a.len(), "/seq/item".len() + 10, "{a}");
    assert!(a["/seq/item".len()..].bytes().all(|c| c.is_ascii_digit()));
    assert!(b > a);
}

pub async fn tree_children_page_reads_the_head_in_order(h: &dyn Harness) {
    let s = h.open().await;
    let t = &s.tree;
    t.create("/p", None, CreateMode::Persistent).await.unwrap();
    let ops: Vec<Op> = (0..50)
        .rev()
        .map(|i| Op::create(format!("/p/{i:03}"), None))
        .collect();
    t.multi(ops).await.unwrap();
    assert_eq!(
        t.children_page("/p", None, 3).await.unwrap(),
        vec!["000", "001", "002"]
    );
    assert_eq!(
        t.children_page("/p", Some("002"), 2).await.unwrap(),
        vec!["003", "004"]
    );
    assert!(
        t.children_page("/p", Some("049"), 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(t.count_children("/p").await.unwrap(), 50);
}

pub async fn multi_is_all_or_nothing(h: &dyn Harness) {
    let s = h.open().await;
    let t = &s.tree;
    t.create("/m", bytes("v0"), CreateMode::Persistent)
        .await
        .unwrap();
    let err = t
        .multi(vec![
            Op::create("/m/new", None),
            Op::set("/m", bytes("v1"), Some(0)),
            Op::check("/m", Some(0)), // fails: the set above moved it to 1
            Op::create("/m/never", None),
        ])
        .await
        .unwrap_err();
    assert_eq!(err.failed_op(), Some(2));
    assert!(matches!(err.root(), TreeError::BadVersion { .. }));
    assert!(
        t.get("/m/new").await.unwrap().is_none(),
        "nothing of a failed multi is applied"
    );
    let m = t.get("/m").await.unwrap().unwrap();
    assert_eq!((m.data.as_deref(), m.stat.version), (Some(&b"v0"[..]), 0));
    let ok = t
        .multi(vec![
            Op::create("/m/a", None),
            Op::create("/m/a/b", bytes("x")),
            Op::delete("/m/a/b", None),
        ])
        .await
        .unwrap();
    assert_eq!(
        ok,
        vec![
            OpResult::Create("/m/a".into()),
            OpResult::Create("/m/a/b".into()),
            OpResult::Delete
        ]
    );
}

pub async fn ephemeral_nodes_end_with_their_session(h: &dyn Harness) {
    let a = h.open().await;
    let b = h.open().await;
    a.tree
        .create("/e", None, CreateMode::Persistent)
        .await
        .unwrap();
    a.tree
        .create("/e/mine", bytes("a"), CreateMode::Ephemeral)
        .await
        .unwrap();
    a.tree
        .create("/e/closing", None, CreateMode::Ephemeral)
        .await
        .unwrap();
    let st = b.tree.exists("/e/mine").await.unwrap().unwrap();
    assert_eq!(st.ephemeral_owner, a.tree.session_id());
    assert!(matches!(
        a.tree
            .create("/e/mine/child", None, CreateMode::Persistent)
            .await,
        Err(TreeError::NoChildrenForEphemerals(_))
    ));
    (a.expire)().await;
    assert!(
        b.tree.get("/e/mine").await.unwrap().is_none(),
        "an expired session's ephemerals are removed"
    );
    assert_ne!(a.tree.session_id(), 0);
    // A closed session's ephemerals go at once.
    let c = h.open().await;
    c.tree
        .create("/e/c", None, CreateMode::Ephemeral)
        .await
        .unwrap();
    c.tree.close().await.unwrap();
    assert!(b.tree.get("/e/c").await.unwrap().is_none());
}

pub async fn watches_fire_on_changes(h: &dyn Harness) {
    let a = h.open().await;
    let b = h.open().await;
    a.tree
        .create("/w", None, CreateMode::Persistent)
        .await
        .unwrap();
    let child_watch = a.tree.watch("/w", WatchKind::Children).await.unwrap();
    let data_watch = a.tree.watch("/w", WatchKind::Data).await.unwrap();
    b.tree
        .create("/w/x", None, CreateMode::Persistent)
        .await
        .unwrap();
    tokio::time::timeout(WAIT, child_watch)
        .await
        .expect("child watch fired");
    b.tree.set("/w", bytes("d"), None).await.unwrap();
    tokio::time::timeout(WAIT, data_watch)
        .await
        .expect("data watch fired");
}

/// A change feed reports every change under its prefixes, by any session, in order, and
/// nothing else.
pub async fn change_feeds_see_every_writer(h: &dyn Harness) {
    let a = h.open().await;
    let b = h.open().await;
    for p in ["/f", "/f/x", "/g", "/fg"] {
        a.tree
            .create(p, None, CreateMode::Persistent)
            .await
            .unwrap();
    }
    let prefixes = vec!["/f".to_string()];
    let mut feed = a
        .tree
        .changes(&prefixes)
        .await
        .unwrap()
        .expect("this backend follows changes");
    // Another session's changes, inside and outside the prefix.
    b.tree.set("/g", bytes("no"), None).await.unwrap();
    b.tree.set("/fg", bytes("no"), None).await.unwrap();
    b.tree.set("/f/x", bytes("1"), None).await.unwrap();
    b.tree
        .multi(vec![
            Op::create("/f/x/y", None),
            Op::set("/g", bytes("no"), None),
        ])
        .await
        .unwrap();
    b.tree.delete("/f/x/y", None).await.unwrap();
    // And this session's own.
    a.tree
        .create("/f/z", None, CreateMode::Persistent)
        .await
        .unwrap();
    // Each commit's changed paths, commits in order (a path changed twice in a row may be
    // reported once).
    let want = ["/f/x", "/f/x/y", "/f/z"];
    let mut got: Vec<String> = Vec::new();
    while got.len() < want.len() {
        let next = tokio::time::timeout(WAIT, feed.next()).await;
        match next.unwrap_or_else(|_| panic!("no change after {got:?}")) {
            Some(lading_core::tree::Change::Node(p)) if got.last() != Some(&p) => got.push(p),
            Some(_) => {}
            None => panic!("the feed ended"),
        }
    }
    assert_eq!(got, want);
    // Reads through the feed see what it reported.
    let read = feed
        .get_many(&["/f/x".to_string(), "/f/x/y".to_string()])
        .await
        .unwrap();
    assert_eq!(read[0].as_ref().and_then(|n| n.data.clone()), bytes("1"));
    assert!(read[1].is_none());
    assert_eq!(feed.children("/f").await.unwrap(), ["x", "z"]);
    // Closing the tree ends the feed.
    a.tree.close().await.unwrap();
    let end = tokio::time::timeout(WAIT, async {
        loop {
            match feed.next().await {
                None => return,
                Some(lading_core::tree::Change::Lost) => {}
                Some(c) => panic!("unexpected {c:?}"),
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the feed ends when its tree is closed");
}
