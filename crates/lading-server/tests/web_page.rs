//! The console in a real headless browser (Debian's `chromium`, driven over the DevTools
//! protocol on a pipe): it asks for the token first, then every page is visited and every
//! kind of action performed with real mouse clicks and typing; the page updates itself from the
//! event stream; any error in the browser's console fails the test; a screenshot of each page is
//! written under the test's temporary folder (its path is printed).

mod common;

use common::*;
use lading_testkit::browser::Browser;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// What the console test finds in the store before the browser opens.
#[derive(Clone)]
struct Fixtures {
    /// A processing batch of five jobs: four failed, one completed.
    failed_bid: String,
    /// A batch whose intake failed.
    intake_failed: String,
    failed_jobs: Vec<String>,
    done_job: String,
    /// A deletion another admin asked for.
    asked: String,
    /// A pending batch of alice's.
    pending_bid: String,
}

/// What surrounds the jobs: a bad replica of the stored version, a deletion another admin
/// asked for, the first failed job's working folder and log, a dependency down, a crashed
/// tool's lock, a pending batch of alice's, generic jobs failed and running. Returns the
/// deletion's id and the pending batch.
async fn around_the_jobs(s: &Server, first_failed: &str) -> (String, String) {
    // A replica of that version on node 9502, which the fixity checker found with other bytes.
    s.ingest
        .inventory
        .run(|i| {
            i.set_copies(&[lading_ingest::inventory::CopyRow {
                ark: "ark:/99999/fk4page".into(),
                version: 1,
                path: "producer/letter.txt".into(),
                node: 9502,
                status: "bad".into(),
                found: Some("0".repeat(64)),
            }])
        })
        .await
        .unwrap();
    // A deletion of that version another admin asked for: this console may decide it.
    let asked = lading_ingest::deletion::request(
        &s.ingest,
        "ark:/99999/fk4page",
        Some(1),
        "sent by mistake",
        "curator",
    )
    .await
    .unwrap();
    let work = s.ingest.cfg.work_dir().join(first_failed);
    std::fs::create_dir_all(work.join("producer")).unwrap();
    std::fs::write(work.join("producer/scan.tif"), b"0123456789").unwrap();
    let log: String = (1..=60).map(|i| format!("download line {i}\n")).collect();
    std::fs::write(work.join("job.log"), log).unwrap();
    // A storage node this process found down (as a refused connection marks it), and the
    // SMTP server it found up.
    let deps = s.ingest.engine.deps();
    let now = s.ingest.engine.clock().now_ms();
    deps.register(
        lading_engine::deps::Dependency::new("smtp", "smtp", "127.0.0.1:25"),
        None,
    );
    deps.down(
        &lading_engine::deps::Dependency::new("storage-node", "9501", "http://127.0.0.1:1"),
        "connection refused",
        now,
    );
    // A storage lock a crashed Merritt process left (persistent, so nobody's session ends it).
    s.jobs
        .tree()
        .multi(vec![lading_core::Op::create(
            format!(
                "{}/ark-99999-fk4crashed",
                lading_core::layout::STORAGE_LOCKS
            ),
            None,
        )])
        .await
        .unwrap();
    // A pending batch of alice's (never fetched: no workers run here).
    let (_, v) = s
        .post(SUBMITTER, "/api/v1/batches", json!({"payload_url": "http://127.0.0.1:9/x", "profile": "demo", "title": "Letters of 1910"}))
        .await;
    let pending_bid = v["id"].as_str().unwrap().to_string();
    // Generic jobs: one failed, one running.
    s.call(
        ADMIN,
        "PUT",
        "/api/v1/types/thumbs",
        Some(json!({"timeout_s": 600, "max_attempts": 1})),
    )
    .await;
    for id in ["broken", "busy"] {
        s.post(ADMIN, "/api/v1/types/thumbs/jobs", json!({"id": id}))
            .await;
    }
    let (_, broken) = s
        .post(ADMIN, "/api/v1/types/thumbs/accept", json!({}))
        .await;
    s.post(
        ADMIN,
        "/api/v1/types/thumbs/jobs/broken/finish",
        json!({"lock": broken["lock"], "error": "convert: bad header"}),
    )
    .await;
    s.post(ADMIN, "/api/v1/types/thumbs/accept", json!({}))
        .await;

    (asked.id, pending_bid)
}

