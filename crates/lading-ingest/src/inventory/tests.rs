//! Unit tests of the inventory, on SQLite and on a real PostgreSQL.

use super::*;

fn version(dir: &Path, n: u32) -> StoredVersion {
    let root = dir.join(format!("obj/v{n}"));
    std::fs::create_dir_all(root.join("producer")).unwrap();
    std::fs::write(root.join("producer/a.txt"), b"alpha").unwrap();
    std::fs::write(root.join("producer/b.txt"), b"beta").unwrap();
    StoredVersion {
        ark: "ark:/99999/fk4x".into(),
        version: n,
        path: root.to_string_lossy().into_owned(),
        job: format!("jid000000000{n}"),
        batch: format!("bid000000000{n}"),
        collection: Some("demo".into()),
        node: None,
    }
}

/// The same checks on every database: recording twice changes nothing, and every read.
fn recording_a_version_twice_changes_nothing(inv: Inventory) {
    let dir = tempfile::tempdir().unwrap();
    let v = version(dir.path(), 1);
    let first = inv.record(&v, None).unwrap();
    assert_eq!(
        first,
        Recorded {
            new: true,
            files: 2
        }
    );
    let again = inv.record(&v, None).unwrap();
    assert_eq!(
        again,
        Recorded {
            new: false,
            files: 2
        }
    );
    assert_eq!(inv.versions("ark:/99999/fk4x").unwrap(), vec![(1, 2, 9)]);
    // Another job's copy under the same number (stored elsewhere): refused, named,
    // and nothing of it recorded.
    let elsewhere = dir.path().join("elsewhere/v1");
    std::fs::create_dir_all(elsewhere.join("producer")).unwrap();
    std::fs::write(elsewhere.join("producer/c.txt"), b"gamma!").unwrap();
    let other = StoredVersion {
        job: "jid0000000077".into(),
        path: elsewhere.to_string_lossy().into_owned(),
        ..v.clone()
    };
    let e = inv.record(&other, None).unwrap_err();
    assert!(
        matches!(e, InventoryError::Taken(ref t) if t.other_job == v.job),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("ark:/99999/fk4x v1 is recorded already, as job jid0000000001's copy"),
        "{e}"
    );
    assert_eq!(inv.versions("ark:/99999/fk4x").unwrap(), vec![(1, 2, 9)]);
    assert!(inv.job_versions("jid0000000077").unwrap().is_empty());
    // A second version, recorded with the files processing hashed.
    let v2 = version(dir.path(), 2);
    let known = list_files(&Path::new(&v2.path).join("producer")).unwrap();
    assert_eq!(inv.record(&v2, Some(&known)).unwrap().files, 2);
    assert_eq!(
        inv.versions("ark:/99999/fk4x").unwrap(),
        vec![(1, 2, 9), (2, 2, 9)]
    );
    assert_eq!(inv.versions("ark:/99999/nope").unwrap(), vec![]);
    assert_eq!(
        inv.owner("ark:/99999/fk4x").unwrap().as_deref(),
        Some("demo")
    );
    assert_eq!(inv.owner("ark:/99999/nope").unwrap(), None);
    assert_eq!(
        inv.version_batch("ark:/99999/fk4x", 1).unwrap().as_deref(),
        Some("bid0000000001")
    );
    assert_eq!(
        inv.version_path("ark:/99999/fk4x", 2).unwrap().as_deref(),
        Some(v2.path.as_str())
    );
    assert_eq!(inv.version_path("ark:/99999/fk4x", 3).unwrap(), None);
    // Each file's copy on the version's node (0: the storage root), checked now.
    let all = inv.copies(None, None).unwrap();
    assert_eq!(all.len(), 4, "{all:?}");
    assert!(
        all.iter()
            .all(|c| c.node == 0 && c.status == "ok" && c.checked.is_some())
    );
    assert_eq!(inv.copies(Some(7), None).unwrap(), vec![]);
    assert_eq!(inv.copies(None, Some("ark:/99999/nope")).unwrap(), vec![]);
    let c = &all[0];
    inv.set_copies(&[CopyRow {
        ark: c.ark.clone(),
        version: c.version,
        path: c.path.clone(),
        node: 0,
        status: "bad".into(),
        found: Some("beef".into()),
    }])
    .unwrap();
    let s = inv.fixity_summary().unwrap();
    assert_eq!((s.copies, s.bad, s.missing), (4, 1, 0));
    // Where the newest version lives: every node with a copy of it (a bad one too).
    assert_eq!(inv.newest_copies("ark:/99999/nope").unwrap(), None);
    let (newest, held) = inv.newest_copies(&c.ark).unwrap().expect("recorded");
    assert_eq!(held, vec![0]);
    inv.set_copies(&[CopyRow {
        ark: c.ark.clone(),
        version: newest,
        path: c.path.clone(),
        node: 9502,
        status: "ok".into(),
        found: None,
    }])
    .unwrap();
    assert_eq!(
        inv.newest_copies(&c.ark).unwrap(),
        Some((newest, vec![0, 9502]))
    );
    let per_job = inv.job_copies("jid0000000001").unwrap();
    assert_eq!(per_job.len(), 1);
    assert_eq!((per_job[0].ok, per_job[0].bad), (1, 1));
    // None was checked before the epoch; every one before the far future.
    assert!(
        inv.copies_due("1970-01-01 00:00:00 +0000", 10)
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        inv.copies_due("9999-01-01 00:00:00 +0000", 3)
            .unwrap()
            .len(),
        3
    );
    carried_files_are_their_first_versions_copies(&inv, &v, &c.ark);
}

