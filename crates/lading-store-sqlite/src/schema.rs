//! The database: opening it, its schema, reading rows into the in-memory tree, following other processes' changes, and sessions.

use super::*;

pub(crate) fn open_conn(path: &Path, durable: bool) -> Result<Connection, TreeError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| TreeError::NotOurs(path.display().to_string(), e.to_string()))?;
    conn.busy_timeout(Duration::from_secs(30))
        .map_err(backend)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .map_err(|e| {
            if is_busy(&e) {
                busy(path, e)
            } else {
                TreeError::NotOurs(path.display().to_string(), e.to_string())
            }
        })?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(TreeError::Backend(format!(
            "could not switch {} to WAL (got {mode})",
            path.display()
        )));
    }
    conn.execute_batch(if durable {
        "PRAGMA synchronous=FULL;"
    } else {
        "PRAGMA synchronous=NORMAL;"
    })
    .map_err(|e| busy_or_backend(path, e))?;
    conn.execute_batch(
        // No connection checkpoints on commit: the checkpointer thread copies the WAL into
        // the file in the background, and the writer only finishes its last stretch.
        "PRAGMA cache_size=-32768; PRAGMA temp_store=MEMORY; PRAGMA wal_autocheckpoint=0;",
    )
    .map_err(|e| busy_or_backend(path, e))?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

pub(crate) fn busy(path: &Path, e: rusqlite::Error) -> TreeError {
    TreeError::Backend(format!("{}{BUSY}{e}", path.display()))
}

pub(crate) fn busy_or_backend(path: &Path, e: rusqlite::Error) -> TreeError {
    if is_busy(&e) {
        busy(path, e)
    } else {
        backend(e)
    }
}

pub(crate) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Refuses a file that holds anything but a Lading store (or nothing).
pub(crate) fn check_ours(conn: &Connection, path: &Path) -> Result<(), TreeError> {
    let not_ours = |why: String| TreeError::NotOurs(path.display().to_string(), why);
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type='table'")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(|e| {
            if is_busy(&e) {
                // Another process is creating or changing the store right now: that says
                // nothing about whose file it is.
                busy(path, e)
            } else {
                not_ours(e.to_string())
            }
        })?;
    if !tables.is_empty() && !tables.iter().any(|t| t == "lading_meta") {
        return Err(not_ours(format!(
            "it holds other tables ({})",
            tables.join(", ")
        )));
    }
    Ok(())
}

