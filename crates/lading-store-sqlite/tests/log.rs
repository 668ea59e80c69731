//! The change log and the `nodes` table: a commit is durable as one log entry, the table is
//! brought up to date in bulk later, and every way of opening the file sees the same tree.

use lading_core::{CreateMode, Op, Tree, TreeError, WatchKind};
use lading_store_sqlite::{SqliteOptions, SqliteTree, WAL_RESTART_FRAMES};
use rusqlite::Connection;
use std::collections::BTreeMap;
use std::path::Path;

type Dump = BTreeMap<String, (Option<Vec<u8>>, i32, u64)>;

/// The whole tree as path → (data, version, ephemeral owner).
async fn dump(t: &dyn Tree) -> Dump {
    let mut out = BTreeMap::new();
    let mut todo = vec!["/".to_string()];
    while let Some(p) = todo.pop() {
        let n = t.get(&p).await.unwrap().expect("listed node exists");
        out.insert(p.clone(), (n.data, n.stat.version, n.stat.ephemeral_owner));
        for c in t.children(&p).await.unwrap() {
            todo.push(lading_core::tree::join_path(&p, &c));
        }
    }
    out
}

/// The `nodes` table read directly, as path → (data, version, owner), and the log position
/// it reflects, both read in one transaction: a fold may commit between two reads made apart,
/// pairing the rows before it with the `applied` after it.
fn table(file: &Path) -> (Dump, i64) {
    let mut conn = Connection::open(file).unwrap();
    let conn = conn.transaction().unwrap();
    let mut rows = BTreeMap::new();
    let mut st = conn
        .prepare("SELECT parent, name, data, version, owner FROM nodes")
        .unwrap();
    let mut q = st.query([]).unwrap();
    while let Some(r) = q.next().unwrap() {
        let (parent, name): (String, String) = (r.get(0).unwrap(), r.get(1).unwrap());
        let path = if parent.is_empty() {
            "/".to_string()
        } else {
            lading_core::tree::join_path(&parent, &name)
        };
        rows.insert(
            path,
            (
                r.get(2).unwrap(),
                r.get(3).unwrap(),
                r.get::<_, i64>(4).unwrap() as u64,
            ),
        );
    }
    let applied: String = conn
        .query_row(
            "SELECT value FROM lading_meta WHERE key = 'applied'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    drop(q);
    drop(st);
    conn.commit().unwrap();
    (rows, applied.parse().unwrap())
}

fn max_seq(file: &Path) -> i64 {
    Connection::open(file)
        .unwrap()
        .query_row("SELECT coalesce(max(seq), 0) FROM changes", [], |r| {
            r.get(0)
        })
        .unwrap()
}

/// Creates, rewrites and deletes nodes over `rounds` commits, leaving some of each kind.
async fn churn(t: &SqliteTree, rounds: usize) {
    t.create("/q", None, CreateMode::Persistent).await.unwrap();
    for i in 0..rounds {
        let p = format!("/q/n{i:05}");
        t.create(&p, Some(b"new".to_vec()), CreateMode::Persistent)
            .await
            .unwrap();
        // A lock made and dropped, as a worker's lease is.
        t.multi(vec![Op::create_mode(
            format!("{p}-lock"),
            None,
            CreateMode::Ephemeral,
        )])
        .await
        .unwrap();
        t.multi(vec![
            Op::set(&p, Some(format!("v{i}").into_bytes()), Some(0)),
            Op::delete(format!("{p}-lock"), None),
        ])
        .await
        .unwrap();
        if i % 3 == 0 {
            t.delete(&p, None).await.unwrap();
        }
    }
    t.create("/held", None, CreateMode::Ephemeral)
        .await
        .unwrap();
}

#[tokio::test]
async fn every_way_of_opening_sees_the_same_tree_before_and_after_the_table_catches_up() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lading.db");
    // Only every 512 commits, so how far the table is behind does not depend on timing.
    let slow = SqliteOptions {
        materialize_every_ms: 3_600_000,
        materialize_idle_after: i64::MAX,
        ..SqliteOptions::default()
    };
    let a = SqliteTree::open(&file, slow).unwrap();
    // 1,300 rounds of 3–4 commits: the table is brought up to date on the way, and the last
    // few hundred commits are only in the log.
    churn(&a, 1300).await;
    let want = dump(&a).await;
    assert!(a.stats().materializations > 0, "{:?}", a.stats());
    let (rows, applied) = table(&file);
    assert!(
        applied < max_seq(&file),
        "the newest commits are in the log only"
    );
    assert_ne!(rows, want, "so the table alone is behind");

    // A second handle loads rows plus the log after them.
    let b = SqliteTree::open(&file, SqliteOptions::default()).unwrap();
    assert_eq!(dump(&b).await, want);
    b.close().await.unwrap();

    // Closing brings the table up to date; reopening reads the same tree, minus the closed
    // session's ephemeral node.
    a.close().await.unwrap();
    drop(a);
    let (rows, applied) = table(&file);
    assert_eq!(applied, max_seq(&file));
    let mut want_after = want.clone();
    want_after.remove("/held");
    assert_eq!(rows, want_after, "table and memory agree after close");
    let c = SqliteTree::open(&file, SqliteOptions::default()).unwrap();
    assert_eq!(dump(&c).await, want_after);
    // Every third node of 1,300 was deleted: 434 gone, 866 left under /q.
    assert_eq!(c.children("/q").await.unwrap().len(), 866);
    c.close().await.unwrap();
}

