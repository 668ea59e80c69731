//! `/metrics`: Prometheus text format (version 0.0.4), written by hand — a few gauges,
//! counters and one histogram family need no library.
//!
//! Store-wide figures (jobs and batches per state, generic jobs per type and state, paused
//! queues) are read from the store at each scrape; the rest (stage runs by outcome, stage
//! latency, bytes downloaded) are what this process's workers did since it started.

use crate::{ApiError, AppState};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use lading_core::layout::QUEUE_NAMES;
use std::fmt::Write;

fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

#[utoipa::path(get, path = "/metrics", tag = "service", summary = "Metrics", responses((status = 200, description = "Prometheus text format 0.0.4", content_type = "text/plain")), security(()))]
pub async fn metrics(State(s): State<AppState>) -> Result<Response, ApiError> {
    let mut out = String::with_capacity(4096);
    store_figures(&s, &mut out).await?;
    generic_figures(&s, &mut out).await?;
    process_figures(&s, &mut out);
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response())
}

/// The store's figures: jobs and batches per state, dependencies' health and waiting jobs,
/// paused queues.
async fn store_figures(s: &AppState, out: &mut String) -> Result<(), ApiError> {
    let e = &s.ingest.engine;
    family(
        out,
        "lading_jobs",
        "gauge",
        "Ingest jobs per state, in the whole store.",
    );
    for (st, n) in e.job_counts().await? {
        let _ = writeln!(out, "lading_jobs{{state=\"{}\"}} {n}", st.name());
    }
    family(
        out,
        "lading_batches",
        "gauge",
        "Batches per state, in the whole store.",
    );
    for (st, n) in e.batch_counts().await? {
        let _ = writeln!(out, "lading_batches{{state=\"{}\"}} {n}", st.name());
    }
    let deps = lading_engine::deps::published(e).await;
    family(
        out,
        "lading_dependency_up",
        "gauge",
        "1 when the outside service answers, 0 while it is down (for any process).",
    );
    for d in &deps {
        let _ = writeln!(
            out,
            "lading_dependency_up{{kind=\"{}\",name=\"{}\"}} {}",
            label(&d.kind),
            label(&d.name),
            u8::from(d.up)
        );
    }
    family(
        out,
        "lading_jobs_waiting",
        "gauge",
        "Jobs of this process waiting on an outside service that is down.",
    );
    for d in &deps {
        let _ = writeln!(
            out,
            "lading_jobs_waiting{{dependency=\"{}\"}} {}",
            label(&d.label),
            d.waiting
        );
    }
    family(
        out,
        "lading_queue_paused",
        "gauge",
        "1 when the queue is paused.",
    );
    for q in QUEUE_NAMES {
        let p = u8::from(e.queue_paused(q).await?);
        let _ = writeln!(out, "lading_queue_paused{{queue=\"{q}\"}} {p}");
    }
    Ok(())
}

/// Generic jobs per state (and per type when configured), and this process's waiting
/// acceptors.
async fn generic_figures(s: &AppState, out: &mut String) -> Result<(), ApiError> {
    family(
        out,
        "lading_generic_jobs",
        "gauge",
        "Generic jobs per state (and per type when http.metrics_type_names is set: type \
         names are chosen by tenants, and this page needs no token), in the whole store.",
    );
    let by_type = s.ingest.cfg.http.metrics_type_names;
    let mut totals = std::collections::BTreeMap::new();
    for (ty, _) in s.jobs.types().await? {
        let mut counts: Vec<_> = s.jobs.counts(&ty).await?.into_iter().collect();
        counts.sort_by_key(|(st, _)| st.name());
        for (st, n) in counts {
            *totals.entry(st.name()).or_insert(0) += n;
            if by_type {
                let _ = writeln!(
                    out,
                    "lading_generic_jobs{{type=\"{}\",state=\"{}\"}} {n}",
                    label(&ty),
                    st.name()
                );
            }
        }
    }
    if !by_type {
        for (st, n) in totals {
            let _ = writeln!(out, "lading_generic_jobs{{state=\"{st}\"}} {n}");
        }
    }

    family(
        out,
        "lading_generic_acceptors_waiting",
        "gauge",
        "Generic-job acceptors in this process waiting for a job (idle processors and long-polls).",
    );
    let _ = writeln!(
        out,
        "lading_generic_acceptors_waiting {}",
        s.jobs.waiting_acceptors()
    );
    Ok(())
}

/// This process's own figures: stage runs and latencies, bytes downloaded, replica copies,
/// fixity failures.
fn process_figures(s: &AppState, out: &mut String) {
    let stats = &s.ingest.stats;
    family(
        out,
        "lading_stage_runs_total",
        "counter",
        "Stage handler runs in this process by outcome (done, wait, transient = retried later, fatal = failed).",
    );
    for (stage, f) in stats.figures() {
        for (outcome, n) in [
            ("done", f.done),
            ("wait", f.waits),
            ("transient", f.transient),
            ("fatal", f.fatal),
        ] {
            let _ = writeln!(
                out,
                "lading_stage_runs_total{{stage=\"{}\",outcome=\"{outcome}\"}} {n}",
                label(&stage)
            );
        }
    }
    family(
        out,
        "lading_stage_seconds",
        "histogram",
        "Stage handler latency in this process.",
    );
    for (stage, h) in stats.histograms() {
        let stage = label(&stage);
        for (le, n) in &h.cumulative {
            let _ = writeln!(
                out,
                "lading_stage_seconds_bucket{{stage=\"{stage}\",le=\"{le}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "lading_stage_seconds_bucket{{stage=\"{stage}\",le=\"+Inf\"}} {}",
            h.count
        );
        let _ = writeln!(
            out,
            "lading_stage_seconds_sum{{stage=\"{stage}\"}} {}",
            h.sum_s
        );
        let _ = writeln!(
            out,
            "lading_stage_seconds_count{{stage=\"{stage}\"}} {}",
            h.count
        );
    }
    family(
        out,
        "lading_downloaded_bytes_total",
        "counter",
        "Payload bytes downloaded and verified by this process.",
    );
    let _ = writeln!(
        out,
        "lading_downloaded_bytes_total {}",
        s.ingest.fetcher.bytes_downloaded()
    );
    family(
        out,
        "lading_replica_versions_total",
        "counter",
        "Object versions copied to a replica storage node by this process, by node and outcome (failed attempts are retried).",
    );
    for (node, (ok, failed)) in lading_ingest::replicate::copies_by_node() {
        let _ = writeln!(
            out,
            "lading_replica_versions_total{{node=\"{node}\",outcome=\"stored\"}} {ok}"
        );
        let _ = writeln!(
            out,
            "lading_replica_versions_total{{node=\"{node}\",outcome=\"failed\"}} {failed}"
        );
    }
    family(
        out,
        "lading_fixity_failures_total",
        "counter",
        "Stored copies the fixity checker in this process found bad or missing, by storage node.",
    );
    for id in s.ingest.nodes.all().map(|n| n.id) {
        let n = lading_ingest::fixity::failures_by_node()
            .get(&id)
            .copied()
            .unwrap_or(0);
        let _ = writeln!(out, "lading_fixity_failures_total{{node=\"{id}\"}} {n}");
    }
}
