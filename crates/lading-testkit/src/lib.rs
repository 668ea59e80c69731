//! Test fixtures shared by the test suites: real ZooKeeper
//! servers and ensembles on free loopback ports, with relays that can cut a session off
//! (`zk`), private PostgreSQL servers (`pg`), SeaweedFS S3 servers (`seaweed`), an SMTP receiver
//! (`smtp`), a depositor's file and callback server (`payload_server`, which `lading demo` and
//! `lading bench pipeline` deposit from too), and the one way the suites wait where no signal
//! reaches them (`poll`).

/// The states a job that completes goes through, in order, as its history names them:
/// written out here (not taken from the code under test) so a suite checks the order itself.
pub const JOURNEY: [&str; 9] = [
    "Pending",
    "Estimating",
    "Provisioning",
    "Downloading",
    "Processing",
    "Storing",
    "Recording",
    "Notify",
    "Completed",
];

/// Every file under `dir` (not the folders), sorted; an unreadable folder counts as empty.
pub fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// A zip archive of `files` (name, bytes), in memory.
pub fn zip_bytes(files: &[(&str, &[u8])]) -> Vec<u8> {
    use std::io::Write;
    let mut buf = std::io::Cursor::new(Vec::new());
    let mut z = zip::ZipWriter::new(&mut buf);
    for (name, bytes) in files {
        z.start_file(*name, zip::write::SimpleFileOptions::default())
            .unwrap();
        z.write_all(bytes).unwrap();
    }
    z.finish().unwrap();
    buf.into_inner()
}

/// A checkm manifest as Merritt writes one: its `kind` (`mrt-ingest-manifest`,
/// `mrt-batch-manifest`, …), its `#%fields` line and its rows.
pub fn checkm(kind: &str, fields: &str, rows: &[String]) -> String {
    let mut s = format!(
        "#%checkm_0.7\n#%profile | http://uc3.cdlib.org/registry/ingest/manifest/{kind}\n\
         #%prefix | mrt: | http://merritt.cdlib.org/terms#\n\
         #%prefix | nfo: | http://www.semanticdesktop.org/ontologies/2007/03/22/nfo#\n\
         #%fields | {fields}\n"
    );
    for r in rows {
        s.push_str(r);
        s.push('\n');
    }
    s.push_str("#%eof\n");
    s
}

pub mod browser;
pub mod events;
/// The depositor's file and callback server (its own crate, which the binary links).
pub use lading_payload as payload_server;
pub mod pg;
pub mod poll;
pub mod proxy;
pub mod seaweed;
pub mod smtp;
pub mod zk;