/// A materialization writes its rows a slice at a time between groups: a handle that opens
/// the file meanwhile finds some rows newer than the log entry the table says it reflects,
/// and loads the same tree anyway — here a node deleted and made again, whose new child's
/// row is already in the table while the log still replays the delete.
#[tokio::test]
async fn a_table_caught_up_in_part_loads_the_same_tree() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lading.db");
    let h = SqliteTree::open(&file, SqliteOptions::default()).unwrap();
    h.create("/p", None, CreateMode::Persistent).await.unwrap();
    h.close().await.unwrap();
    drop(h);
    let (_, caught_up_to) = table(&file);
    // A fold begins after four commits and writes one row per group.
    let sliced = SqliteOptions {
        materialize_every_ms: 3_600_000,
        materialize_after: 4,
        materialize_idle_after: 4,
        materialize_slice: 1,
        ..SqliteOptions::default()
    };
    let a = SqliteTree::open(&file, sliced).unwrap();
    a.delete("/p", None).await.unwrap();
    a.create("/p", Some(b"again".to_vec()), CreateMode::Persistent)
        .await
        .unwrap();
    a.create("/p/c", Some(b"child".to_vec()), CreateMode::Persistent)
        .await
        .unwrap();
    // The fourth: a hundred rows after /p/c in the table's key order, and /r.
    let mut ops = vec![
        Op::create("/r", Some(b"0".to_vec())),
        Op::create("/s", None),
    ];
    ops.extend((0..100).map(|i| Op::create(format!("/s/x{i:03}"), None)));
    a.multi(ops).await.unwrap();
    // Each group after it writes one more row (once the fold's rows are worked out): /p,
    // /r, /s, then /p/c; the hundred under /s are far from written by then.
    let mut rows = Dump::new();
    for i in 1..=100 {
        a.set("/r", Some(format!("{i}").into_bytes()), None)
            .await
            .unwrap();
        rows = table(&file).0;
        if rows.contains_key("/p/c") {
            break;
        }
    }
    let applied = table(&file).1;
    assert_eq!(applied, caught_up_to, "the fold is under way");
    assert!(rows.contains_key("/p/c"), "the child's row is written");
    assert!(!rows.contains_key("/s/x099"), "the last row is not");

    let b = SqliteTree::open(&file, SqliteOptions::default()).unwrap();
    assert_eq!(b.children("/p").await.unwrap(), vec!["c".to_string()]);
    let want = dump(&a).await;
    assert_eq!(dump(&b).await, want);
    b.close().await.unwrap();
    a.close().await.unwrap();
    drop(a);
    let (rows, applied) = table(&file);
    assert_eq!(applied, max_seq(&file));
    assert_eq!(rows, want, "the table is the tree once the fold is done");
}

