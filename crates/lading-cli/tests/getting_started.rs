//! The README's getting-started block, run as it stands: in a copy of `examples/`, with the
//! built `lading` first on the PATH, by bash with `-e` (a failed batch exits 5 and fails it).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The fenced block after the `<!-- getting-started -->` marker.
fn block(readme: &str) -> String {
    let after = readme
        .split("<!-- getting-started -->")
        .nth(1)
        .expect("the README marks its getting-started block");
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
    let script = block(&readme);
    assert!(script.contains("lading submit"), "{script}");
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&repo().join("examples"), &dir.path().join("examples"));
    let bin = Path::new(env!("CARGO_BIN_EXE_lading")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(dir.path())
        .env("PATH", path)
        .env_remove("LADING_STORE")
        .env_remove("LADING_CONFIG")
        .env_remove("LADING_DATA_DIR")
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
