//! The console's pages for processes and stage metrics, bulk actions and a depositor's own
//! deposits, in a real headless browser (Debian's `chromium`, driven over the DevTools
//! protocol on a pipe). The admin's walk through every page by clicks is `console_clicks.rs`.

mod common;

use common::*;
use lading_testkit::browser::Browser;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

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