/// Two handles on `file` that fold after every commit: a a row per group, b all at once.
fn slow_and_quick(file: &Path) -> (SqliteTree, SqliteTree) {
    let quiet = SqliteOptions {
        materialize_every_ms: 3_600_000,
        materialize_after: 1,
        materialize_idle_after: 1,
        ..SqliteOptions::default()
    };
    let slow = SqliteOptions {
        materialize_slice: 1,
        ..quiet.clone()
    };
    (
        SqliteTree::open(file, slow).unwrap(),
        SqliteTree::open(file, quiet).unwrap(),
    )
}

/// a commits `first`, `/s` and a hundred nodes under `/s` (each holding `data`), then makes
/// more groups, each letting its writer write a row more, until its fold has written
/// `first`'s row (a hundred groups at most).
async fn fold_under_way(a: &SqliteTree, file: &Path, first: &str, data: Option<&[u8]>) {
    let mut ops = vec![Op::create(first, None), Op::create("/s", None)];
    ops.extend((0..100).map(|i| Op::create(format!("/s/x{i:03}"), data.map(<[u8]>::to_vec))));
    a.multi(ops).await.unwrap();
    for i in 0..100 {
        if table(file).0.contains_key(first) {
            return;
        }
        a.create(&format!("/t{i:03}"), None, CreateMode::Persistent)
            .await
            .unwrap();
    }
    panic!("a's fold never wrote {first}'s row");
}

/// Two processes fold the same file: a's fold, a row per group, is overtaken by b's, which
/// writes newer images of the same nodes all at once. a's fold must stop there; had it gone
/// on, its older images would overwrite b's rows, and the log after b's fold would not
/// repair them.
#[tokio::test]
async fn a_fold_overtaken_by_a_later_one_stops() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lading.db");
    let (a, b) = slow_and_quick(&file);
    fold_under_way(&a, &file, "/r", Some(b"a")).await;
    let sets = (0..100)
        .map(|i| Op::set(format!("/s/x{i:03}"), Some(b"b".to_vec()), None))
        .collect();
    b.multi(sets).await.unwrap();
    // b's writer brings the table up to date right after that group, before its next.
    b.set("/r", Some(b"b".to_vec()), None).await.unwrap();
    let (rows, _) = table(&file);
    assert_eq!(
        rows["/s/x000"].0.as_deref(),
        Some(&b"b"[..]),
        "b's fold is done"
    );
    for i in 0..5 {
        a.set("/r", Some(format!("{i}").into_bytes()), None)
            .await
            .unwrap();
    }
    let (rows, _) = table(&file);
    assert_eq!(
        rows["/s/x000"].0.as_deref(),
        Some(&b"b"[..]),
        "a's fold stopped"
    );
    let c = SqliteTree::open(&file, SqliteOptions::default()).unwrap();
    assert_eq!(dump(&c).await, dump(&a).await);
    for t in [a, b, c] {
        t.close().await.unwrap();
    }
}

/// A fold that does not finish (here overtaken) may have written the row of a node made
/// after the table's `applied`: the fold that finishes must delete that row when the node is
/// gone again, although the node did not exist at `applied` either.
#[tokio::test]
async fn a_fold_after_an_unfinished_one_deletes_rows_it_left() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lading.db");
    let (a, b) = slow_and_quick(&file);
    // /a is the first row of a's fold in the table's order.
    fold_under_way(&a, &file, "/a", None).await;
    let (rows, applied) = table(&file);
    assert!(rows.contains_key("/a") && !rows.contains_key("/s/x099"));
    assert_eq!(applied, 0, "a's fold is under way, not done");
    // b deletes /a and folds everything at once (a's fold stops, overtaken).
    b.delete("/a", None).await.unwrap();
    b.set("/s", Some(b"b".to_vec()), None).await.unwrap();
    let (rows, applied) = table(&file);
    assert!(applied > 0, "b's fold is done");
    assert!(!rows.contains_key("/a"), "the row a's fold left is gone");
    let c = SqliteTree::open(&file, SqliteOptions::default()).unwrap();
    assert_eq!(dump(&c).await, dump(&b).await);
    for t in [a, b, c] {
        t.close().await.unwrap();
    }
}