/// The store the console test's pages show: batches and jobs in every state that has an
/// action, a stored version with a bad replica, a deletion asked for, a dependency down, a
/// crashed tool's lock, generic jobs failed and running.
async fn console_fixtures(s: &Server) -> Fixtures {
    use lading_core::{BatchState, Event, JobState};
    // A processing batch with three failed jobs (made first, so it is the one acquired).
    let e = s.ingest.engine.clone();
    let (failed_bid, _) = lading_store_tests::batch_with_jobs(&e, 5, &[]).await;
    // A batch whose intake failed: its report can be asked for again.
    let intake_failed = e.create_batch(Default::default()).await.unwrap();
    let l = e.acquire_batch(BatchState::Pending).await.unwrap().unwrap();
    assert_eq!(l.batch, intake_failed);
    let l = e
        .batch_advance(l, Event::To(BatchState::Processing), None)
        .await
        .unwrap();
    e.batch_transition(
        l,
        Event::To(BatchState::Failed),
        Some("the manifest could not be read".into()),
    )
    .await
    .unwrap();
    let mut failed_jobs = Vec::new();
    for i in 0..4 {
        let l = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
        failed_jobs.push(l.job.to_string());
        e.job_transition(l, Event::Fail, Some(format!("no such file {i}")))
            .await
            .unwrap();
    }
    // The first failed job's files: a version it stored, its working folder here, its log.
    let version = s.dir.path().join("store/v1");
    std::fs::create_dir_all(version.join("producer")).unwrap();
    std::fs::write(version.join("producer/letter.txt"), "hello").unwrap();
    // The fifth job completes, having stored that version (as the Storing stage records it).
    let mut st = JobState::Pending;
    let mut done_job = None;
    while st != JobState::Completed {
        let mut l = e.acquire_job(st).await.unwrap().unwrap();
        done_job = Some(l.job.clone());
        // Its callback, recorded with its last move (delivered by nobody here).
        if st == JobState::Notify {
            l.effects.push(lading_engine::Effect {
                kind: "callback".into(),
                key: format!("{}-done", l.job),
                batch: None,
                job: Some(l.job.to_string()),
                payload: json!({"url": "http://127.0.0.1:9/done"}),
            });
        }
        let ev = match st {
            JobState::Pending => Event::To(JobState::Estimating),
            _ => Event::Success,
        };
        st = e.job_transition(l, ev, None).await.unwrap().status;
    }
    let done_job = done_job.unwrap();
    // Its delivery was given up on.
    let claim = e.claim_effect(&["callback"]).await.unwrap().ok().unwrap();
    e.effect_failed(claim, "connection refused", None)
        .await
        .unwrap();
    let record = lading_ingest::stages::StoredVersion {
        ark: "ark:/99999/fk4done".into(),
        version: 1,
        path: version.to_string_lossy().into_owned(),
        job: done_job.to_string(),
        batch: failed_bid.to_string(),
        collection: None,
        node: None,
    };
    // Its object's identifiers, and a report of its batch (as Reporting writes one).
    let ids = json!({"primary_id": "ark:/99999/fk4done", "local_id": ["letter-1"]});
    let report = json!({"last_modified": "2026-11-30T01:02:03+0000", "completed_jobs": [done_job.to_string()],
        "failed_jobs": failed_jobs.clone(), "report_number": 2, "updated_jobs": []});
    s.jobs
        .tree()
        .multi(vec![
            lading_core::Op::create(
                lading_core::layout::job_node(&done_job, "store"),
                Some(serde_json::to_vec(&record).unwrap()),
            ),
            lading_core::Op::set(
                lading_core::layout::job_node(&done_job, "identifiers"),
                Some(serde_json::to_vec(&ids).unwrap()),
                None,
            ),
            lading_core::Op::create(
                lading_core::layout::batch_node(&failed_bid, "status-report"),
                Some(serde_json::to_vec(&report).unwrap()),
            ),
        ])
        .await
        .unwrap();
    let done_job = done_job.to_string();
    // Fifty more batches, so the list has a second page.
    for _ in 0..50 {
        e.create_batch(Default::default()).await.unwrap();
    }
    let stored = lading_ingest::stages::StoredVersion {
        ark: "ark:/99999/fk4page".into(),
        version: 1,
        path: version.to_string_lossy().into_owned(),
        job: failed_jobs[0].clone(),
        batch: failed_bid.to_string(),
        collection: None,
        node: None,
    };
    s.ingest
        .inventory
        .run(move |i| i.record(&stored, None))
        .await
        .unwrap();
    let (asked, pending_bid) = around_the_jobs(s, &failed_jobs[0]).await;
    Fixtures {
        failed_bid: failed_bid.to_string(),
        intake_failed: intake_failed.to_string(),
        failed_jobs,
        done_job,
        asked,
        pending_bid,
    }
}

/// The overview's actions: a deletion asked for is cancelled (approving asks to confirm),
/// a crashed tool's lock cleared, the queue paused and resumed, an error kept until
/// dismissed, a collection held and released.
fn overview_actions(br: &mut Browser, sn: &str, dir: &std::path::Path, asked: &str) {
    // The deletion another admin asked for, with who asked: approving asks to confirm (not
    // given here), and the request is cancelled instead.
    let row = format!("[data-deletion={asked}]");
    br.wait_for(
        sn,
        &format!("document.querySelector('{row}')?.textContent.includes('curator')"),
    );
    assert_eq!(
        br.eval(
            sn,
            &format!("document.querySelector('{row} [data-deletion-state]').textContent")
        ),
        json!("asked")
    );
    br.shot(sn, dir, "2-overview");
    br.click(
        sn,
        &format!("{row} button[data-action=\"approve deletion\"]"),
    );
    br.wait_for(
        sn,
        &format!("!!document.querySelector('{row} button[data-confirm=\"approve deletion\"]')"),
    );
    br.click(
        sn,
        &format!("{row} button[data-cancel=\"approve deletion\"]"),
    );
    br.click(
        sn,
        &format!("{row} button[data-action=\"cancel deletion\"]"),
    );
    br.wait_for(sn, &format!("!document.querySelector('{row}') && document.getElementById('notice').textContent.includes('cancelled')"));
    // The lock the crashed tool left is cleared by a click.
    br.click(sn, "#foreign-locks button[data-action=clear-lock]");
    br.wait_for(sn, "document.getElementById('foreign-locks').textContent === 'none' && document.getElementById('notice').textContent.includes('cleared')");
    br.click(sn, "button[data-queue=\"ingest\"]");
    br.wait_for(
        sn,
        "document.querySelector('[data-queue-state=ingest]').textContent.includes('paused')",
    );
    br.wait_for(sn, "!document.getElementById('notice').hidden && document.getElementById('notice').textContent.includes('paused')");
    // An error stays until dismissed.
    br.click(sn, "button[data-collection-action=\"release\"]");
    br.wait_for(sn, "!document.getElementById('error').hidden");
    br.click(sn, "button[data-queue=\"ingest\"]");
    br.wait_for(
        sn,
        "document.querySelector('[data-queue-state=ingest]').textContent.includes('running')",
    );
    assert_eq!(
        br.eval(sn, "document.getElementById('error').hidden"),
        json!(false),
        "still shown"
    );
    br.click(sn, "#dismiss-error");
    // A collection held is listed, and released from the list.
    br.type_into(sn, "#collection", "letters");
    br.click(sn, "button[data-collection-action=\"hold\"]");
    br.wait_for(sn, "!!document.querySelector('#held [data-held=letters]')");
    br.click(sn, "#held button[data-release=letters]");
    br.wait_for(sn, "!document.querySelector('#held [data-held=letters]') && document.getElementById('notice').textContent.includes('released')");
}

