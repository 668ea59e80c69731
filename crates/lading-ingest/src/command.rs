//! A profile's processing command: what runs it ([`Shell`]: `sh -c` in the job's working
//! folder; the simulator brings its own) and how much of its output is kept. The output is
//! the deposit's to shape (a scanner lists each file of an object), so it is read line by
//! line and only its last [`KEEP_LINES`] lines, each cut at [`MAX_LINE`] bytes, are kept.

use lading_core::BoxFuture;
use std::collections::VecDeque;
use std::path::Path;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};

/// Output lines kept of each stream (the rest are counted).
pub const KEEP_LINES: usize = 200;
/// Bytes kept of one output line.
pub const MAX_LINE: usize = 4096;

/// One run of a command.
pub struct Run<'a> {
    pub command: &'a str,
    /// Where it runs: the job's working folder.
    pub workdir: &'a Path,
    /// What it is told: `LADING_JOB_ID` and the like.
    pub env: Vec<(&'static str, String)>,
}

/// How a command ended, and the last of what it said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ran {
    pub success: bool,
    /// How it ended, as the system says it (`exit status: 3`).
    pub status: String,
    /// Its last lines: standard output's, then standard error's.
    pub output: Vec<String>,
    /// Lines said before those and not kept.
    pub dropped: u64,
}

/// Runs processing commands.
pub trait Commands: Send + Sync {
    /// Runs `run` to its end; an error says it could not be started or read.
    fn run<'a>(&'a self, run: Run<'a>) -> BoxFuture<'a, std::io::Result<Ran>>;
}

/// `sh -c COMMAND` in the working folder, with no input, in a process group of its own. The
/// group is killed when the shell ends (what it left running in the background would
/// otherwise hold its output open, and outlive the job's folder) and when the run is dropped
/// (a stage that timed out, a process that stops). A process that leaves the group on purpose
/// (`setsid`) escapes it; see `docs/SECURITY.md`.
pub struct Shell;

impl Commands for Shell {
    fn run<'a>(&'a self, run: Run<'a>) -> BoxFuture<'a, std::io::Result<Ran>> {
        Box::pin(async move {
            let mut child = tokio::process::Command::new("sh")
                .arg("-c")
                .arg(run.command)
                .current_dir(run.workdir)
                .envs(run.env)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .process_group(0)
                .kill_on_drop(true)
                .spawn()?;
            let group = Group(child.id());
            let (out, err) = (child.stdout.take(), child.stderr.take());
            // The shell's end ends the group, so the reading ends with it.
            let ended = async {
                let status = child.wait().await;
                group.kill();
                status
            };
            let (status, out, err) = tokio::join!(ended, last_lines(out), last_lines(err));
            let (status, (out, a), (err, b)) = (status?, out?, err?);
            Ok(Ran {
                success: status.success(),
                status: status.to_string(),
                output: out.into_iter().chain(err).collect(),
                dropped: a + b,
            })
        })
    }
}

/// A command's process group (its id is the shell's), killed when dropped.
struct Group(Option<u32>);