/// A version listing a file carried over from v1: that file's copy is v1's (none is
/// recorded under v3), and every read that asks where the version is finds it there.
fn carried_files_are_their_first_versions_copies(inv: &Inventory, v: &StoredVersion, ark: &str) {
    let v1_files = inv.version_files(ark, 1).unwrap();
    let (p1, d1) = &v1_files[0];
    let v3 = StoredVersion {
        version: 3,
        job: "jid0000000003".into(),
        node: Some(9502),
        ..v.clone()
    };
    let carried = ObjectFile {
        path: p1.clone(),
        size: 5,
        sha256: d1.clone(),
        from: Some(crate::files::Origin {
            version: 1,
            path: p1.clone(),
        }),
    };
    inv.record_files(&v3, &[carried]).unwrap();
    assert_eq!(inv.versions(ark).unwrap().last(), Some(&(3, 1, 5)));
    assert!(
        inv.copies(None, Some(ark))
            .unwrap()
            .iter()
            .all(|c| c.version != 3)
    );
    let v1_copies = inv.version_copies(ark, 1).unwrap();
    let at = |n: u32| v1_copies.iter().filter(|(x, _)| *x == n).count();
    let v3_copies = inv.version_copies(ark, 3).unwrap();
    assert_eq!(v3_copies.len(), 1, "{v3_copies:?}");
    assert!(at(v3_copies[0].0) > 0, "{v3_copies:?} of {v1_copies:?}");
    let (newest, held) = inv.newest_copies(ark).unwrap().unwrap();
    assert_eq!((newest, held.len()), (3, 1));
    let per_job = inv.job_copies("jid0000000003").unwrap();
    assert_eq!((per_job.len(), per_job[0].version), (1, 3), "{per_job:?}");
}

#[test]
fn recording_a_version_twice_changes_nothing_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let at = Location::from_setting(&dir.path().join("inventory.db"));
    assert!(matches!(at, Location::Sqlite(_)));
    recording_a_version_twice_changes_nothing(Inventory::new(at));
}

#[test]
fn recording_a_version_twice_changes_nothing_on_postgres() {
    let pg = lading_testkit::pg::PgServer::start().unwrap();
    let url = pg.create_db("inventory").unwrap();
    let at = Location::from_setting(Path::new(&url));
    assert_eq!(at, Location::Postgres(url.clone()));
    recording_a_version_twice_changes_nothing(Inventory::new(at.clone()));
    // A second host (its own connection) sees the same records, and recording the same
    // version from both at once adds it once.
    let dir = tempfile::tempdir().unwrap();
    let v = StoredVersion {
        ark: "ark:/99999/fk4y".into(),
        ..version(dir.path(), 1)
    };
    let hosts: Vec<_> = (0..4)
        .map(|_| {
            let (at, v) = (at.clone(), v.clone());
            std::thread::spawn(move || Inventory::new(at).record(&v, None).unwrap())
        })
        .collect();
    let news = hosts
        .into_iter()
        .map(|h| h.join().unwrap().new)
        .filter(|n| *n)
        .count();
    assert_eq!(news, 1, "exactly one host added the version");
    let other = Inventory::new(at);
    assert_eq!(other.versions("ark:/99999/fk4y").unwrap(), vec![(1, 2, 9)]);
    assert_eq!(other.versions("ark:/99999/fk4x").unwrap().len(), 3);
}

#[test]
fn a_postgres_url_is_shown_without_its_password_and_a_bad_one_is_named() {
    let at = Location::from_setting(Path::new("postgres://lading:secret@db:5432/inv"));
    assert_eq!(at.to_string(), "postgres://lading:***@db:5432/inv");
    let bad = Inventory::new(Location::Postgres("postgres://lading@db:notaport/x".into()));
    let e = bad.owner("ark:/1/2").unwrap_err().to_string();
    assert!(e.contains("is not a PostgreSQL URL"), "{e}");
    // Nothing listens on port 1: the refusal names where it tried.
    let down = Inventory::new(Location::Postgres("postgres://lading@127.0.0.1:1/x".into()));
    let e = down.owner("ark:/1/2").unwrap_err().to_string();
    assert!(
        e.contains("PostgreSQL inventory at postgres://lading@127.0.0.1:1/x"),
        "{e}"
    );
}