/// The batches list (two pages, a search), then a pending batch held by a click; its
/// delete asks first.
fn batches_pages(br: &mut Browser, sn: &str, dir: &std::path::Path, fb: &str, pb: &str) {
    // Batches: search, then the batch.
    br.click(sn, "a[data-nav=batches]");
    br.wait_for(
        sn,
        &format!("!!document.querySelector('tr[data-batch=\"{fb}\"]')"),
    );
    // 53 batches: 50 on the first page, 3 on the next, and back.
    assert_eq!(
        br.eval(
            sn,
            "document.querySelectorAll('#batches tr[data-batch]').length"
        ),
        json!(50)
    );
    br.click(sn, "#batches-next");
    br.wait_for(sn, "document.getElementById('batches-page').textContent === 'page 2' && document.querySelectorAll('#batches tr[data-batch]').length === 3 && document.getElementById('batches-next').disabled");
    br.click(sn, "#batches-first");
    br.wait_for(sn, &format!("document.getElementById('batches-page').textContent === 'page 1' && !!document.querySelector('tr[data-batch=\"{fb}\"]')"));
    br.type_into(sn, "#batch-q", "letters of");
    br.click(sn, "#batch-search");
    br.wait_for(sn, &format!("document.querySelectorAll('#batches tr').length === 1 && !!document.querySelector('tr[data-batch=\"{pb}\"]')"));
    br.shot(sn, dir, "3-batches");
    br.click(sn, &format!("tr[data-batch=\"{pb}\"] a"));
    br.shows(sn, "batch", "Pending");
    // Only what a Pending batch allows.
    assert_eq!(br.buttons(sn, "#batch-actions"), "hold");
    br.click(sn, "#batch-actions button[data-action=hold]");
    br.shows(sn, "batch", "Held");
    assert_eq!(br.buttons(sn, "#batch-actions"), "release,delete");
    // Delete asks first; cancel leaves it.
    br.click(sn, "#batch-actions button[data-action=delete]");
    br.wait_for(
        sn,
        "!!document.querySelector('#batch-actions button[data-confirm=delete]')",
    );
    br.click(sn, "#batch-actions button[data-cancel=delete]");
    br.wait_for(
        sn,
        "!!document.querySelector('#batch-actions button[data-action=delete]')",
    );
    br.shot(sn, dir, "4-batch");
}

/// The first visit: the token asked for (a wrong one refused), the overview and its
/// actions, the batches list and a pending batch held by clicks. Returns the browser and
/// its page.
fn first_visit(base: &str, dir: &std::path::Path, fx: &Fixtures) -> (Browser, String) {
    let (fb, pb) = (&fx.failed_bid, &fx.pending_bid);
    let mut br = Browser::launch();
    let sn = br.page(&format!("{base}/"));
    // The token first, and no error before one was given.
    br.wait_for(&sn, "!document.getElementById('login-view').hidden");
    // Each click's target and time, for a failure's report.
    br.eval(&sn, "document.addEventListener('click', (e) => (window.__clicks = window.__clicks || []).push((e.target.dataset?.action || e.target.tagName) + '@' + Math.round(performance.now())), true)");
    assert_eq!(
        br.eval(&sn, "document.getElementById('error').hidden"),
        json!(true)
    );
    assert_eq!(
        br.eval(&sn, "document.getElementById('nav').hidden"),
        json!(true)
    );
    br.shot(&sn, dir, "1-login");
    // A wrong token is refused, and said so.
    br.type_into(&sn, "#token", "not-a-token-at-all");
    br.click(&sn, "#save-token");
    br.wait_for(&sn, "!document.getElementById('error').hidden && document.getElementById('error-text').textContent.includes('refused')");
    br.click(&sn, "#dismiss-error");
    br.wait_for(&sn, "document.getElementById('error').hidden");
    // That refusal is the one error the console may show: the 401 asked for.
    let errors = br.console_errors();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0]["params"]["entry"]["url"]
            .as_str()
            .unwrap()
            .ends_with("/api/v1/me")
    );
    br.events.clear();
    br.type_into(&sn, "#token", ADMIN);
    br.enter(&sn);
    // Overview.
    br.wait_for(
        &sn,
        "document.querySelector('[data-depth=Failed]')?.textContent === '4'",
    );
    br.wait_for(
        &sn,
        "document.getElementById('live').textContent === 'live'",
    );
    // The last hour's chart counts the four failures; the oldest failed job's age shows.
    br.wait_for(
        &sn,
        "document.getElementById('chart-failed').dataset.total === '4'",
    );
    br.wait_for(
        &sn,
        "document.getElementById('chart-completed').dataset.total === '1'",
    );
    assert_eq!(
        br.eval(
            &sn,
            "document.querySelectorAll('#chart-failed rect').length"
        ),
        json!(60)
    );
    assert_eq!(
        br.eval(
            &sn,
            "document.querySelector('[data-oldest=Held]').textContent"
        ),
        json!("–")
    );
    // A completed job's age says nothing: not shown.
    assert_eq!(
        br.eval(
            &sn,
            "document.querySelector('[data-oldest=Completed]').textContent"
        ),
        json!("")
    );
    assert_eq!(
        br.eval(
            &sn,
            "/^\\d+ s$/.test(document.querySelector('[data-oldest=Failed]').textContent)"
        ),
        json!(true)
    );
    // The copies as the fixity checker last found them: one bad.
    assert_eq!(
        br.eval(
            &sn,
            "document.querySelector('#fixity [data-fixity]').dataset.fixity"
        ),
        json!("bad")
    );
    assert_eq!(
        br.eval(
            &sn,
            "document.getElementById('fixity').textContent.startsWith('2 copies, 1 bad, 0 missing')"
        ),
        json!(true)
    );
    // Each dependency, the one down first, in red, with since when and why.
    br.wait_for(
        &sn,
        "document.querySelector('#deps tr')?.dataset.dep === 'storage-node/9501'",
    );
    assert_eq!(br.eval(&sn, "document.querySelector('[data-dep=\"storage-node/9501\"] [data-dep-state]').textContent.includes('down since') && document.querySelector('[data-dep=\"storage-node/9501\"]').textContent.includes('connection refused')"), json!(true));
    assert_eq!(
        br.eval(
            &sn,
            "document.querySelector('[data-dep=\"smtp/smtp\"] [data-dep-state]').textContent"
        ),
        json!("up")
    );
    assert_eq!(br.eval(&sn, "getComputedStyle(document.querySelector('[data-dep=\"smtp/smtp\"] td')).color === getComputedStyle(document.querySelector('[data-dep=\"storage-node/9501\"] td')).color"), json!(false));
    overview_actions(&mut br, &sn, dir, &fx.asked);
    batches_pages(&mut br, &sn, dir, fb, pb);
    (br, sn)
}

