//! The admin page in a real headless browser (Debian's `chromium`, driven over the DevTools
//! protocol on a pipe): it loads, shows the batch, a real mouse click on a button performs the
//! admin action, and the page updates itself from the event stream.

mod common;

use common::*;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A headless Chromium and its DevTools pipe (commands on its fd 3, replies on its fd 4).
struct Browser {
    child: Child,
    to: std::fs::File,
    from: BufReader<std::fs::File>,
    next: u64,
    _profile: tempfile::TempDir,
}

fn pipe() -> (RawFd, RawFd) {
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    (fds[0], fds[1])
}

impl Browser {
    fn launch() -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let (cmd_r, cmd_w) = pipe();
        let (resp_r, resp_w) = pipe();
        let mut cmd = Command::new("chromium");
        cmd.args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--remote-debugging-pipe",
            "--window-size=1280,2000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        unsafe {
            cmd.pre_exec(move || {
                // Out of the way first, so neither lands on 3 or 4 before it is copied there.
                let a = libc::fcntl(cmd_r, libc::F_DUPFD, 10);
                let b = libc::fcntl(resp_w, libc::F_DUPFD, 10);
                if a < 0 || b < 0 || libc::dup2(a, 3) < 0 || libc::dup2(b, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .expect("chromium is installed (.ci/run installs Debian's chromium)");
        unsafe {
            libc::close(cmd_r);
            libc::close(resp_w);
        }
        Browser {
            child,
            to: unsafe { std::fs::File::from_raw_fd(cmd_w) },
            from: BufReader::new(unsafe { std::fs::File::from_raw_fd(resp_r) }),
            next: 1,
            _profile: profile,
        }
    }

    /// Sends one command and returns its result (events in between are skipped).
    fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap();
        loop {
            let mut buf = Vec::new();
            let n = self.from.read_until(0, &mut buf).unwrap();
            assert!(n > 0, "the browser closed its pipe");
            buf.pop();
            let v: Value = serde_json::from_slice(&buf).unwrap();
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// Evaluates `js` in the page and returns its value.
    fn eval(&mut self, session: &str, js: &str) -> Value {
        let r = self.call(
            Some(session),
            "Runtime.evaluate",
            json!({"expression": js, "returnByValue": true}),
        );
        r["result"]["value"].clone()
    }

    /// Waits until `js` is true in the page.
    fn wait_for(&mut self, session: &str, js: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.eval(session, js) != json!(true) {
            assert!(
                Instant::now() < deadline,
                "page never satisfied {js}; error line: {}",
                self.eval(session, "document.getElementById('error').textContent")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A real mouse click in the middle of the element `selector`.
    fn click(&mut self, session: &str, selector: &str) {
        let js = format!(
            "(() => {{ const e = document.querySelector({sel}); e.scrollIntoView({{block: 'center'}});
               const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()",
            sel = json!(selector)
        );
        let at = self.eval(session, &js);
        let (x, y) = (at[0].as_f64().unwrap(), at[1].as_f64().unwrap());
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                Some(session),
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}),
            );
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_page_performs_a_clicked_action_and_updates_live() {
    let s = start().await;
    let (_, v) = s
        .call_as(
            SUBMITTER,
            "POST",
            "/api/v1/batches",
            Some(json!({"payload_url": "http://127.0.0.1:9/x", "profile": "demo"})),
        )
        .await;
    let bid = v["id"].as_str().unwrap().to_string();
    // The page is served without a token; the data it shows needs one.
    let page = s.http.get(format!("{}/", s.base)).send().await.unwrap();
    assert_eq!(page.status(), reqwest::StatusCode::OK);
    assert!(page.text().await.unwrap().contains("<title>Lading</title>"));

    let url = format!("{}/#token={ADMIN}", s.base);
    let b = bid.clone();
    let browser = tokio::task::spawn_blocking(move || {
        let mut br = Browser::launch();
        let target = br.call(None, "Target.createTarget", json!({"url": "about:blank"}));
        let attached = br.call(
            None,
            "Target.attachToTarget",
            json!({"targetId": target["targetId"], "flatten": true}),
        );
        let session = attached["sessionId"].as_str().unwrap().to_string();
        br.call(Some(&session), "Page.navigate", json!({"url": url}));
        let row = format!("tr[data-batch=\"{b}\"]");
        br.wait_for(
            &session,
            &format!("document.querySelector('{row} .state')?.textContent === 'Pending'"),
        );
        br.wait_for(
            &session,
            "document.getElementById('live').textContent === 'live'",
        );
        // The outbox section reads its own endpoint; the failure-kind filter shows only
        // for Failed jobs.
        br.wait_for(
            &session,
            "document.getElementById('outbox-count').textContent === '(empty)' && document.getElementById('failure-kind').hidden",
        );
        br.click(&session, &format!("{row} button[data-action=\"hold\"]"));
        // The page shows the change by itself (the event stream), no reload.
        br.wait_for(
            &session,
            &format!("document.querySelector('{row} .state')?.textContent === 'Held'"),
        );
        br.click(&session, "button[data-queue=\"ingest\"]");
        br.wait_for(
            &session,
            "document.getElementById('queues').textContent.includes('ingest (paused)')",
        );
        (br, session)
    })
    .await
    .unwrap();
    let (_, v) = s.call("GET", &format!("/api/v1/batches/{bid}"), None).await;
    assert_eq!(v["status"]["status"], "Held", "the click held the batch");
    let (_, v) = s.call("GET", "/api/v1/status", None).await;
    assert_eq!(
        v["paused_queues"],
        json!(["ingest"]),
        "the click paused the queue"
    );
    // A change made elsewhere (here, through the API) reaches the open page by itself.
    s.call("POST", &format!("/api/v1/batches/{bid}/release"), None)
        .await;
    let (mut br, session) = browser;
    tokio::task::spawn_blocking(move || {
        br.wait_for(
            &session,
            &format!(
                "document.querySelector('tr[data-batch=\"{bid}\"] .state')?.textContent === 'Pending'"
            ),
        );
    })
    .await
    .unwrap();
}