#[tokio::test]
async fn another_handle_follows_through_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lading.db");
    let a = SqliteTree::open(&file, SqliteOptions::default()).unwrap();
    let b = SqliteTree::open(&file, SqliteOptions::default()).unwrap();
    churn(&a, 50).await;
    // b folds a's entries in on its next read.
    assert_eq!(dump(&b).await, dump(&a).await);
    b.set("/q/n00001", Some(b"from b".to_vec()), None)
        .await
        .unwrap();
    assert_eq!(
        a.get("/q/n00001").await.unwrap().unwrap().data.as_deref(),
        Some(&b"from b"[..])
    );
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Two handles write the same file in turns, one bringing the table up to date after almost
/// every commit: a writer materializes its own recent commits from memory only while nobody
/// else's came between, and from the log otherwise. Whatever the mix, the table after close
/// holds exactly the tree.
#[tokio::test]
async fn two_writers_in_turns_leave_a_table_that_matches_the_tree() {
    let eager = SqliteOptions {
        materialize_after: 3,
        materialize_idle_after: 1,
        ..SqliteOptions::default()
    };
    // b brings the table up to date only when closed: a's materializations must take b's
    // commits from the log.
    let lazy = SqliteOptions {
        materialize_every_ms: 3_600_000,
        materialize_idle_after: i64::MAX,
        ..SqliteOptions::default()
    };
    two_writers_in_turns(eager.clone(), lazy).await;
    // Both fold, a row or two per group: their folds overlap, and one that a later fold
    // overtook must stop rather than write older images after it.
    let one_row = SqliteOptions {
        materialize_slice: 1,
        ..eager.clone()
    };
    let two_rows = SqliteOptions {
        materialize_slice: 2,
        ..eager
    };
    two_writers_in_turns(one_row, two_rows).await;
}

async fn two_writers_in_turns(eager: SqliteOptions, lazy: SqliteOptions) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lading.db");
    let a = SqliteTree::open(&file, eager).unwrap();
    let b = SqliteTree::open(&file, lazy).unwrap();
    a.create("/q", None, CreateMode::Persistent).await.unwrap();
    for i in 0..300 {
        // Runs of a few commits by one handle, then by the other, on shared nodes too.
        let (t, other) = if (i / 4) % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let p = format!("/q/n{:03}", i % 40);
        match t.get(&p).await.unwrap() {
            None => {
                t.create(
                    &p,
                    Some(format!("made {i}").into_bytes()),
                    CreateMode::Persistent,
                )
                .await
                .unwrap();
            }
            Some(n) if i % 3 == 0 => t.delete(&p, Some(n.stat.version)).await.unwrap(),
            Some(n) => {
                t.set(
                    &p,
                    Some(format!("set {i}").into_bytes()),
                    Some(n.stat.version),
                )
                .await
                .unwrap();
            }
        }
        if i % 7 == 0 {
            // The other handle's view is read too (it folds the log in).
            let _ = other.children("/q").await.unwrap();
        }
    }
    let want = dump(&a).await;
    assert_eq!(dump(&b).await, want);
    // a wrote rows (with folds of a row, b may overtake every one of a's before it ends).
    assert!(a.stats().materialize_slices > 0, "{:?}", a.stats());
    a.close().await.unwrap();
    b.close().await.unwrap();
    let (rows, applied) = table(&file);
    assert_eq!(applied, max_seq(&file));
    assert_eq!(rows, want, "the table is the tree");
    let c = SqliteTree::open(&file, SqliteOptions::default()).unwrap();
    assert_eq!(dump(&c).await, want);
    c.close().await.unwrap();
}

/// Creates `path` through `t`, then puts the commit counter at `counter` back as it was: as
/// if `t`'s process had died between COMMIT and counting.
async fn create_uncounted(t: &SqliteTree, path: &str, counter: &Path) {
    let before = std::fs::read(counter).unwrap();
    assert_eq!(before.len(), 8);
    t.create(path, None, CreateMode::Persistent).await.unwrap();
    std::fs::write(counter, &before).unwrap();
}