/// The jobs list from the overview's count (a hold from the list, a search, a release from
/// the job's page), generic jobs, the outbox, signing out. Returns the job held and released.
fn lists_generic_jobs_and_the_outbox(br: &mut Browser, sn: &str, dir: &std::path::Path) -> String {
    // Jobs: from the overview's count, Pending jobs offer hold only.
    br.click(sn, "a[data-nav=overview]");
    // The requeue's events come from the tree's change feed, a moment after the answer:
    // the overview re-renders when they do, so wait for it to show them before clicking.
    br.wait_for(
        sn,
        "document.querySelector('[data-depth=Pending] a')?.textContent.trim() === '3'",
    );
    br.click(sn, "[data-depth=Pending] a");
    br.wait_for(
        sn,
        "document.querySelectorAll('#jobs tr[data-job]').length === 3",
    );
    assert_eq!(br.buttons(sn, "#jobs tr[data-job]"), "hold,hold,hold");
    // Held from the list: it leaves the Pending list.
    let first = br.eval(
        sn,
        "document.querySelector('#jobs tr[data-job]').dataset.job",
    );
    br.click(sn, "#jobs tr[data-job] button[data-action=hold]");
    br.wait_for(sn, "document.getElementById('notice').textContent.includes('hold done; now Held') && document.querySelectorAll('#jobs tr[data-job]').length === 2");
    br.type_into(sn, "#job-q", "jid-no-such");
    br.click(sn, "#job-search");
    br.wait_for(
        sn,
        "document.querySelectorAll('#jobs tr[data-job]').length === 0",
    );
    br.shot(sn, dir, "6-jobs");
    // Released from its own page.
    let held = first.as_str().unwrap().to_string();
    br.view(sn, "job", &held, "Held", "release,delete");
    br.act(sn, "job", "release", "Pending");
    // Generic jobs: the type, its running job, its failed job retried.
    br.click(sn, "a[data-nav=generic]");
    br.click(sn, "button[data-open-type=thumbs]");
    br.wait_for(sn, "!!document.querySelector('#type-running tr[data-generic-job=busy]') && !!document.querySelector('#type-failed tr[data-generic-job=broken]')");
    br.shot(sn, dir, "7-generic");
    br.click(
        sn,
        "#type-failed tr[data-generic-job=broken] button[data-action=retry]",
    );
    br.notice(sn, "pending again");
    // Outbox.
    br.click(sn, "a[data-nav=outbox]");
    br.wait_for(
        sn,
        "document.getElementById('outbox-count').textContent === '(1 waiting, 1 given up)'",
    );
    assert_eq!(
        br.eval(
            sn,
            "document.querySelector('#outbox tr[data-outbox] td.state').textContent"
        ),
        json!("given up")
    );
    br.shot(sn, dir, "8-outbox");
    // Tried again by a click: due now, no longer given up.
    br.click(sn, "#outbox tr[data-outbox] button[data-action=retry]");
    br.wait_for(sn, "document.getElementById('notice').textContent.includes('due now') && document.getElementById('outbox-count').textContent === '(1 waiting, 0 given up)'");
    // Signing out asks for the token again.
    br.click(sn, "a[data-nav=logout]");
    br.wait_for(sn, "!document.getElementById('login-view').hidden");
    held
}

