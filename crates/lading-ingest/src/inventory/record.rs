//! Recording a version and its files in one transaction, on SQLite and on PostgreSQL.

use super::*;

pub(super) fn record_sqlite(
    c: &mut Connection,
    v: &StoredVersion,
    files: &[ObjectFile],
    now: &str,
) -> Result<Result<Recorded, (String, String)>, InventoryError> {
    let tx = c.transaction()?;
    tx.prepare_cached(
        "INSERT OR IGNORE INTO objects(ark, created, collection) VALUES (?1, ?2, ?3)",
    )?
    .execute(params![v.ark, now, v.collection])?;
    if v.collection.is_some() {
        // An object recorded before owners were kept gets its first recorded owner.
        tx.prepare_cached(
            "UPDATE objects SET collection = ?2 WHERE ark = ?1 AND collection IS NULL",
        )?
        .execute(params![v.ark, v.collection])?;
    }
    let new = tx.prepare_cached(
        "INSERT OR IGNORE INTO versions(ark, version, job, batch, path, created) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(
        params![v.ark, v.version, v.job, v.batch, v.path, now],
    )? == 1;
    if !new {
        let (job, path): (String, String) = tx.query_row(
            "SELECT job, path FROM versions WHERE ark = ?1 AND version = ?2",
            params![v.ark, v.version],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        if job != v.job {
            // Rolled back: nothing of this copy is recorded.
            return Ok(Err((job, path)));
        }
    }
    for f in files {
        let (from_version, from_path) = (
            f.from.as_ref().map(|o| o.version),
            f.from.as_ref().map(|o| &o.path),
        );
        tx.prepare_cached(
            "INSERT OR IGNORE INTO files(ark, version, path, size, sha256, from_version, from_path)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?
        .execute(params![
            v.ark,
            v.version,
            f.path,
            f.size as i64,
            f.sha256,
            from_version,
            from_path
        ])?;
    }
    tx.commit()?;
    Ok(Ok(Recorded {
        new,
        files: files.len(),
    }))
}

/// The same as [`record_sqlite`], with the files in one statement. Two hosts recording the
/// same version at once: the second waits for the first's rows and then adds nothing.
pub(super) fn record_postgres(
    c: &mut postgres::Client,
    v: &StoredVersion,
    files: &[ObjectFile],
    now: &str,
) -> Result<Result<Recorded, (String, String)>, postgres::Error> {
    let mut tx = c.transaction()?;
    let version = v.version as i32;
    tx.execute(
        "INSERT INTO objects(ark, created, collection) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
        &[&v.ark, &now, &v.collection],
    )?;
    if v.collection.is_some() {
        tx.execute(
            "UPDATE objects SET collection = $2 WHERE ark = $1 AND collection IS NULL",
            &[&v.ark, &v.collection],
        )?;
    }
    let new = tx.execute(
        "INSERT INTO versions(ark, version, job, batch, path, created) VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT DO NOTHING",
        &[&v.ark, &version, &v.job, &v.batch, &v.path, &now],
    )? == 1;
    if !new {
        let row = tx.query_one(
            "SELECT job, path FROM versions WHERE ark = $1 AND version = $2",
            &[&v.ark, &version],
        )?;
        let (job, path): (String, String) = (row.get(0), row.get(1));
        if job != v.job {
            return Ok(Err((job, path)));
        }
    }
    let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
    let sizes: Vec<i64> = files.iter().map(|f| f.size as i64).collect();
    let digests: Vec<&str> = files.iter().map(|f| f.sha256.as_str()).collect();
    let from_versions: Vec<Option<i32>> = files
        .iter()
        .map(|f| f.from.as_ref().map(|o| o.version as i32))
        .collect();
    let from_paths: Vec<Option<&str>> = files
        .iter()
        .map(|f| f.from.as_ref().map(|o| o.path.as_str()))
        .collect();
    tx.execute(
        "INSERT INTO files(ark, version, path, size, sha256, from_version, from_path)
         SELECT $1, $2, p, s, h, fv, fp
         FROM unnest($3::text[], $4::bigint[], $5::text[], $6::int[], $7::text[]) AS t(p, s, h, fv, fp)
         ON CONFLICT DO NOTHING",
        &[&v.ark, &version, &paths, &sizes, &digests, &from_versions, &from_paths],
    )?;
    tx.commit()?;
    Ok(Ok(Recorded {
        new,
        files: files.len(),
    }))
}