/// A read looks for other processes' commits only when the commit counter beside the file
/// moved; a commit whose process died before counting it is found by the poll.
#[tokio::test]
async fn other_handles_commits_are_found_through_the_counter_or_the_poll() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lading.db");
    let counter = dir.path().join("lading.db-commits");
    let no_poll = SqliteOptions {
        poll_interval_ms: 3_600_000,
        ..SqliteOptions::default()
    };
    let a = SqliteTree::open(&file, no_poll.clone()).unwrap();
    let b = SqliteTree::open(&file, no_poll).unwrap();
    a.create("/x", Some(b"1".to_vec()), CreateMode::Persistent)
        .await
        .unwrap();
    assert!(b.get("/x").await.unwrap().is_some(), "counted: b looks");

    create_uncounted(&b, "/uncounted", &counter).await;
    assert!(
        a.get("/uncounted").await.unwrap().is_none(),
        "with the counter unmoved and no poll, a does not look"
    );
    // The next counted commit brings both.
    b.create("/counted", None, CreateMode::Persistent)
        .await
        .unwrap();
    assert!(a.get("/counted").await.unwrap().is_some());
    assert!(a.get("/uncounted").await.unwrap().is_some());

    // With the poll on, an uncounted commit shows up without any other.
    let c = SqliteTree::open(&file, SqliteOptions::default()).unwrap();
    assert!(c.get("/late").await.unwrap().is_none());
    create_uncounted(&b, "/late", &counter).await;
    // The handle's own poll finds it within its interval, with no signal to this test.
    lading_testkit::poll::until(
        "the poll to find the uncounted commit",
        std::time::Duration::from_secs(60),
        async || c.get("/late").await.unwrap().ok_or("not yet"),
    )
    .await;
    // After one more counted commit everyone agrees, and the data is intact.
    b.create("/done", None, CreateMode::Persistent)
        .await
        .unwrap();
    assert_eq!(dump(&a).await, dump(&b).await);
    assert_eq!(dump(&c).await, dump(&b).await);
    for t in [a, b, c] {
        t.close().await.unwrap();
    }
}

#[tokio::test]
async fn a_store_of_the_first_format_is_upgraded_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lading.db");
    {
        // The first format, as its builds wrote it: every row current, the log paths only.
        let conn = Connection::open(&file).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode=WAL;
             CREATE TABLE lading_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
             CREATE TABLE nodes(
                parent TEXT NOT NULL, name TEXT NOT NULL, data BLOB,
                version INTEGER NOT NULL, owner INTEGER NOT NULL,
                ctime INTEGER NOT NULL, mtime INTEGER NOT NULL, seq INTEGER NOT NULL DEFAULT 0,
                PRIMARY KEY(parent, name)) WITHOUT ROWID;
             CREATE INDEX nodes_owner ON nodes(owner) WHERE owner <> 0;
             CREATE TABLE changes(seq INTEGER PRIMARY KEY, paths TEXT NOT NULL);
             CREATE TABLE sessions(
                id INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL,
                start_time INTEGER, timeout_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL);
             INSERT INTO lading_meta VALUES ('format', 'lading-tree-1');
             INSERT INTO nodes VALUES ('', '', NULL, 0, 0, 1, 1, 0);
             INSERT INTO nodes VALUES ('/', 'jobs', NULL, 0, 0, 1, 1, 0);
             INSERT INTO nodes VALUES ('/jobs', 'jid0000000001', X'7B7D', 3, 0, 1, 2, 0);
             INSERT INTO changes(paths) VALUES ('/jobs\n/jobs/jid0000000001\n');",
        )
        .unwrap();
    }
    let t = SqliteTree::open(&file, SqliteOptions::default()).unwrap();
    let n = t.get("/jobs/jid0000000001").await.unwrap().unwrap();
    assert_eq!((n.data.as_deref(), n.stat.version), (Some(&b"{}"[..]), 3));
    t.create("/jobs/jid0000000002", None, CreateMode::Persistent)
        .await
        .unwrap();
    t.close().await.unwrap();
    drop(t);
    let conn = Connection::open(&file).unwrap();
    let format: String = conn
        .query_row(
            "SELECT value FROM lading_meta WHERE key='format'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(format, "lading-tree-2");
    let t = SqliteTree::open(&file, SqliteOptions::default()).unwrap();
    assert_eq!(
        t.children("/jobs").await.unwrap(),
        vec!["jid0000000001", "jid0000000002"]
    );
    t.close().await.unwrap();
}