/// The second visit, on the page left open: batch and job actions, deep links, a failed
/// job's page, lists, generic jobs, the outbox, signing out. Returns the job held and
/// released by clicks.
fn second_visit(br: &mut Browser, sn: &str, dir: &std::path::Path, fx: &Fixtures) -> String {
    let (fb, fj, done, intake_failed) = (
        &fx.failed_bid,
        &fx.failed_jobs,
        &fx.done_job,
        &fx.intake_failed,
    );
    br.shows(sn, "batch", "Pending");
    // Held, released and held again by clicks, then deleted once confirmed.
    for (action, state) in [("hold", "Held"), ("release", "Pending"), ("hold", "Held")] {
        br.click(sn, &format!("#batch-actions button[data-action={action}]"));
        br.wait_for(sn, &format!("document.getElementById('batch-title').dataset.state === '{state}' && document.getElementById('notice').textContent.includes('{action} done')"));
    }
    br.click(sn, "#batch-actions button[data-action=delete]");
    br.click(sn, "#batch-actions button[data-confirm=delete]");
    br.shows(sn, "batch", "Deleted");
    br.notice(sn, "delete done");
    assert_eq!(
        br.eval(sn, "document.getElementById('batch-actions').textContent"),
        json!("no action applies to a Deleted batch")
    );
    // The batch whose jobs all failed (Reporting, no reporter runs here): a failed job's
    // page, its delete (confirmed), then retry of the rest.
    // Deep links: a record's address under its list's opens it directly.
    br.open(sn, &format!("#/batches/{fb}"));
    br.shows(sn, "batch", "Reporting");
    // Its jobs with their objects' ARKs and local ids, and its report as a table.
    br.wait_for(sn, &format!("document.querySelectorAll('#batch-job-rows tr[data-batch-job]').length === 5 && document.querySelector('#batch-job-rows tr[data-batch-job=\"{done}\"] td[data-ark]')?.textContent === 'ark:/99999/fk4done'"));
    assert_eq!(br.eval(sn, &format!("document.querySelector('#batch-job-rows tr[data-batch-job=\"{done}\"]').textContent")), json!(format!("{done}Completedark:/99999/fk4doneletter-1")));
    assert_eq!(br.eval(sn, "[...document.querySelectorAll('#batch-report tr')].map(r => r.dataset.report + '=' + r.querySelector('td').textContent.split(' ')[0]).join()"),
        json!("report=2,written=2026-11-30T01:02:03+0000,completed=1,failed=4,fixed since the last report=0"));
    assert_eq!(
        br.eval(
            sn,
            "document.querySelectorAll('#batch-report tr[data-report=failed] a').length"
        ),
        json!(4)
    );
    br.click(sn, &format!("a[data-job-link=\"{}\"]", fj[0]));
    br.shows(sn, "job", "Failed");
    assert_eq!(br.buttons(sn, "#job-actions"), "requeue,delete");
    // Its history: made, taken, failed.
    assert_eq!(br.eval(sn, "[...document.querySelectorAll('#job-history tr')].map(r => r.dataset.history).join(',')"), json!("Pending,Failed"));
    // Red only for the failure.
    assert_eq!(br.eval(sn, "[...document.querySelectorAll('#job-history tr')].map(r => r.dataset.history + ':' + r.querySelector('td.msg').classList.contains('fail')).join()"), json!("Pending:false,Failed:true"));
    // What it stored (with digests), its working files and its log's last lines.
    br.wait_for(
        sn,
        "!!document.querySelector('#job-stored tr[data-stored-file=\"producer/letter.txt\"]')",
    );
    assert_eq!(br.eval(sn, "document.querySelector('#job-stored tr[data-stored-file=\"producer/letter.txt\"] td.sha').textContent"),
        json!("2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"));
    // Its copies: good in the storage root, bad on node 9502.
    assert_eq!(br.eval(sn, "[...document.querySelectorAll('#job-stored tr[data-copy]')].map(r => r.dataset.copy + '=' + r.dataset.copyState).join()"), json!("1@0=good,1@9502=bad"));
    assert_eq!(br.eval(sn, "[...document.getElementById('job-working').querySelectorAll('tr')].map(r => r.dataset.workingFile).join()"), json!("producer/scan.tif"));
    assert_eq!(
        br.eval(
            sn,
            "document.getElementById('job-log').textContent.split('\\n').length"
        ),
        json!(50)
    );
    assert_eq!(
        br.eval(
            sn,
            "document.getElementById('job-log').textContent.endsWith('download line 60')"
        ),
        json!(true)
    );
    br.shot(sn, dir, "5-job");
    br.click(sn, "#job-actions button[data-action=delete]");
    br.click(sn, "#job-actions button[data-confirm=delete]");
    br.shows(sn, "job", "Deleted");
    br.notice(sn, "delete done");
    // Another failed job requeued from its own page.
    br.open(sn, &format!("#/jobs/{}", fj[3]));
    br.wait_for(
        sn,
        &format!(
            "document.getElementById('job-title').textContent.includes('{}')",
            fj[3]
        ),
    );
    br.act(sn, "job", "requeue", "Pending");
    br.click(sn, "dd[data-field=batch] a");
    br.wait_for(
        sn,
        "!!document.querySelector('#batch-actions button[data-action=\"retry failed jobs\"]')",
    );
    br.click(
        sn,
        "#batch-actions button[data-action=\"retry failed jobs\"]",
    );
    br.notice(sn, "2 failed jobs requeued");
    // The completed job's stored version is downloaded by a click.
    br.view(
        sn,
        "job",
        done,
        "Completed",
        "delete,download the stored version",
    );
    br.click(sn, "#job-actions button[data-action=download]");
    br.wait_for(
        sn,
        &format!(
            "document.getElementById('notice').textContent.includes('Download of {done} started')"
        ),
    );
    // A failed batch's report made again, by a click.
    br.view(
        sn,
        "batch",
        intake_failed,
        "Failed",
        "update-reporting,delete",
    );
    br.act(sn, "batch", "update-reporting", "UpdateReporting");
    lists_generic_jobs_and_the_outbox(br, sn, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_asks_for_a_token_then_every_page_and_action_works_by_clicks() {
    let s = start().await;
    let fx = console_fixtures(&s).await;

    // The page is served without a token; the data it shows needs one.
    let page = s.http.get(format!("{}/", s.base)).send().await.unwrap();
    assert_eq!(page.status(), reqwest::StatusCode::OK);
    assert!(page.text().await.unwrap().contains("<title>Lading</title>"));

    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let (base, dir, f) = (s.base.clone(), shots.clone(), fx.clone());
    let (mut br, sn) = tokio::task::spawn_blocking(move || first_visit(&base, &dir, &f))
        .await
        .unwrap();
    let pending_bid = &fx.pending_bid;
    let (_, v) = s
        .get(ADMIN, &format!("/api/v1/batches/{pending_bid}"))
        .await;
    assert_eq!(v["status"]["status"], "Held", "the click held the batch");
    let (_, v) = s.get(ADMIN, "/api/v1/status").await;
    assert_eq!(
        v["paused_queues"],
        json!([]),
        "paused, then resumed by clicks"
    );
    // A change made elsewhere reaches the open page by itself.
    s.call(
        ADMIN,
        "POST",
        &format!("/api/v1/batches/{pending_bid}/release"),
        None,
    )
    .await;
    let (dir, f) = (shots.clone(), fx.clone());
    let (br, held) = tokio::task::spawn_blocking(move || {
        let held = second_visit(&mut br, &sn, &dir, &f);
        (br, held)
    })
    .await
    .unwrap();
    let errors = br.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:#?}");
    for name in [
        "1-login",
        "2-overview",
        "3-batches",
        "4-batch",
        "5-job",
        "6-jobs",
        "7-generic",
        "8-outbox",
    ] {
        assert!(
            shots.join(format!("{name}.png")).metadata().unwrap().len() > 1000,
            "{name}"
        );
    }
    println!("console screenshots: {}", shots.display());
    let jobs: Vec<String> = fx.failed_jobs.clone();
    let (_, j0) = s.get(ADMIN, &format!("/api/v1/jobs/{}", jobs[0])).await;
    assert_eq!(j0["status"]["status"], "Deleted");
    for j in &jobs[1..] {
        let (_, v) = s.get(ADMIN, &format!("/api/v1/jobs/{j}")).await;
        assert_eq!(v["status"]["status"], "Pending", "{j}: retried by clicks");
    }
    // The one held and released by clicks says so in its history.
    let (_, h) = s.get(ADMIN, &format!("/api/v1/jobs/{held}/history")).await;
    let tos: Vec<&str> = h["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["to"].as_str().unwrap_or(""))
        .collect();
    assert!(tos.ends_with(&["Held", "Pending"]), "{h}");
    let (_, v) = s.get(ADMIN, "/api/v1/status").await;
    assert_eq!(v["foreign_locks"], json!([]), "cleared by the click");
    let (_, g) = s.get(ADMIN, "/api/v1/types/thumbs/jobs/broken").await;
    assert_eq!(g["state"], "pending");
}

/// The processes page: this server (its `Node` announced it), a worker on a session of its
/// own running a job (announced as `lading worker` does), and one whose session ended, shown
/// gone with the job it ran; the overview counts them; `#/processes` opens directly. The
/// stage metrics: a stage's last hour on the overview, its page with its charts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_processes_and_stage_pages_show_each_process_and_stage() {
    use lading_store_sqlite::{SqliteOptions, SqliteTree};
    let s = start().await;
    let (_, jobs) = lading_store_tests::batch_with_jobs(&s.ingest.engine, 2, &[]).await;
    let clock = lading_core::time::system_clock();
    let session = || {
        let db = s.dir.path().join("lading.db");
        Arc::new(SqliteTree::open(db, SqliteOptions::default()).unwrap())
    };
    let record = |pid: u32, stages: &[(&str, usize)]| lading_engine::processes::ProcessRecord {
        host: "worker-host".into(),
        pid,
        version: "0.2.0 (commit test)".into(),
        roles: vec!["worker".into()],
        stages: stages.iter().map(|(n, c)| (n.to_string(), *c)).collect(),
        started_at_ms: clock.now_ms(),
        heard_at_ms: clock.now_ms(),
        running: Vec::new(),
        stopped_at_ms: None,
    };
    // A worker alive, running the first job in Downloading.
    let (alive_tree, stats) = (session(), Arc::new(lading_worker::Stats::default()));
    let (stop, sd) = lading_worker::Shutdown::new();
    let rec = record(4242, &[("downloading", 4)]);
    let announcing = tokio::spawn(lading_worker::announce::announce(
        alive_tree.clone(),
        clock.clone(),
        rec,
        stats.clone(),
        sd,
    ));
    let running = stats.running("job", jobs[0].as_str(), "Downloading", clock.now_ms());
    // A worker that ran the second job in Storing when its session ended.
    let gone_tree = session();
    let mut rec = record(4343, &[("storing", 2)]);
    rec.running = vec![lading_engine::processes::RunningWork {
        kind: "job".into(),
        id: jobs[1].to_string(),
        stage: "Storing".into(),
        since_ms: clock.now_ms(),
    }];
    lading_engine::processes::announce(gone_tree.as_ref(), &rec)
        .await
        .unwrap();
    lading_core::Tree::close(gone_tree.as_ref()).await.unwrap();
    // Downloading's runs this minute, as a worker's flusher adds them: 3 moved on, one
    // failed, 4 jobs seen in the stage.
    let mut counts = lading_engine::stage_metrics::MinuteCounts {
        done: 3,
        failed: 1,
        depth: Some(4),
        ..Default::default()
    };
    for ms in [20, 30, 40, 2_000] {
        counts.add_time(ms);
    }
    let now = clock.now_ms();
    lading_engine::stage_metrics::add(
        s.jobs.tree().as_ref(),
        "Downloading",
        [(now - now % 60_000, counts)].into(),
        now,
    )
    .await
    .unwrap();
    let base = s.base.clone();
    let (j0, j1) = (jobs[0].to_string(), jobs[1].to_string());
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let br = tokio::task::spawn_blocking(move || {
        let mut br = Browser::launch();
        let sn = br.page(&format!("{base}/#token={ADMIN}"));
        br.wait_for(&sn, "document.querySelector('[data-processes-alive]')?.dataset.processesAlive === '2'");
        assert_eq!(br.eval(&sn, "document.getElementById('processes-summary').textContent.includes('1 gone')"), json!(true));
        // The stage's last hour on the overview, and its own page with its charts.
        br.wait_for(&sn, "document.querySelector('#stages tr[data-stage=Downloading] [data-stage-done]')?.textContent === '3'");
        assert_eq!(br.eval(&sn, "document.querySelector('#stages tr[data-stage=Downloading]').textContent"), json!("Downloading310≤ 50 ms≤ 2.5 s4"));
        br.click(&sn, "#stages tr[data-stage=Downloading] a");
        br.wait_for(&sn, "document.getElementById('stage-done').dataset.total === '3'");
        assert_eq!(br.eval(&sn, "[document.getElementById('stage-failed').dataset.total, document.getElementById('stage-depth').dataset.total, document.getElementById('stage-day-done').dataset.total, document.querySelectorAll('#stage-day-done rect').length]"), json!(["1", "4", "3", 24]));
        br.shot(&sn, &dir, "10-stage");
        // A stage's address opens it directly; one that never ran says so.
        br.open(&sn, "#/stages/Storing");
        br.wait_for(&sn, "document.getElementById('stage-summary').textContent === 'No run of Storing in the last day.'");
        br.open(&sn, "#/processes");
        br.wait_for(&sn, &format!("!!document.querySelector('#processes tr[data-alive=true] a[data-running=\"{j0}\"]')"));
        // Alive first (by host: this machine's name and the worker's, in either order), the
        // gone last, in red.
        assert_eq!(br.eval(&sn, "(r => r.slice(0, 2).sort().concat(r.slice(2)).join())([...document.querySelectorAll('#processes tr[data-process]')].map(r => r.dataset.alive + ':' + r.querySelector('[data-roles]').dataset.roles))"),
            json!("true:serve,true:worker,false:worker"));
        assert_eq!(br.eval(&sn, "document.getElementById('processes-count').textContent"), json!("(2 alive, 1 gone)"));
        let gone = "document.querySelector('#processes tr[data-alive=false]')";
        assert_eq!(br.eval(&sn, &format!("{gone}.textContent.includes('gone: its session ended') && {gone}.textContent.includes('was running: {j1} Storing')")), json!(true));
        assert_eq!(br.eval(&sn, &format!("{gone}.classList.contains('down')")), json!(true));
        assert_eq!(br.eval(&sn, "document.querySelector('#processes tr[data-alive=true] [data-process-running=\"1\"]').textContent.includes('Downloading')"), json!(true));
        br.shot(&sn, &dir, "9-processes");
        // Its running job's link opens the job.
        br.click(&sn, &format!("a[data-running=\"{j0}\"]"));
        br.wait_for(&sn, &format!("document.getElementById('job-title').textContent.includes('{j0}')"));
        br
    })
    .await
    .unwrap();
    let errors = br.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:#?}");
    drop(running);
    stop.stop();
    announcing.await.unwrap();
    // Stopped: said so in its record, no longer alive.
    let (_, list) = s.get(ADMIN, "/api/v1/processes").await;
    let worker = list
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == 4242)
        .unwrap();
    assert_eq!(worker["alive"], false, "{worker}");
    assert!(worker["stopped_at_ms"].as_u64().is_some(), "{worker}");
    assert_eq!(worker["running"], json!([]), "{worker}");
}

/// Finding and acting in bulk: deposits whose files were missing fail at Downloading; the
/// jobs page's filters (in its address) select those of one collection, shows their count,
/// and a bulk requeue that asks first (showing how many jobs it will touch) sends them back,
/// its progress and outcome on the audit page; once the files exist they complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_jobs_are_filtered_and_requeued_in_bulk_after_a_confirmation() {
    let root = tempfile::tempdir().unwrap();
    let files = lading_testkit::payload_server::PayloadServer::start(root.path())
        .await
        .unwrap();
    let s = start_working_allowing(&[&files.url("")]).await;
    let profiles = s.ingest.cfg.profiles_dir();
    std::fs::write(profiles.join("maps.toml"), "collection = \"maps\"\n").unwrap();
    // Three deposits to `demo` and one to `maps`, each of a file not there yet: each fails.
    let mut bids = Vec::new();
    for (name, profile) in [
        ("a.txt", "demo"),
        ("b.txt", "demo"),
        ("c.txt", "demo"),
        ("m.txt", "maps"),
    ] {
        let (st, v) = s
            .post(
                ADMIN,
                "/api/v1/batches",
                json!({"payload_url": files.url(name), "profile": profile}),
            )
            .await;
        assert_eq!(st, reqwest::StatusCode::CREATED, "{v}");
        bids.push(v["id"].as_str().unwrap().to_string());
    }
    for bid in &bids {
        let ended =
            |v: &Value| v["status"]["status"] == "Failed" || v["status"]["status"] == "Completed";
        s.api
            .until_batch(ADMIN, bid, Duration::from_secs(60), ended)
            .await;
    }
    let base = s.base.clone();
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let br = tokio::task::spawn_blocking(move || {
        let mut br = Browser::launch();
        // A filtered list's address opens it directly, its inputs filled in.
        let sn = br.page(&format!("{base}/#token={ADMIN}"));
        br.wait_for(&sn, "!!document.querySelector('[data-depth=Failed]')");
        br.open(&sn, "#/jobs/Failed?collection=demo");
        br.wait_for(&sn, "document.getElementById('jobs-count').dataset.matched === '3' && document.querySelectorAll('#jobs tr[data-job]').length === 3");
        assert_eq!(br.eval(&sn, "document.querySelector('[data-filter=collection]').value"), json!("demo"));
        // Narrowed by message, typed in and searched: the address follows.
        br.type_into(&sn, "[data-filter=message]", "404");
        br.click(&sn, "#job-search");
        br.wait_for(&sn, "location.hash === '#/jobs/Failed?collection=demo&message=404'");
        br.wait_for(&sn, "document.getElementById('jobs-count').textContent === '3 Failed jobs match'");
        br.shot(&sn, &dir, "11-jobs-filtered");
        // The bulk requeue asks first, naming the count; cancel leaves everything.
        assert_eq!(br.buttons(&sn, "#bulk"), "requeue all 3,delete all 3");
        br.click(&sn, "#bulk button[data-bulk=requeue]");
        br.wait_for(&sn, "document.querySelector('#bulk button[data-bulk-confirm=requeue]')?.textContent === 'confirm requeue of 3 jobs'");
        br.click(&sn, "#bulk button[data-bulk-cancel=requeue]");
        (br, sn)
    })
    .await
    .unwrap();
    // The files are there now: what is requeued completes.
    for name in ["a.txt", "b.txt", "c.txt"] {
        std::fs::write(root.path().join(name), name).unwrap();
    }
    let (mut br, sn) = br;
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    let br = tokio::task::spawn_blocking(move || {
        br.click(&sn, "#bulk button[data-bulk=requeue]");
        br.click(&sn, "#bulk button[data-bulk-confirm=requeue]");
        // Its outcome on the audit page.
        br.wait_for(&sn, "location.hash === '#/audit' && document.querySelector('#audit tr[data-op]')?.dataset.opState === 'finished'");
        assert_eq!(br.eval(&sn, "document.querySelector('#audit tr[data-op] [data-op-done]').textContent"), json!("3"));
        assert_eq!(br.eval(&sn, "document.querySelector('#audit tr[data-op] td.filter').textContent"), json!("state=Failed collection=demo message=404"));
        br.shot(&sn, &dir, "12-audit");
        // They complete: the overview counts them, live.
        br.click(&sn, "a[data-nav=overview]");
        br.wait_for(&sn, "document.querySelector('[data-depth=Completed]')?.textContent === '3' && document.querySelector('[data-depth=Failed]')?.textContent === '1'");
        br
    })
    .await
    .unwrap();
    let errors = br.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:#?}");
    let mut states = Vec::new();
    for bid in &bids {
        let (_, v) = s.get(ADMIN, &format!("/api/v1/batches/{bid}/jobs")).await;
        states.push(v["jobs"][0]["state"].as_str().unwrap().to_string());
    }
    assert_eq!(states, ["Completed", "Completed", "Completed", "Failed"]);
}

