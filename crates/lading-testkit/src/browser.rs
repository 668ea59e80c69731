//! A headless Chromium (Debian's `chromium`) driven over the DevTools protocol on a pipe,
//! for the console's tests: pages, clicks and typing as a user makes them, waits on the
//! page's own state, screenshots, and the errors its console reported.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A headless Chromium and its DevTools pipe (commands on its fd 3, replies on its fd 4).
pub struct Browser {
    child: Child,
    to: std::fs::File,
    from: BufReader<std::fs::File>,
    next: u64,
    /// Events the browser sent while a command was awaited.
    pub events: Vec<Value>,
    _profile: tempfile::TempDir,
}

fn pipe() -> (RawFd, RawFd) {
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    (fds[0], fds[1])
}

impl Browser {
    pub fn launch() -> Browser {
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
            events: Vec::new(),
            _profile: profile,
        }
    }

    /// Sends one command and returns its result (events in between are skipped).
    pub fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
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
            if v.get("method").is_some() {
                self.events.push(v);
            }
        }
    }

    /// Evaluates `js` in the page and returns its value.
    pub fn eval(&mut self, session: &str, js: &str) -> Value {
        let r = self.call(
            Some(session),
            "Runtime.evaluate",
            json!({"expression": js, "returnByValue": true}),
        );
        r["result"]["value"].clone()
    }

    /// The texts of the buttons under `container`, joined by commas.
    pub fn buttons(&mut self, session: &str, container: &str) -> String {
        let js = format!(
            "[...document.querySelectorAll('{container} button')].map(b => b.textContent).join(',')"
        );
        self.eval(session, &js)
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Opens a view of the page by its hash (`#/job/jid…`).
    /// A new page at `url`, with its runtime, log and page events on: its session.
    pub fn page(&mut self, url: &str) -> String {
        let target = self.call(None, "Target.createTarget", json!({"url": "about:blank"}));
        let attached = self.call(
            None,
            "Target.attachToTarget",
            json!({"targetId": target["targetId"], "flatten": true}),
        );
        let sn = attached["sessionId"].as_str().unwrap().to_string();
        for domain in ["Runtime.enable", "Log.enable", "Page.enable"] {
            self.call(Some(&sn), domain, json!({}));
        }
        self.call(Some(&sn), "Page.navigate", json!({"url": url}));
        sn
    }

    pub fn open(&mut self, session: &str, hash: &str) {
        self.eval(session, &format!("location.hash = '{hash}'"));
    }

    /// Waits until the page shows the `record` (`job`, `batch`) in `state`.
    pub fn shows(&mut self, session: &str, record: &str, state: &str) {
        let js = format!("document.getElementById('{record}-title').dataset.state === '{state}'");
        self.wait_for(session, &js);
    }

    /// Opens the view of `record` `id` (`job`, `batch`), waits for it in `state`, and checks
    /// its action buttons are `buttons` (their texts, joined by commas).
    pub fn view(&mut self, session: &str, record: &str, id: &str, state: &str, buttons: &str) {
        self.open(session, &format!("#/{record}/{id}"));
        self.shows(session, record, state);
        assert_eq!(
            self.buttons(session, &format!("#{record}-actions")),
            buttons
        );
    }

    /// On the open `record` view (`job`, `batch`), clicks the `action` button, then waits for
    /// the record in `state` and the notice saying the action was done.
    pub fn act(&mut self, session: &str, record: &str, action: &str, state: &str) {
        self.click(
            session,
            &format!("#{record}-actions button[data-action={action}]"),
        );
        self.shows(session, record, state);
        self.notice(session, &format!("{action} done"));
    }

    /// Waits until the page's notice says `text`.
    pub fn notice(&mut self, session: &str, text: &str) {
        let js = format!("document.getElementById('notice').textContent.includes('{text}')");
        self.wait_for(session, &js);
    }

    /// Waits until `js` is true in the page.
    pub fn wait_for(&mut self, session: &str, js: &str) {
        // A condition inside the browser's page has no signal to wait on.
        let met = crate::poll::within_blocking(Duration::from_secs(30), || {
            (self.eval(session, js) == json!(true)).then_some(())
        });
        if met.is_none() {
            panic!(
                "page never satisfied {js}; the page: {}",
                self.eval(session, "location.hash + ' | rendered ' + document.body.dataset.rendered + ' | busy ' + document.body.dataset.busy + ' | clicks ' + JSON.stringify(window.__clicks || []) + ' | fetched ' + performance.getEntriesByType('resource').slice(-6).map((e) => e.name.replace(location.origin, '') + ' ' + Math.round(e.startTime) + '+' + Math.round(e.duration)).join(', ') + ' | now ' + Math.round(performance.now()) + ' | error ' + (document.getElementById('error').hidden ? '(hidden) ' : '') + document.getElementById('error-text').textContent + ' | ' + document.querySelector('main').innerText.slice(0, 300)")
            );
        }
    }

    /// Errors the page's console reported (exceptions, `console.error`, failed loads).
    pub fn console_errors(&self) -> Vec<Value> {
        self.events
            .iter()
            .filter(|e| {
                e["method"] == "Runtime.exceptionThrown"
                    || (e["method"] == "Runtime.consoleAPICalled" && e["params"]["type"] == "error")
                    || (e["method"] == "Log.entryAdded" && e["params"]["entry"]["level"] == "error")
            })
            .cloned()
            .collect()
    }

    /// Types `text` into the field `selector` as a user would: a click, then the keys' text.
    pub fn type_into(&mut self, session: &str, selector: &str, text: &str) {
        self.click(session, selector);
        self.eval(
            session,
            &format!("document.querySelector({}).select?.()", json!(selector)),
        );
        self.call(Some(session), "Input.insertText", json!({"text": text}));
    }

    /// Presses Enter in the focused element.
    pub fn enter(&mut self, session: &str) {
        for kind in ["keyDown", "keyUp"] {
            self.call(
                Some(session),
                "Input.dispatchKeyEvent",
                json!({"type": kind, "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13, "text": if kind == "keyDown" { "\r" } else { "" }}),
            );
        }
    }

    /// A screenshot of the page, written to `dir/NAME.png`.
    pub fn shot(&mut self, session: &str, dir: &std::path::Path, name: &str) {
        let r = self.call(
            Some(session),
            "Page.captureScreenshot",
            json!({"format": "png"}),
        );
        let png = base64_decode(r["data"].as_str().unwrap());
        assert!(png.starts_with(b"\x89PNG"), "{name}: not a PNG");
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }

    /// A real mouse click in the middle of the element `selector`.
    pub fn click(&mut self, session: &str, selector: &str) {
        let js = format!(
            "(() => {{ const e = document.querySelector({sel}); e.scrollIntoView({{block: 'center'}});
               const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()",
            sel = json!(selector)
        );
        // Present and shown (a page being left still has its elements, hidden), and no
        // re-render due that could move it mid-click.
        self.wait_for(
            session,
            &format!(
                "((e) => !!e && e.getClientRects().length > 0)(document.querySelector({})) && !document.body.dataset.busy",
                json!(selector)
            ),
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

/// Standard base64 (the screenshots come that way); ten lines rather than a crate.
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let clean: Vec<u8> = s
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
        .collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, c)| {
            acc | (u32::from(val(*c)) << (18 - 6 * i))
        });
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}