#[tokio::test]
async fn a_corrupt_log_entry_is_named_and_nothing_is_changed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lading.db");
    let a = SqliteTree::open(&file, SqliteOptions::default()).unwrap();
    a.create("/kept", Some(b"1".to_vec()), CreateMode::Persistent)
        .await
        .unwrap();
    a.close().await.unwrap();
    drop(a);
    let conn = Connection::open(&file).unwrap();
    conn.execute("INSERT INTO changes(body) VALUES (X'0100')", [])
        .unwrap();
    let seq: i64 = conn.last_insert_rowid();
    let before = table(&file);
    let err = match SqliteTree::open(&file, SqliteOptions::default()) {
        Ok(_) => panic!("a corrupt log entry was accepted"),
        Err(e) => e,
    };
    assert!(matches!(err, TreeError::Backend(_)), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("change {seq}")) && msg.contains("truncated"),
        "{msg}"
    );
    assert_eq!(table(&file), before, "the table is as it was");
    assert_eq!(max_seq(&file), seq, "the log is as it was");
}

#[tokio::test]
async fn a_quiet_store_brings_its_table_up_to_date_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lading.db");
    let opts = SqliteOptions {
        materialize_every_ms: 50,
        ..SqliteOptions::default()
    };
    let a = SqliteTree::open(&file, opts).unwrap();
    churn(&a, 20).await;
    let want = dump(&a).await;
    // The table catches up on a quiet second, by itself.
    let rows = lading_testkit::poll::until(
        "the table to catch up",
        std::time::Duration::from_secs(60),
        async || {
            let (rows, applied) = table(&file);
            let log = max_seq(&file);
            if applied == log {
                Ok(rows)
            } else {
                Err(format!("table at {applied}, log at {log}"))
            }
        },
    )
    .await;
    assert_eq!(rows, want, "the table holds exactly the tree");
    assert!(a.stats().materializations >= 1);
    a.close().await.unwrap();
}

#[test]
fn processes_opening_a_new_store_at_once_all_get_it() {
    // As `lading worker` and `lading submit` started together do: one creates the schema while
    // the others look at the file; they wait for it instead of calling it "not ours".
    for _ in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("lading.db");
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (file, barrier) = (file.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    SqliteTree::open(&file, SqliteOptions::default()).map(|t| t.session_id())
                })
            })
            .collect();
        let mut sessions = std::collections::HashSet::new();
        for h in handles {
            let s = h
                .join()
                .unwrap()
                .unwrap_or_else(|e| panic!("open failed: {e}"));
            assert!(sessions.insert(s), "each opener has its own session");
        }
    }
}

/// Every waiting worker watches the queue's pause flag, which may never change: watches
/// dropped unfired must not pile up behind it.
#[tokio::test]
async fn dropped_watches_do_not_pile_up_on_a_node_that_never_changes() {
    let dir = tempfile::tempdir().unwrap();
    let t = SqliteTree::open(dir.path().join("s.db"), SqliteOptions::default()).unwrap();
    t.create("/flag", Some(b"0".to_vec()), CreateMode::Persistent)
        .await
        .unwrap();
    let kept = t.watch("/flag", WatchKind::Data).await.unwrap();
    for _ in 0..10_000 {
        drop(t.watch("/flag", WatchKind::Data).await.unwrap());
    }
    let n = t.registered_watches();
    assert!(n < 64, "{n} watches registered after 10,000 were dropped");
    // The one still held fires as before.
    t.set("/flag", Some(b"1".to_vec()), None).await.unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(5), kept)
        .await
        .expect("the held watch fires");
    assert_eq!(t.registered_watches(), 0);
    t.close().await.unwrap();
}