/// A depositor's own console: a submitter token signs in to its deposits (not another
/// tenant's), no admin control shown; submits a file from the page, follows its batch to
/// Completed, reads what was stored (with its digest), downloads it, and asks for it through
/// the access queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submitter_submits_from_its_own_console_and_follows_the_deposit() {
    let s = start_working().await;
    // Bob's batch: Alice must not see it.
    let (st, v) = s
        .post(
            BOB,
            "/api/v1/batches",
            json!({"payload_url": "http://127.0.0.1:9/x", "profile": "demo"}),
        )
        .await;
    assert_eq!(st, reqwest::StatusCode::CREATED, "{v}");
    let bobs = v["id"].as_str().unwrap().to_string();
    let letter = s.dir.path().join("letter.txt");
    std::fs::write(&letter, "Dear Alice,\n").unwrap();
    let (base, dir) = (
        s.base.clone(),
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots"),
    );
    std::fs::create_dir_all(&dir).unwrap();
    let br = tokio::task::spawn_blocking(move || {
        let mut br = Browser::launch();
        let sn = br.page(&format!("{base}/"));
        br.wait_for(&sn, "!document.getElementById('login-view').hidden");
        br.type_into(&sn, "#token", SUBMITTER);
        br.enter(&sn);
        // Its deposits, and only the pages a depositor has.
        br.wait_for(&sn, "location.hash === '#/batches' && document.getElementById('whoami').textContent === 'alice (submitter)'");
        assert_eq!(br.eval(&sn, "[...document.querySelectorAll('#nav a')].filter(a => a.offsetParent !== null).map(a => a.textContent).join()"), json!("My deposits,Submit,Sign out"));
        // An admin page's address leads to its deposits instead.
        br.open(&sn, "#/overview");
        br.wait_for(&sn, "!document.getElementById('batches-view').hidden && document.getElementById('overview-view').hidden");
        // The form: its collections' profiles, a file, a title.
        br.click(&sn, "a[data-nav=submit]");
        br.wait_for(&sn, "!document.getElementById('submit-view').hidden");
        assert_eq!(br.eval(&sn, "[...document.querySelectorAll('#submit-profile option')].map(o => o.value).join()"), json!("demo"));
        let doc = br.call(Some(&sn), "DOM.getDocument", json!({}));
        let input = br.call(Some(&sn), "DOM.querySelector", json!({"nodeId": doc["root"]["nodeId"], "selector": "#submit-file"}));
        br.call(Some(&sn), "DOM.setFileInputFiles", json!({"nodeId": input["nodeId"], "files": [letter.to_str().unwrap()]}));
        br.type_into(&sn, "#submit-title", "A letter");
        br.click(&sn, "#submit-go");
        // Its batch, followed to Completed live; no admin action on it.
        br.wait_for(&sn, "/^#\\/batches\\/bid\\d+$/.test(location.hash)");
        let bid = br.eval(&sn, "location.hash.slice('#/batches/'.length)").as_str().unwrap().to_string();
        br.shows(&sn, "batch", "Completed");
        assert_eq!(br.eval(&sn, "document.getElementById('batch-actions').textContent"), json!(""));
        br.shot(&sn, &dir, "13-deposit");
        // Its job: what was stored, with its digest; downloaded, and asked for again as a zip.
        br.click(&sn, "#batch-job-rows tr[data-batch-job] a");
        br.shows(&sn, "job", "Completed");
        br.wait_for(&sn, "!!document.querySelector('#job-stored tr[data-stored-file]')");
        assert_eq!(br.eval(&sn, "document.querySelector('#job-stored tr[data-stored-file$=\"letter.txt\"] td.sha')?.textContent"),
            json!("7fc63ac44812a31fbfd67c833916c38c992fc77d34653c118fe7b6f43cff5b4d"));
        assert_eq!(br.eval(&sn, "getComputedStyle(document.getElementById('job-log')).display === 'none' || document.getElementById('job-log').offsetParent === null"), json!(true));
        br.click(&sn, "#job-actions button[data-action=download]");
        br.notice(&sn, "started");
        br.click(&sn, "#job-actions button[data-action=access]");
        br.wait_for(&sn, "!!document.querySelector('#job-access [data-access-state], #job-access button[data-action=access-file]')");
        br.shot(&sn, &dir, "14-deposit-job");
        // Its list: its own batch, not Bob's.
        br.click(&sn, "a[data-nav=batches]");
        br.wait_for(&sn, &format!("!!document.querySelector('tr[data-batch=\"{bid}\"]')"));
        assert_eq!(br.eval(&sn, "document.querySelectorAll('#batches tr[data-batch]').length"), json!(1));
        (br, bid)
    })
    .await
    .unwrap();
    let (br, bid) = br;
    let errors = br.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:#?}");
    assert_ne!(bid, bobs);
    // What the page downloaded is the letter.
    let (_, b) = s.get(SUBMITTER, &format!("/api/v1/batches/{bid}")).await;
    let job = b["jobs"]["batch-completed"][0]
        .as_str()
        .unwrap()
        .to_string();
    let r = s
        .http
        .get(format!("{}/api/v1/jobs/{job}/download", s.base))
        .bearer_auth(SUBMITTER)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    let zip = r.bytes().await.unwrap();
    let z = zip::ZipArchive::new(std::io::Cursor::new(zip.to_vec())).unwrap();
    let names: Vec<String> = z
        .file_names()
        .filter_map(|n| n.ok().map(|n| n.to_string()))
        .collect();
    assert!(names.iter().any(|n| n.ends_with("letter.txt")), "{names:?}");
}
