//! The README's getting-started block, run as it stands: in a copy of `examples/`, with the
//! built `lading` first on the PATH, by bash with `-e` (a failed batch exits 5 and fails it).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The fenced block after the `<!-- MARKER -->` marker.
fn block(readme: &str, marker: &str) -> String {
    let after = readme
        .split(&format!("<!-- {marker} -->"))
        .nth(1)
        .expect("the README marks its block");
    let body = after
        .trim_start()
        .strip_prefix("```sh\n")
        .expect("a sh block right after the marker");
    body[..body.find("```").expect("the block ends")].to_string()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

#[test]
fn the_readmes_getting_started_block_runs_as_written() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let script = block(&readme, "getting-started");
    assert!(script.contains("lading submit"), "{script}");
    let dir = tempfile::tempdir().unwrap();
    let out = run_block(&script, dir.path(), |_| {});
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    // Six batches, each reported Completed, every job in it Completed.
    let reports: Vec<&str> = stdout.lines().filter(|l| l.starts_with("batch ")).collect();
    assert_eq!(reports.len(), 6, "{stdout}");
    assert!(
        reports.iter().all(|l| l.ends_with(": Completed")),
        "{stdout}"
    );
    let jobs = stdout.lines().filter(|l| l.starts_with("  jid")).count();
    assert_eq!(jobs, 8, "{stdout}");
    assert!(!stdout.contains("Failed  "), "{stdout}");
    // What was stored: the letters object holds its three files, verified.
    let storage = dir.path().join("lading-data/storage");
    let mut letters = 0;
    let mut stack = vec![storage.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else if e.file_name() == "letter-2.txt" {
                letters += 1;
                assert_eq!(
                    std::fs::read(e.path()).unwrap(),
                    std::fs::read(repo().join("examples/payload/letters/letter-2.txt")).unwrap()
                );
            }
        }
    }
    // In the batch's letters object, the letters manifest, and both zips.
    assert_eq!(
        letters,
        4,
        "stored copies of letter-2.txt under {}",
        storage.display()
    );
    assert!(stderr.contains("lading: stopped"), "{stderr}");
}

/// Runs `script` by bash in `dir` with a copy of `examples/` (changed by `prepare`), the
/// built `lading` first on the PATH; a hung step fails it after 5 minutes.
fn run_block(script: &str, dir: &Path, prepare: impl FnOnce(&Path)) -> std::process::Output {
    copy_dir(&repo().join("examples"), &dir.join("examples"));
    prepare(&dir.join("examples"));
    let bin = Path::new(env!("CARGO_BIN_EXE_lading")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env("PATH", path)
        .env_remove("LADING_STORE")
        .env_remove("LADING_CONFIG")
        .env_remove("LADING_DATA_DIR")
        .env_remove("LADING_SERVER")
        .env_remove("LADING_LISTEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    // A hung step fails the test instead of hanging it: the whole group goes after 5 min.
    // The watchdog stands down as soon as the block ends (its group id may be reused later).
    let pid = child.id() as i32;
    let (ended, watch) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
            watch.recv_timeout(Duration::from_secs(300))
        {
            // SAFETY: kill only sends a signal, to the group the block runs in.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    });
    let out = child.wait_with_output().unwrap();
    let _ = ended.send(());
    watchdog.join().unwrap();
    out
}

#[test]
fn the_readmes_serve_block_runs_as_written() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let written = block(&readme, "serve");
    assert!(
        written.contains("lading --config examples/serve.toml serve"),
        "{written}"
    );
    // The one change: a free port for the block's 8080, in the block and in the config.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let script = written.replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"));
    let dir = tempfile::tempdir().unwrap();
    let out = run_block(&script, dir.path(), |examples| {
        let cfg = examples.join("serve.toml");
        let text = std::fs::read_to_string(&cfg).unwrap();
        assert!(text.contains("127.0.0.1:8080"), "{text}");
        std::fs::write(
            &cfg,
            text.replace("127.0.0.1:8080", &format!("127.0.0.1:{port}")),
        )
        .unwrap();
    });
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    // The submission by URL answered (the upload's answer went into `bid`), and the
    // upload's batch was followed to Completed.
    assert_eq!(
        stdout.matches("\"status\":\"Pending\"").count(),
        1,
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("status") && l.ends_with("Completed")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("console: http://127.0.0.1:{port}/#token=")),
        "{stdout}"
    );
    // The store is where the config's data_dir says, and both objects were stored.
    assert!(dir.path().join("lading-serve/lading.db").exists());
    assert!(
        !dir.path().join("lading-data").exists(),
        "nothing in the default folder"
    );
    let stored = std::fs::read_dir(dir.path().join("lading-serve/storage"))
        .unwrap()
        .count();
    assert_eq!(stored, 2, "two objects stored");
    assert!(stderr.contains("lading: stopped"), "{stderr}");
}

/// docs/CONFIG.md's "checkm in five minutes" block, run as it stands: its object, one file
/// by a relative URL with an md5 and one by an absolute URL without a digest, is stored.
#[test]
fn the_checkm_in_five_minutes_block_runs_as_written() {
    let doc = std::fs::read_to_string(repo().join("docs/CONFIG.md")).unwrap();
    let script = block(&doc, "checkm-five-minutes");
    assert!(script.contains("lading submit"), "{script}");
    let dir = tempfile::tempdir().unwrap();
    let out = run_block(&script, dir.path(), |_| {});
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("batch ") && l.ends_with(": Completed")),
        "{stdout}"
    );
    let stored = lading_testkit::files_under(&dir.path().join("lading-data/storage"));
    for (name, bytes) in [
        ("hello.txt", &b"hello\n"[..]),
        ("docs/notes.txt", b"a note\n"),
    ] {
        let found = stored
            .iter()
            .any(|p| p.ends_with(format!("producer/{name}")) && std::fs::read(p).unwrap() == bytes);
        assert!(found, "{name} stored: {stored:?}");
    }
}