/// An inventory made before files were carried over between versions (no `from_version`,
/// `from_path`) is opened, given the columns, and keeps what it held.
#[test]
fn an_inventory_made_before_carry_over_is_migrated_and_keeps_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("inventory.db");
    {
        let c = Connection::open(&db).unwrap();
        c.execute_batch(
            "CREATE TABLE objects(ark TEXT PRIMARY KEY, created TEXT NOT NULL, collection TEXT);
             CREATE TABLE versions(ark TEXT NOT NULL REFERENCES objects(ark), version INTEGER NOT NULL,
               job TEXT NOT NULL, batch TEXT NOT NULL, path TEXT NOT NULL, created TEXT NOT NULL,
               PRIMARY KEY(ark, version));
             CREATE TABLE files(ark TEXT NOT NULL, version INTEGER NOT NULL, path TEXT NOT NULL,
               size BIGINT NOT NULL, sha256 TEXT NOT NULL, PRIMARY KEY(ark, version, path),
               FOREIGN KEY(ark, version) REFERENCES versions(ark, version));
             INSERT INTO objects VALUES ('ark:/99999/fk4old', '2026-01-01 00:00:00 +0000', 'demo');
             INSERT INTO versions VALUES ('ark:/99999/fk4old', 1, 'jid0000000009', 'bid0000000009',
               '/nowhere', '2026-01-01 00:00:00 +0000');
             INSERT INTO files VALUES ('ark:/99999/fk4old', 1, 'producer/a.txt', 5, 'aa');",
        )
        .unwrap();
    }
    let inv = Inventory::new(Location::from_setting(&db));
    assert_eq!(inv.versions("ark:/99999/fk4old").unwrap(), vec![(1, 1, 5)]);
    // A carried file is recorded in the migrated table.
    let v2 = StoredVersion {
        ark: "ark:/99999/fk4old".into(),
        version: 2,
        path: "/nowhere2".into(),
        job: "jid0000000010".into(),
        batch: "bid0000000010".into(),
        collection: Some("demo".into()),
        node: Some(9501),
    };
    let f = ObjectFile {
        path: "producer/a.txt".into(),
        size: 5,
        sha256: "aa".into(),
        from: Some(crate::files::Origin {
            version: 1,
            path: "producer/a.txt".into(),
        }),
    };
    inv.record_files(&v2, &[f]).unwrap();
    assert_eq!(
        inv.version_files("ark:/99999/fk4old", 2).unwrap(),
        vec![("producer/a.txt".to_string(), "aa".to_string())]
    );
}

/// The inventory's reads are planned once per connection: each use of a cached statement
/// binds new values and runs the plan it has. Without the planner's stability guarantee,
/// SQLite planned a join, an `ORDER BY` or a `LIMIT ?` again for every new value, and
/// rusqlite's cache clears the values of every statement it takes back: every read was parsed
/// and planned again. Reads by job go through an index on the job.
#[test]
fn reads_are_planned_once_per_connection() {
    let dir = tempfile::tempdir().unwrap();
    let inv = Inventory::new(Location::Sqlite(dir.path().join("i.db")));
    let vs = [version(dir.path(), 1), version(dir.path(), 2)];
    for v in &vs {
        inv.record(v, None).unwrap();
        inv.set_copies(&[CopyRow {
            ark: v.ark.clone(),
            version: v.version,
            path: "producer/a.txt".into(),
            node: 1,
            status: "ok".into(),
            found: None,
        }])
        .unwrap();
    }
    for (i, v) in vs.iter().enumerate() {
        assert_eq!(inv.job_versions(&v.job).unwrap()[0].files.len(), 2);
        assert!(inv.job_copies(&v.job).unwrap().iter().any(|c| c.node == 1));
        assert!(matches!(inv.newest_copies(&v.ark).unwrap(), Some((2, n)) if n.contains(&1)));
        assert_eq!(inv.versions(&v.ark).unwrap().len(), 2);
        let due = inv
            .copies_due("9999-01-01 00:00:00 +0000", 1 + i as i64)
            .unwrap();
        assert_eq!(due.len(), 1 + i);
    }
    let (statements, replanned, plan) = inv
        .with(|c, _| {
            let Conn::Sqlite(c) = c else {
                unreachable!("a SQLite inventory")
            };
            // Every statement the connection keeps (the cache's), and how often SQLite
            // prepared each again.
            let (mut n, mut again) = (0, 0);
            // SAFETY: the connection is held for the whole walk, and the walk only reads
            // each statement's counter.
            unsafe {
                use rusqlite::ffi;
                let db = c.handle();
                let mut st = ffi::sqlite3_next_stmt(db, std::ptr::null_mut());
                while !st.is_null() {
                    n += 1;
                    again += ffi::sqlite3_stmt_status(st, ffi::SQLITE_STMTSTATUS_REPREPARE, 0);
                    st = ffi::sqlite3_next_stmt(db, st);
                }
            }
            let plan: Vec<String> = c
                .prepare("EXPLAIN QUERY PLAN SELECT path FROM versions WHERE job = ?1")?
                .query_map(["jid0000000001"], |r| r.get(3))?
                .collect::<Result<_, _>>()?;
            Ok((n, again, plan.join("; ")))
        })
        .unwrap();
    assert!(statements >= 5, "{statements} statements kept");
    assert_eq!(replanned, 0, "statements prepared again");
    assert!(plan.contains("versions_job"), "{plan}");
}
