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

/// `sh -c COMMAND` in the working folder, with no input; killed if the run is dropped (a
/// stage that timed out or a process that stops).
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
                .kill_on_drop(true)
                .spawn()?;
            let (out, err) = (child.stdout.take(), child.stderr.take());
            let ((out, a), (err, b)) = tokio::try_join!(last_lines(out), last_lines(err))?;
            let status = child.wait().await?;
            Ok(Ran {
                success: status.success(),
                status: status.to_string(),
                output: out.into_iter().chain(err).collect(),
                dropped: a + b,
            })
        })
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
