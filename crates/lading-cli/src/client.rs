//! The command line as a client of `lading serve` (`--server URL --token T`): submit (by URL,
//! or a local file as an upload), status, and the admin verbs, over the HTTP API.

use lading_server::api::SubmitRequest;
use lading_server::client::Client;
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

#[allow(clippy::too_many_arguments)]
pub async fn submit(
    c: &Client,
    payload: &str,
    profile: &str,
    payload_type: &str,
    submitter: Option<String>,
    title: Option<String>,
    wait: bool,
) -> anyhow::Result<()> {
    let mut req = SubmitRequest {
        profile: profile.to_string(),
        payload_type: Some(payload_type.to_string()),
        title,
        submitter,
        ..Default::default()
    };
    let v = if payload.contains("://") {
        req.payload_url = Some(payload.to_string());
        c.submit(&req).await?
    } else {
        c.upload(Path::new(payload), &req).await?
    };
    let bid = v["id"].as_str().unwrap_or_default().to_string();
    println!("{bid}");
    if wait {
        follow(c, &bid).await?;
        report(c, &bid).await?;
    }
    Ok(())
}

/// Re-reads the batch's state and its jobs' states (a job already known in a live folder
/// keeps the state the events gave it).
async fn refresh(
    c: &Client,
    bid: &str,
    jobs: &mut HashMap<String, String>,
    state: &mut String,
) -> anyhow::Result<()> {
    let b = c
        .call("GET", &format!("/api/v1/batches/{bid}"), None)
        .await?;
    *state = b["status"]["status"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    for (folder, list) in b["jobs"].as_object().into_iter().flatten() {
        for j in list.as_array().into_iter().flatten() {
            let j = j.as_str().unwrap_or_default().to_string();
            let st = match folder.as_str() {
                "batch-completed" => "Completed".to_string(),
                "batch-failed" => "Failed".to_string(),
                _ if jobs.contains_key(&j) => continue,
                _ => c.call("GET", &format!("/api/v1/jobs/{j}"), None).await?["status"]["status"]
                    .as_str()
                    .unwrap_or("Pending")
                    .to_string(),
            };
            jobs.insert(j, st);
        }
    }
    Ok(())
}

/// Shows the batch's progress per stage until it ends, following its event stream.
async fn follow(c: &Client, bid: &str) -> anyhow::Result<()> {
    // The stream first, then the state: nothing in between is missed.
    let resp = c
        .request("GET", &format!("/api/v1/events?batch={bid}"))?
        .send()
        .await?;
    let mut events = resp.error_for_status()?;
    let mut p = crate::progress::StageProgress::new();
    refresh(c, bid, &mut p.jobs, &mut p.batch_state).await?;
    p.draw();
    let mut buf = String::new();
    while !matches!(p.batch_state.as_str(), "Completed" | "Failed" | "Deleted") {
        let chunk = tokio::select! {
            c = events.chunk() => c?,
            // A slow re-read backs the stream up (a missed or reset stream).
            _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => {
                refresh(c, bid, &mut p.jobs, &mut p.batch_state).await?;
                p.draw();
                continue;
            }
        };
        let Some(chunk) = chunk else {
            refresh(c, bid, &mut p.jobs, &mut p.batch_state).await?;
            break;
        };
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(i) = buf.find("\n\n") {
            let block: String = buf.drain(..i + 2).collect();
            if block.contains("event: reset") || block.contains("event:reset") {
                refresh(c, bid, &mut p.jobs, &mut p.batch_state).await?;
            }
            for line in block.lines() {
                let Some(data) = line.strip_prefix("data:") else {
                    continue;
                };
                let Ok(ev) = serde_json::from_str::<Value>(data.trim()) else {
                    continue;
                };
                let to = ev["to"].as_str().unwrap_or_default().to_string();
                match ev["kind"].as_str() {
                    Some("job") => {
                        p.jobs
                            .insert(ev["id"].as_str().unwrap_or_default().to_string(), to);
                    }
                    Some("batch") => p.batch_state = to,
                    _ => {}
                }
            }
        }
        p.draw();
    }
    p.draw();
    p.finish();
    Ok(())
}

/// Prints the batch and each job, as the local `submit --wait` does.
async fn report(c: &Client, bid: &str) -> anyhow::Result<()> {
    let b = c
        .call("GET", &format!("/api/v1/batches/{bid}"), None)
        .await?;
    let mut jobs = Vec::new();
    for j in crate::pipeline::report_job_ids(&b) {
        jobs.push(c.call("GET", &format!("/api/v1/jobs/{j}"), None).await?);
    }
    print!("{}", crate::pipeline::report_text(&b, &jobs));
    if b["status"]["status"] == "Failed" {
        return Err(crate::pipeline::BatchFailed(bid.to_string()).into());
    }
    Ok(())
}

/// `lading status [ID]` through the server.
pub async fn status(c: &Client, id: Option<&str>) -> anyhow::Result<Value> {
    let path = match id {
        None => "/api/v1/status".to_string(),
        Some(j) if j.starts_with("jid") => format!("/api/v1/jobs/{j}"),
        Some(b) => format!("/api/v1/batches/{b}"),
    };
    c.call("GET", &path, None).await
}