/// Creates the schema, or checks an existing file is of our format.
pub(crate) fn init_schema(conn: &Connection, path: &Path, now: u64) -> Result<(), TreeError> {
    let not_ours = |why: String| TreeError::NotOurs(path.display().to_string(), why);
    let has_meta: bool = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='lading_meta'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map_err(|e| busy_or_backend(path, e))?
        > 0;
    if has_meta {
        let format: Option<String> = conn
            .query_row(
                "SELECT value FROM lading_meta WHERE key='format'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| busy_or_backend(path, e))?;
        return match format.as_deref() {
            Some(FORMAT) => Ok(()),
            // Every row of format 1 is current, so its log (paths only) is simply replaced.
            Some(FORMAT_1) => conn
                .execute_batch(
                    "BEGIN IMMEDIATE;
                     DROP TABLE IF EXISTS changes;
                     DROP INDEX IF EXISTS nodes_owner;
                     CREATE TABLE changes(seq INTEGER PRIMARY KEY, body BLOB NOT NULL);
                     INSERT OR REPLACE INTO lading_meta(key, value) VALUES ('applied', '0');
                     UPDATE lading_meta SET value = 'lading-tree-2' WHERE key = 'format';
                     COMMIT;",
                )
                .map_err(|e| {
                    let _ = conn.execute_batch("ROLLBACK");
                    busy_or_backend(path, e)
                }),
            other => Err(not_ours(format!(
                "unknown format {other:?}, this build reads {FORMAT}"
            ))),
        };
    }
    conn.execute_batch(
        "BEGIN IMMEDIATE;
         CREATE TABLE IF NOT EXISTS lading_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
         CREATE TABLE IF NOT EXISTS nodes(
            parent TEXT NOT NULL, name TEXT NOT NULL, data BLOB,
            version INTEGER NOT NULL, owner INTEGER NOT NULL,
            ctime INTEGER NOT NULL, mtime INTEGER NOT NULL, seq INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY(parent, name)) WITHOUT ROWID;
         CREATE TABLE IF NOT EXISTS changes(seq INTEGER PRIMARY KEY, body BLOB NOT NULL);
         CREATE TABLE IF NOT EXISTS sessions(
            id INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL,
            start_time INTEGER, timeout_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL);",
    )
    .map_err(|e| busy_or_backend(path, e))?;
    conn.execute(
        "INSERT OR IGNORE INTO lading_meta(key, value) VALUES ('format', ?1), ('applied', '0')",
        [FORMAT],
    )
    .map_err(|e| busy_or_backend(path, e))?;
    conn.execute(
        "INSERT OR IGNORE INTO nodes(parent, name, data, version, owner, ctime, mtime) VALUES ('', '', NULL, 0, 0, ?1, ?1)",
        [now as i64],
    )
    .map_err(|e| busy_or_backend(path, e))?;
    conn.execute_batch("COMMIT;")
        .map_err(|e| busy_or_backend(path, e))?;
    Ok(())
}

/// `(parent, name)` keys of a path; the root is `("", "")`.
pub(crate) fn key(path: &str) -> (&str, &str) {
    if path == "/" {
        ("", "")
    } else {
        split_path(path)
    }
}

pub(crate) fn path_of(parent: String, name: String) -> String {
    if parent.is_empty() {
        "/".into()
    } else {
        lading_core::tree::join_path(&parent, &name)
    }
}

pub(crate) fn row_node(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<MemNode> {
    Ok(MemNode {
        data: r.get(at)?,
        version: r.get(at + 1)?,
        owner: r.get::<_, i64>(at + 2)? as u64,
        ctime: r.get::<_, i64>(at + 3)? as u64,
        mtime: r.get::<_, i64>(at + 4)? as u64,
        seq: r.get(at + 5)?,
    })
}

pub(crate) fn last_change(conn: &Connection) -> rusqlite::Result<(i64, i64)> {
    // Two single-aggregate subqueries: each is one index probe. `coalesce(min(..))` in one
    // select would scan the whole log.
    conn.prepare_cached("SELECT coalesce((SELECT min(seq) FROM changes), 0), coalesce((SELECT max(seq) FROM changes), 0)")?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
}

/// The last change-log entry the `nodes` table reflects.
pub(crate) fn applied(conn: &Connection) -> rusqlite::Result<i64> {
    let v: String = conn
        .prepare_cached("SELECT value FROM lading_meta WHERE key = 'applied'")?
        .query_row([], |r| r.get(0))?;
    v.parse().map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e))
    })
}

pub(crate) fn corrupt(why: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Blob, why.into())
}

/// Calls `f` with each change-log entry after `after`, in commit order.
pub(crate) fn each_change(
    conn: &Connection,
    after: i64,
    mut f: impl FnMut(i64, Vec<log::Entry>),
) -> rusqlite::Result<()> {
    let mut stmt =
        conn.prepare_cached("SELECT seq, body FROM changes WHERE seq > ?1 ORDER BY seq")?;
    let mut rows = stmt.query([after])?;
    while let Some(r) = rows.next()? {
        let seq: i64 = r.get(0)?;
        let body = r.get_ref(1)?.as_blob()?;
        f(
            seq,
            log::decode(body).map_err(|e| corrupt(format!("change {seq}: {e}")))?,
        );
    }
    Ok(())
}

pub(crate) fn fold_entries(
    mem: &mut Mem,
    entries: Vec<log::Entry>,
    mut paths: Option<&mut Vec<String>>,
) {
    for e in entries {
        match e.node {
            Some(n) => mem.put(e.path.as_str().into(), n),
            None => mem.remove(&e.path),
        }
        if let Some(ps) = paths.as_deref_mut() {
            ps.push(e.path);
        }
    }
}

