//! `lading bench console`: the console's reads on a big store. N ingest jobs (in batches of
//! 100,000, three collections; 2 % moved to Failed with one of two messages) in a fresh store
//! behind a server in this process; then each page's calls, timed from a client on loopback:
//! the overview (its five calls at once, as the page makes them), the processes page, and a
//! filtered jobs page's first page (Failed, one collection, a message text). The figures are
//! the time until a page has every answer.

use crate::http::{BenchServer, TOKEN};
use crate::percentile;
use lading_core::{Event, JobState};
use lading_engine::JobSpec;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

const COLLECTIONS: [&str; 3] = ["letters", "maps", "photos"];
const PER_BATCH: usize = 100_000;

fn spec(i: usize) -> JobSpec {
    let cfg = lading_core::layout::JobConfiguration {
        collection: Some(COLLECTIONS[i % 3].into()),
        profile_name: Some(COLLECTIONS[i % 3].into()),
        submitter: Some("bench".into()),
        ..Default::default()
    };
    JobSpec {
        configuration: cfg,
        ..Default::default()
    }
}

/// The pages timed: name, and the calls each makes at once.
const PAGES: [(&str, &[&str]); 3] = [
    (
        "overview",
        &[
            "/api/v1/status",
            "/api/v1/overview",
            "/api/v1/deletions?open=true",
            "/api/v1/processes",
            "/api/v1/metrics/stages",
        ],
    ),
    ("processes", &["/api/v1/processes"]),
    (
        "filtered jobs (first page)",
        &["/api/v1/jobs?state=Failed&collection=letters&message=refused&limit=50"],
    ),
];

pub async fn console(
    jobs: usize,
    samples: usize,
    as_json: bool,
    store: Option<&str>,
) -> crate::Result<()> {
    let server = BenchServer::start(store, 1 << 20).await?;
    let e = server.engine.clone();
    let t = Instant::now();
    let mut left = jobs;
    while left > 0 {
        let n = left.min(PER_BATCH);
        crate::fill_with(&e, serde_json::Map::new(), n, spec).await?;
        left -= n;
        if !as_json {
            eprintln!(
                "  {} jobs made ({:.0} s)",
                jobs - left,
                t.elapsed().as_secs_f64()
            );
        }
    }
    // 2 % fail, half of them "refused by the host".
    let failing = jobs / 50;
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (e, next) = (e.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::SeqCst) < failing {
                let Some(l) = e.acquire_job(JobState::Pending).await? else {
                    break;
                };
                let msg = if l.job.as_str().ends_with(['0', '2', '4', '6', '8']) {
                    "connection refused by the host"
                } else {
                    "checksum mismatch"
                };
                e.job_transition(l, Event::Fail, Some(msg.into())).await?;
            }
            Ok::<_, crate::BenchError>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let fill_s = t.elapsed().as_secs_f64();
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let mut rows = Vec::new();
    for (page, calls) in PAGES {
        let mut lat = Vec::with_capacity(samples);
        for _ in 0..samples {
            let t = Instant::now();
            let answers = futures_util::future::join_all(calls.iter().map(|c| {
                client
                    .get(format!("{}{c}", server.base))
                    .bearer_auth(TOKEN)
                    .send()
            }))
            .await;
            for (c, r) in calls.iter().zip(answers) {
                let r = r?;
                let status = r.status();
                r.bytes().await?;
                crate::error::ensure!(status.is_success(), "{c}: {status}");
            }
            lat.push(t.elapsed().as_micros() as u64);
        }
        lat.sort_unstable();
        let (p50, p95, max) = (
            percentile(&lat, 0.5),
            percentile(&lat, 0.95),
            percentile(&lat, 1.0),
        );
        if !as_json {
            println!(
                "  {page:<28} p50 {p50:>8.2} ms   p95 {p95:>8.2} ms   max (the first, cold) {max:>8.2} ms"
            );
        }
        rows.push(
            json!({"page": page, "p50_ms": p50, "p95_ms": p95, "max_ms": max, "samples": samples}),
        );
    }
    let t = Instant::now();
    let count: serde_json::Value = client
        .get(format!(
            "{}/api/v1/jobs/count?state=Failed&collection=letters&message=refused",
            server.base
        ))
        .bearer_auth(TOKEN)
        .send()
        .await?
        .json()
        .await?;
    let count_ms = t.elapsed().as_secs_f64() * 1000.0;
    if !as_json {
        println!(
            "  count of that filter: {} of {} Failed looked at, in {count_ms:.0} ms",
            count["matched"], count["scanned"]
        );
        println!(
            "  ({jobs} jobs, {failing} Failed, made in {fill_s:.0} s; {samples} samples per page)"
        );
    } else {
        println!(
            "{}",
            json!({"jobs": jobs, "failed": failing, "fill_s": fill_s, "pages": rows,
                "count": count, "count_ms": count_ms})
        );
    }
    server.finish().await
}
