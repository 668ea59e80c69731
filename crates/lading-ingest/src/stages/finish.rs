//! Recording (the inventory) and notifying (the callback, through the outbox).

use super::*;

pub(crate) async fn record(ingest: &Ingest, job: &JobCtx) -> Result<Outcome, Outcome> {
    let stored: StoredVersion = job_record(job, "store")
        .await?
        .ok_or_else(|| Outcome::fatal("the job has no store record (storing writes it)"))?;
    let lock = HeldArk::take(&job.engine, job.engine.lock_inventory(&stored.ark)).await?;
    // The object's files as processing hashed them.
    #[derive(serde::Deserialize)]
    struct Produced {
        files: Option<Vec<ObjectFile>>,
    }
    let producer: Option<Vec<ObjectFile>> = job_record::<Produced>(job, "inventory")
        .await?
        .and_then(|p| p.files);
    // A version on a bucket node lists its files in its record there.
    let listed = match stored.node.and_then(|id| ingest.nodes.get(id)) {
        Some(n) if matches!(n.place, crate::nodes::Place::Bucket { .. }) => {
            let r = read_node_version(n, &stored.ark, stored.version).await;
            match r {
                Ok(Some(r)) => Some(r.files),
                Ok(None) => {
                    lock.release().await;
                    return Err(Outcome::fatal(format!(
                        "{}: the record of {} v{} is missing",
                        n.name(),
                        stored.ark,
                        stored.version
                    )));
                }
                Err(e) => {
                    lock.release().await;
                    return Err(store_node::node_outcome(n, e));
                }
            }
        }
        _ => None,
    };
    let s = stored.clone();
    // The object's names in its collection (a bag's name): a later bag of that name is its
    // next version.
    let names: Vec<String> = (job.info.identifiers.local_id.iter())
        .filter(|n| !n.is_empty())
        .cloned()
        .collect();
    let r = ingest
        .inventory
        .run(move |i| {
            let r = match listed {
                Some(files) => i.record_files(&s, &files),
                None => i.record(&s, producer.as_deref()),
            }?;
            if let Some(collection) = s.collection.as_deref() {
                for n in &names {
                    i.name_object(collection, n, &s.ark)?;
                }
            }
            Ok(r)
        })
        .await;
    lock.release().await;
    let added = r.map_err(|e| match e {
        // No retry records it: the operator decides which copy is the object's.
        e @ crate::inventory::InventoryError::Taken(_) => Outcome::fatal(e),
        e => Outcome::Transient(format!("inventory: {e}")),
    })?;
    job.log(&format!(
        "recorded {} v{} ({} files{})",
        stored.ark,
        stored.version,
        added.files,
        if added.new { "" } else { ", already recorded" }
    ));
    Ok(Outcome::Done)
}

pub(crate) async fn notify(ingest: &Ingest, job: &JobCtx) -> Result<Outcome, Outcome> {
    let profile = job_profile(ingest, job)?;
    let Some(url) = profile.callback_url else {
        return Ok(Outcome::Done);
    };
    let store = job_json(job, "store").await?.unwrap_or(Value::Null);
    // The same for every attempt at delivering this outcome (the job and the version it
    // stored), so the receiver can drop a repeat: delivery is at least once.
    let key = format!(
        "lading:{}:{}:completed:{}",
        job.config()?
            .batch_uuid
            .as_deref()
            .unwrap_or(job.info.bid.as_str()),
        job.job(),
        store.get("version").and_then(Value::as_u64).unwrap_or(0)
    );
    let body = json!({
        "idempotency_key": key,
        "job": job.job().as_str(),
        "batch": job.info.bid,
        "status": "Completed",
        "profile": profile.name,
        "identifiers": job.info.identifiers,
        "metadata": job.info.metadata,
        "store": store,
    });
    // Recorded in the outbox with the job's move to Completed, and posted after it commits:
    // a worker fenced or killed before its commit sends nothing.
    job.add_effect(lading_engine::Effect {
        kind: lading_engine::EffectKind::Callback,
        key: key.clone(),
        batch: Some(job.info.bid.clone()),
        job: Some(job.job().clone()),
        payload: json!({"url": url, "body": body}),
    })
    .await;
    job.log(&format!("callback to {url} recorded ({key})"));
    Ok(Outcome::Done)
}