impl Group {
    fn kill(&self) {
        if let Some(id) = self.0.and_then(|id| libc::pid_t::try_from(id).ok()) {
            // SAFETY: kill(2) with a negative pid signals that process group; it touches no
            // memory of ours. An empty group answers ESRCH, which is nothing to do.
            unsafe { libc::kill(-id, libc::SIGKILL) };
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last [`KEEP_LINES`] lines of `r` (each cut at [`MAX_LINE`] bytes, marked `…`), and
/// how many came before them.
pub async fn last_lines(
    r: Option<impl AsyncRead + Unpin>,
) -> std::io::Result<(VecDeque<String>, u64)> {
    let mut lines = VecDeque::new();
    let mut dropped = 0;
    let Some(r) = r else {
        return Ok((lines, dropped));
    };
    let mut r = BufReader::new(r);
    let mut buf = Vec::new();
    // Each turn reads a line (its first MAX_LINE bytes); the reading ends with the stream.
    while read_piece(&mut r, &mut buf).await? > 0 {
        let whole = buf.ends_with(b"\n");
        let mut line = String::from_utf8_lossy(&buf)
            .trim_end_matches(['\n', '\r'])
            .to_string();
        if !whole && buf.len() == MAX_LINE {
            // The rest of a long line is read past, a bounded piece at a time.
            line.push('…');
            let mut rest = Vec::new();
            while read_piece(&mut r, &mut rest).await? > 0 && !rest.ends_with(b"\n") {}
        }
        lines.push_back(line);
        if lines.len() > KEEP_LINES {
            lines.pop_front();
            dropped += 1;
        }
    }
    Ok((lines, dropped))
}

/// Into `buf`, what is left of a line, at most [`MAX_LINE`] bytes of it; its length.
async fn read_piece<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> std::io::Result<usize> {
    buf.clear();
    r.take(MAX_LINE as u64).read_until(b'\n', buf).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a command leaves running in the background ends with it: the run ends when the
    /// shell does (not when the background process would), and nothing of its group is left.
    #[tokio::test]
    async fn what_a_command_leaves_running_ends_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let run = Shell.run(Run {
            command: "sleep 600 & echo $!; echo done",
            workdir: dir.path(),
            env: Vec::new(),
        });
        // Not a figure: a run that waited for the sleep would fail here, not in 10 minutes.
        let ran = tokio::time::timeout(std::time::Duration::from_secs(60), run)
            .await
            .expect("the run ended with its shell")
            .unwrap();
        assert!(ran.success, "{ran:?}");
        assert_eq!(ran.output.last().map(String::as_str), Some("done"));
        let pid: u32 = ran.output[0].parse().unwrap();
        assert_gone(pid).await;
    }

    /// A run dropped partway (its stage timed out) kills its whole group, not just the shell.
    #[tokio::test]
    async fn a_dropped_run_kills_what_its_command_started() {
        let dir = tempfile::tempdir().unwrap();
        // A FIFO: the command's write of its background process's id waits for this read,
        // which is the signal that the background process is there.
        let pidfile = dir.path().join("bg.pid");
        let c = std::ffi::CString::new(pidfile.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        let run = Shell.run(Run {
            command: "sleep 600 & echo $! > bg.pid; wait",
            workdir: dir.path(),
            env: Vec::new(),
        });
        let mut run = Box::pin(run);
        let read = tokio::task::spawn_blocking(move || std::fs::read_to_string(&pidfile));
        let pid = tokio::select! {
            r = &mut run => panic!("the command ended on its own: {r:?}"),
            p = read => p.unwrap().ok().and_then(|p| p.trim().parse::<u32>().ok()),
        };
        let pid = pid.expect("the command wrote its background process's id");
        assert!(
            alive(pid),
            "the background sleep runs while the command does"
        );
        drop(run);
        assert_gone(pid).await;
    }

    /// Whether `pid` is a live process (a zombie waiting for its parent is not).
    fn alive(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| !r.trim_start().starts_with('Z'))
        })
    }

    /// `pid` is gone: SIGKILL is delivered at once, but its end is seen only when it is
    /// scheduled, so this waits on a pidfd, readable once the process has ended (at most
    /// 10 s).
    async fn assert_gone(pid: u32) {
        tokio::task::spawn_blocking(move || {
            // SAFETY: pidfd_open takes a pid and flags; the descriptor is closed below.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
            if fd < 0 {
                // Gone already (or reaped): no such process.
                return;
            }
            let mut p = libc::pollfd {
                fd: fd as libc::c_int,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd; the descriptor is ours to close.
            let ready = unsafe { libc::poll(&mut p, 1, 10_000) };
            unsafe { libc::close(fd as libc::c_int) };
            assert!(
                ready == 1 || !alive(pid),
                "process {pid} that the command started is still running"
            );
        })
        .await
        .unwrap();
        assert!(
            !alive(pid),
            "process {pid} that the command started is still running"
        );
    }

    /// A command that says more than is kept: its last lines are kept, each cut, the rest
    /// counted; its exit status is named.
    #[tokio::test]
    async fn the_shell_keeps_the_last_lines_of_a_loud_command() {
        let dir = tempfile::tempdir().unwrap();
        let ran = Shell
            .run(Run {
                command: "seq 1 100000; head -c 20000 /dev/zero | tr '\\0' x; echo; echo \"$WHO\" >&2; exit 3",
                workdir: dir.path(),
                env: vec![("WHO", "the scanner".into())],
            })
            .await
            .unwrap();
        assert!(!ran.success);
        assert_eq!(ran.status, "exit status: 3");
        // 100,000 numbers and the long line on standard output, one line on standard error.
        assert_eq!(ran.output.len(), KEEP_LINES + 1);
        assert_eq!(ran.dropped, 100_001 - KEEP_LINES as u64);
        let long = &ran.output[KEEP_LINES - 1];
        assert_eq!(long.chars().filter(|c| *c == 'x').count(), MAX_LINE);
        assert!(long.ends_with('…'));
        assert_eq!(ran.output[KEEP_LINES - 2], "100000");
        assert_eq!(ran.output[KEEP_LINES], "the scanner");
    }

    #[tokio::test]
    async fn a_command_that_cannot_start_is_an_error() {
        let r = Shell
            .run(Run {
                command: "true",
                workdir: Path::new("/nonexistent/lading"),
                env: vec![],
            })
            .await;
        assert!(r.is_err());
    }
}
