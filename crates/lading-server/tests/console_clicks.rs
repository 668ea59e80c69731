//! The console in a real headless browser (Debian's `chromium`, driven over the DevTools
//! protocol on a pipe), visited as an admin does: it asks for the token first, then every
//! page is visited and every kind of action performed with real mouse clicks and typing; the
//! page updates itself from the event stream; any error in the browser's console fails the
//! test; a screenshot of each page is written under the test's temporary folder (its path is
//! printed). The other pages' tests are in `web_page.rs`.

mod common;

use common::*;
use lading_testkit::browser::Browser;
use serde_json::json;

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
                kind: lading_engine::EffectKind::Callback,
                key: format!("{}-done", l.job),
                batch: None,
                job: Some(l.job.clone()),
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
    let claim = e
        .claim_effect(&[lading_engine::EffectKind::Callback])
        .await
        .unwrap()
        .ok()
        .unwrap();
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