/// Loads the whole tree: the materialized rows, then the log after them. Call inside a
/// transaction so rows and log agree.
pub(crate) fn full_load(conn: &Connection, mem: &mut Mem) -> rusqlite::Result<()> {
    mem.clear();
    let mut stmt =
        conn.prepare("SELECT parent, name, data, version, owner, ctime, mtime, seq FROM nodes")?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        mem.put(path_of(r.get(0)?, r.get(1)?).into(), row_node(r, 2)?);
    }
    let applied = applied(conn)?;
    let mut synced = applied.max(last_change(conn)?.1);
    each_change(conn, applied, |seq, entries| {
        fold_entries(mem, entries, None);
        synced = synced.max(seq);
    })?;
    // Rows written by a materialization under way can be ahead of `applied`: the replay then
    // meets some nodes out of order, which leaves each node's image right but not always
    // its parent's list of children (see `fold`).
    mem.index_children();
    mem.synced = synced;
    Ok(())
}

/// What a sync found.
pub(crate) enum Synced {
    Nothing,
    Paths(Vec<String>),
    Reloaded,
}

/// Folds other connections' commits into `mem`. Call inside a transaction.
pub(crate) fn sync_from(conn: &Connection, mem: &mut Mem) -> rusqlite::Result<Synced> {
    let (first, last) = last_change(conn)?;
    if last <= mem.synced {
        return Ok(Synced::Nothing);
    }
    if first > mem.synced + 1 {
        full_load(conn, mem)?;
        return Ok(Synced::Reloaded);
    }
    // In commit order (change feeds report them so), each commit's paths once.
    let mut paths: Vec<String> = Vec::new();
    each_change(conn, mem.synced, |_, entries| {
        fold_entries(mem, entries, Some(&mut paths))
    })?;
    mem.synced = last;
    Ok(Synced::Paths(paths))
}

pub(crate) fn new_session(conn: &Connection, opts: &SqliteOptions) -> rusqlite::Result<u64> {
    let now = opts.clock.now_ms();
    let pid = std::process::id();
    conn.query_row(
        "INSERT INTO sessions(owner, host, pid, start_time, timeout_ms, expires_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6) RETURNING id",
        params![
            opts.owner,
            hostname(),
            pid,
            process_start_time(pid).map(|t| t as i64),
            opts.session_timeout_ms as i64,
            (now + opts.session_timeout_ms) as i64
        ],
        |r| r.get::<_, i64>(0),
    )
    .map(|id| id as u64)
}

/// Sessions that lapsed, or whose process on this host is gone.
pub(crate) fn dead_sessions(conn: &Connection, now: u64, keep: u64) -> rusqlite::Result<Vec<u64>> {
    let host = hostname();
    let sessions: Vec<(i64, String, u32, Option<i64>, i64)> = conn
        .prepare_cached("SELECT id, host, pid, start_time, expires_ms FROM sessions")?
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(sessions
        .into_iter()
        .filter(|(id, h, pid, start, expires)| {
            let lapsed = (*expires as u64) < now;
            let gone = *h == host
                && *pid != std::process::id()
                && process_start_time(*pid).map(|t| t as i64) != *start;
            *id as u64 != keep && (lapsed || gone)
        })
        .map(|s| s.0 as u64)
        .collect())
}

/// A human-readable summary of the sessions in a store, for `lading dump --sessions`.
pub fn describe_sessions(path: &Path) -> Result<Vec<String>, TreeError> {
    let conn = open_conn(path, true)?;
    let rows = conn
        .prepare("SELECT id, owner, expires_ms FROM sessions ORDER BY id")
        .and_then(|mut s| {
            s.query_map([], |r| {
                Ok(format!(
                    "{} {} expires {}",
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    format_ts(r.get::<_, i64>(2)? as u64)
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(backend)?;
    Ok(rows)
}