/// A lease is an ephemeral node: making, changing or dropping one waits for no fsync (it can
/// only be lost with the machine, and then every session that could have held it is gone too).
/// Every change to a persistent node still does, and carries the leases committed before it.
#[tokio::test]
async fn only_changes_to_persistent_nodes_wait_for_an_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.db");
    let t = SqliteTree::open(&file, SqliteOptions::default()).unwrap();
    let other = SqliteTree::open(&file, SqliteOptions::default()).unwrap();
    t.create("/jobs", None, CreateMode::Persistent)
        .await
        .unwrap();
    let before = t.stats().fsyncs;
    assert!(before >= 1, "a persistent create is fsynced");
    t.create("/jobs/lock", Some(b"a".to_vec()), CreateMode::Ephemeral)
        .await
        .unwrap();
    t.set("/jobs/lock", Some(b"b".to_vec()), None)
        .await
        .unwrap();
    t.delete("/jobs/lock", None).await.unwrap();
    t.create("/jobs/lock", Some(b"c".to_vec()), CreateMode::Ephemeral)
        .await
        .unwrap();
    assert_eq!(t.stats().fsyncs, before, "ephemeral changes were fsynced");
    // Committed all the same: another handle on the file sees the lease.
    let seen = other
        .get("/jobs/lock")
        .await
        .unwrap()
        .expect("the lease is there");
    assert_eq!(seen.data.as_deref(), Some(&b"c"[..]));
    assert_ne!(seen.stat.ephemeral_owner, 0);
    // A multi that touches a persistent node is fsynced, lease included.
    t.multi(vec![
        Op::create("/jobs/ref", None),
        Op::delete("/jobs/lock", None),
    ])
    .await
    .unwrap();
    assert_eq!(t.stats().fsyncs, before + 1);
    assert!(other.exists("/jobs/ref").await.unwrap().is_some());
    assert!(other.exists("/jobs/lock").await.unwrap().is_none());
    other.close().await.unwrap();
    t.close().await.unwrap();
}

#[tokio::test]
async fn the_wal_starts_over_under_a_steady_stream_of_commits() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.db");
    let wal = dir.path().join("s.db-wal");
    let opts = SqliteOptions {
        durable: false,
        ..SqliteOptions::default()
    };
    let t = SqliteTree::open(&file, opts).unwrap();
    t.create("/big", None, CreateMode::Persistent)
        .await
        .unwrap();
    // Each commit logs a node image of 20 kB: several WAL frames of 4 kB each.
    let frame = 4096 + 24;
    let mut written = 0u64;
    let mut commits = 0u64;
    while written < 3 * WAL_RESTART_FRAMES as u64 * frame {
        let data = format!("{commits:020}").repeat(1000).into_bytes();
        written += data.len() as u64;
        t.set("/big", Some(data), None).await.unwrap();
        commits += 1;
    }
    let s = t.stats();
    assert!(s.checkpoints >= 1, "no background checkpoint: {s:?}");
    assert!(s.wal_restarts >= 1, "the WAL never started over: {s:?}");
    // The WAL keeps the largest size it reached: the threshold and what came in while the
    // checkpointer caught up, far less than everything written.
    let size = std::fs::metadata(&wal).unwrap().len();
    assert!(
        size < 2 * WAL_RESTART_FRAMES as u64 * frame,
        "the WAL grew to {size} bytes after {written} bytes were written"
    );
    let last = format!("{:020}", commits - 1).repeat(1000).into_bytes();
    assert_eq!(
        t.get("/big").await.unwrap().unwrap().data,
        Some(last.clone())
    );
    t.close().await.unwrap();
    let again = SqliteTree::open(&file, SqliteOptions::default()).unwrap();
    let n = again.get("/big").await.unwrap().unwrap();
    assert_eq!(n.data, Some(last));
    assert_eq!(n.stat.version as u64, commits);
    again.close().await.unwrap();
}
