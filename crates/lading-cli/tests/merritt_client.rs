//! Merritt's front door, tried with Merritt's own Ruby client (`mrt-ingest`, in
//! `../shared/clients/mrt-ingest-ruby`, run unchanged by Debian's `ruby`) against a real
//! `lading serve`, and with `curl -F` as a user of Merritt's ingest form would.

use lading_testkit::checkm;
use lading_testkit::events::Api;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const ADMIN: &str = "root-token-0123456789abcdef";
const DEPOSITOR: &str = "depositor-token-0123456789";

struct Serve {
    child: Child,
    api: Api,
    dir: tempfile::TempDir,
    /// The ZooKeeper server of a run on ZooKeeper (stopped after `lading serve`).
    _zk: Option<lading_testkit::zk::ZkServer>,
}

/// Which store `lading serve` runs on.
#[derive(Clone, Copy)]
enum Store {
    Sqlite,
    ZooKeeper,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn hostname() -> String {
    let out = Command::new("hostname").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `lading serve` with a `demo` profile (collection `demo`), an admin token, a submitter
/// token `depositor` for `demo`, and depositors allowed to reach this machine's name on the
/// ports Merritt's client serves its files from (8081 up), on `store` (a ZooKeeper server of
/// its own for [`Store::ZooKeeper`]).
async fn serve(store: Store) -> Serve {
    let dir = tempfile::tempdir().unwrap();
    let (zk, store_line) = match store {
        Store::Sqlite => (None, String::new()),
        Store::ZooKeeper => {
            let zk = lading_testkit::zk::ZkServer::start().expect("ZooKeeper");
            let hosts = zk.connect_string();
            lading_store_zk::ZkTree::ensure_chroot(&hosts, "/merritt")
                .await
                .unwrap();
            (Some(zk), format!("store = \"zk://{hosts}/merritt\"\n"))
        }
    };
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("profiles")).unwrap();
    std::fs::write(
        data.join("profiles/demo.toml"),
        "collection = \"demo\"\nshoulder = \"ark:/99999/fk4\"\n",
    )
    .unwrap();
    std::fs::create_dir_all(dir.path().join("payloads")).unwrap();
    let host = hostname();
    let allow: Vec<String> = (8081..8121)
        .map(|p| format!("\"http://{host}:{p}/\""))
        .collect();
    let cfg = dir.path().join("lading.toml");
    std::fs::write(
        &cfg,
        format!(
            "{store_line}data_dir = {data:?}\nlisten = \"127.0.0.1:0\"\nreserve_bytes = 0\n\
             unestimated_min_free_bytes = 0\n\
             [payload]\nallow = [{}]\nallow_file_roots = [{:?}]\n\
             [[tokens]]\nname = \"root\"\ntoken = \"{ADMIN}\"\nrole = \"admin\"\n\
             [[tokens]]\nname = \"depositor\"\ntoken = \"{DEPOSITOR}\"\nrole = \"submitter\"\ncollections = [\"demo\"]\n",
            allow.join(", "),
            dir.path().join("payloads")
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lading"))
        .arg("--config")
        .arg(&cfg)
        .arg("serve")
        .env_remove("LADING_STORE")
        .env("LADING_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("API on http://").nth(1) {
                let _ = tx.send(rest.trim_end_matches("/api/v1").to_string());
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("lading serve started");
    Serve {
        child,
        api: Api::new(format!("http://{addr}")),
        dir,
        _zk: zk,
    }
}

impl Serve {
    /// Waits for a batch (any of Lading's names for it) to end; returns it, as the admin.
    async fn finished(&self, id: &str) -> Value {
        let ended =
            |v: &Value| matches!(v["status"]["status"].as_str(), Some("Completed" | "Failed"));
        self.api
            .until_batch(ADMIN, id, Duration::from_secs(120), ended)
            .await
    }

    /// `curl -F` each of `fields` to `path` as `user` (`name:password`): the status and body.
    fn form(&self, user: &str, path: &str, fields: &[String]) -> (u16, String) {
        let mut c = Command::new("curl");
        c.args(["-s", "-w", "\n%{http_code}", "-u", user]);
        for f in fields {
            c.arg("-F").arg(f);
        }
        c.arg(format!("{}{path}", self.api.base));
        let out = c.output().expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').unwrap();
        (code.parse::<u16>().unwrap(), body.to_string())
    }

    /// Submits `fields` as the depositor and waits for the batch to end: the batch.
    async fn ingested(&self, path: &str, fields: &[String]) -> Value {
        let mut all = fields.to_vec();
        all.extend(["profile=demo".to_string(), "responseForm=json".to_string()]);
        let (code, body) = self.form(&format!("depositor:{DEPOSITOR}"), path, &all);
        assert_eq!(code, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        let id = v["bat:batchState"]["bat:batchID"].as_str().unwrap();
        self.finished(id).await
    }

    /// Asserts `batch` Completed; if not, the failure shows each failed job's record.
    async fn completed(&self, batch: &Value, what: &str) {
        if batch["status"]["status"] == "Completed" {
            return;
        }
        let mut jobs = Vec::new();
        for jid in batch["jobs"]["batch-failed"]
            .as_array()
            .into_iter()
            .flatten()
        {
            jobs.push(self.job(jid).await);
        }
        panic!("{what}: not Completed: {batch}\nits failed jobs: {jobs:?}");
    }

    /// A job of the batch, as the admin.
    async fn job(&self, jid: &Value) -> Value {
        let (_, job) = self
            .api
            .get(ADMIN, &format!("/api/v1/jobs/{}", jid.as_str().unwrap()))
            .await;
        job
    }

    fn stored(&self) -> Vec<PathBuf> {
        lading_testkit::files_under(&self.dir.path().join("data/storage"))
    }
}

/// Runs a Ruby script with Merritt's client on the load path; its stdout. One at a time:
/// the client picks the first free port from 8081 by opening and closing it, so two clients
/// started together may both pick the same one.
fn ruby(script: &str, args: &[&str]) -> String {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let lib = repo().join("../shared/clients/mrt-ingest-ruby/lib");
    assert!(lib.exists(), "Merritt's Ruby client at {}", lib.display());
    let out = Command::new("ruby")
        .arg("-I")
        .arg(&lib)
        .arg("-e")
        .arg(script)
        .args(args)
        .output()
        .expect("ruby (scripts/test installs Debian's ruby and ruby-rest-client)");
    assert!(
        out.status.success(),
        "ruby: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// As Merritt's README shows it: a client, an object with two files and an ERC, start and
/// finish the ingest; prints the batch id Merritt's answer gave.
const INGEST: &str = r#"
require 'mrt/ingest'
url, user, password, a, b, primary = ARGV
client = Mrt::Ingest::Client.new(url, user, password)
obj = Mrt::Ingest::IObject.new(
  primary_identifier: primary,
  erc: { 'who' => 'Doe, Jane', 'what' => 'Two letters', 'when' => '2026' }
)
obj.add_component(File.new(a), name: File.basename(a))
obj.add_component(File.new(b), name: File.basename(b))
response = obj.start_ingest(client, 'demo', 'lading-test-agent')
obj.finish_ingest
puts response.batch_id
"#;

/// An object named in the path (its form's fields Lading does not map kept with the
/// batch), then a new version of it by the update form.
async fn named_in_the_path_then_updated(s: &Serve, src: &std::path::Path) {
    let put = |bytes: &[u8]| {
        let p = src.join("named.txt");
        std::fs::write(&p, bytes).unwrap();
        format!("file=@{}", p.display())
    };
    let a_file = put(b"named v1\n");
    let b = s
        .ingested(
            "/poster/submit/ark/99999/fk4named",
            &[
                a_file.clone(),
                "type=file".into(),
                "note=first deposit".into(),
                "notification=curator@example.org".into(),
                "DC.publisher=UC3".into(),
                "someFieldMerrittLacks=kept anyway".into(),
            ],
        )
        .await;
    s.completed(&b, "the batch").await;
    let job = s.job(&b["jobs"]["batch-completed"][0]).await;
    assert_eq!(
        job["identifiers"]["primary_id"], "ark:/99999/fk4named",
        "{job}"
    );
    let form = &b["submission"]["form"];
    assert_eq!(form["note"], "first deposit", "{b}");
    assert_eq!(form["notification"], "curator@example.org", "{b}");
    assert_eq!(form["DC.publisher"], "UC3", "{b}");
    assert_eq!(form["someFieldMerrittLacks"], "kept anyway", "{b}");
    let a_file = put(b"named v2\n");
    let b = s
        .ingested(
            "/poster/update/ark/99999/fk4named",
            &[a_file, "type=file".into()],
        )
        .await;
    s.completed(&b, "the batch").await;
    let v2 = s
        .stored()
        .into_iter()
        .find(|p| {
            p.to_string_lossy().contains("ark_99999_fk4named/v2/") && p.ends_with("named.txt")
        })
        .unwrap_or_else(|| panic!("version 2 in {:?}", s.stored()));
    assert_eq!(std::fs::read(v2).unwrap(), b"named v2\n");
}

/// The service's state and help pages answer 200.
fn state_and_help(s: &Serve) {
    for path in ["/poster/state", "/poster/help"] {
        let out = Command::new("curl")
            .args(["-s", "-w", "\n%{http_code}", "-u"])
            .arg(format!("depositor:{DEPOSITOR}"))
            .arg(format!("{}{path}", s.api.base))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(text.ends_with("\n200"), "{path}: {text}");
    }
}

/// Every payload type of Merritt's form by `curl -F`, named or guessed: a container; an
/// object manifest with md5 digests (as Merritt's client writes them), and one whose digest
/// is wrong, which fails its job naming both digests; the three batch manifests; an object
/// named in the path, then its update; the fields Lading does not map, kept with the batch.
async fn every_payload_type_of_the_form_is_ingested(store: Store) {
    use md5::Digest;
    let s = serve(store).await;
    let src = s.dir.path().join("payloads");
    let put = |name: &str, bytes: &[u8]| {
        let p = src.join(name);
        std::fs::write(&p, bytes).unwrap();
        let md5 = md5::Md5::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>();
        (
            format!("file://{}", p.display()),
            md5,
            format!("file=@{}", p.display()),
        )
    };
    let (a_url, a_md5, _) = put("a.txt", b"alpha\n");
    let (b_url, b_md5, _) = put("b.txt", b"beta\n");
    let zip = lading_testkit::zip_bytes(&[("obj/one.txt", b"one\n"), ("obj/two.txt", b"two\n")]);
    let (z_url, _, z_file) = put("obj.zip", &zip);
    let obj_fields = "nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileName";
    let object = |b_digest: &str| {
        checkm(
            "mrt-ingest-manifest",
            obj_fields,
            &[
                format!("{a_url} | md5 | {a_md5} | a.txt"),
                format!("{b_url} | md5 | {b_digest} | b.txt"),
            ],
        )
    };
    let (obj_url, _, obj_file) = put("object.checkm", object(&b_md5).as_bytes());
    let (_, _, bad_file) = put("bad.checkm", object(&a_md5).as_bytes());
    let (_, _, single_file) = put(
        "single.checkm",
        checkm(
            "mrt-single-file-batch-manifest",
            "nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileName | mrt:title",
            &[
                format!("{a_url} | md5 | {a_md5} | a.txt | Alpha"),
                format!("{b_url} | md5 | {b_md5} | b.txt | Beta"),
            ],
        )
        .as_bytes(),
    );
    let (_, _, containers_file) = put(
        "containers.checkm",
        checkm(
            "mrt-container-batch-manifest",
            "nfo:fileUrl | nfo:fileName | mrt:title",
            &[
                format!("{z_url} | obj.zip | First"),
                format!("{z_url} | obj.zip | Second"),
            ],
        )
        .as_bytes(),
    );
    let (_, _, batch_file) = put(
        "batch.checkm",
        checkm(
            "mrt-batch-manifest",
            "nfo:fileUrl | nfo:fileName",
            &[
                format!("{obj_url} | object.checkm"),
                format!("{obj_url} | object.checkm"),
            ],
        )
        .as_bytes(),
    );
    let completed = |b: &Value| b["jobs"]["batch-completed"].as_array().map_or(0, Vec::len);
    // Each type, named and guessed: the objects it makes, and the files of its first object
    // (a single-file batch's first object holds one of its two files).
    let zipped: &[&str] = &["one.txt", "two.txt"];
    let listed: &[&str] = &["a.txt", "b.txt"];
    for (file, ty, objects, files) in [
        (&z_file, Some("container"), 1, zipped),
        (&z_file, None, 1, zipped),
        (&obj_file, Some("object-manifest"), 1, listed),
        (&obj_file, None, 1, listed),
        (&single_file, Some("single-file-batch-manifest"), 2, &[][..]),
        (&single_file, None, 2, &[][..]),
        (
            &containers_file,
            Some("container-batch-manifest"),
            2,
            zipped,
        ),
        (&containers_file, None, 2, zipped),
        (&batch_file, Some("batch-manifest"), 2, listed),
        (&batch_file, None, 2, listed),
    ] {
        let mut fields = vec![file.clone()];
        fields.extend(ty.map(|t| format!("type={t}")));
        let b = s.ingested("/poster/submit", &fields).await;
        s.completed(&b, &format!("{file} as {ty:?}")).await;
        assert_eq!(completed(&b), objects, "{file} as {ty:?}: {b}");
        let job = s.job(&b["jobs"]["batch-completed"][0]).await;
        let ark = job["identifiers"]["primary_id"].as_str().unwrap();
        let folder = format!("/{}/v1/", lading_core::layout::ark_node_name(ark));
        let mut names: Vec<String> = s
            .stored()
            .iter()
            .filter(|p| p.to_string_lossy().contains(&folder))
            .filter_map(|p| Some(p.file_name()?.to_string_lossy().into_owned()))
            .filter(|n| n.ends_with(".txt"))
            .collect();
        names.sort();
        if files.is_empty() {
            assert!(
                names == ["a.txt"] || names == ["b.txt"],
                "{file}: {names:?}"
            );
        } else {
            assert_eq!(names, files, "{file} as {ty:?}");
        }
    }
    // The md5 digests are checked: a wrong one fails its job, naming both digests.
    let b = s
        .ingested(
            "/poster/submit",
            &[bad_file.clone(), "type=object-manifest".into()],
        )
        .await;
    let failed = &b["jobs"]["batch-failed"];
    assert_eq!(failed.as_array().map_or(0, Vec::len), 1, "{b}");
    let job = s.job(&failed[0]).await;
    let message = job["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&a_md5) && message.contains(&b_md5),
        "the failure names both digests: {job}"
    );
    named_in_the_path_then_updated(&s, &src).await;
    // Too much kept: refused naming the limit, nothing made.
    let before = s.api.batch_ids(ADMIN, "limit=1000").await;
    let big = format!("note={}", "x".repeat(40 << 10));
    let (code, body) = s.form(
        &format!("depositor:{DEPOSITOR}"),
        "/poster/submit",
        &[z_file.clone(), "profile=demo".into(), big],
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("32768"), "{body}");
    assert_eq!(s.api.batch_ids(ADMIN, "limit=1000").await, before);
    state_and_help(&s);
}

/// Each test on both stores.
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn on_sqlite() {
                    super::$name(super::Store::Sqlite).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn on_zookeeper() {
                    super::$name(super::Store::ZooKeeper).await
                }
            }
        )*
    };
}

on_both_stores!(
    merritts_ruby_client_ingests_and_updates_an_object_unchanged,
    the_ingest_form_answers_as_merritt_does_and_refuses_clearly,
    every_payload_type_of_the_form_is_ingested,
);

async fn merritts_ruby_client_ingests_and_updates_an_object_unchanged(store: Store) {
    let s = serve(store).await;
    let files = tempfile::tempdir().unwrap();
    let a = files.path().join("letter-1.txt");
    let b = files.path().join("letter-2.txt");
    std::fs::write(&a, b"Dear Merritt,\n").unwrap();
    std::fs::write(&b, b"Yours, Lading\n").unwrap();
    let url = format!("{}/object/ingest", s.api.base);
    let (a_s, b_s) = (a.display().to_string(), b.display().to_string());
    let bid = ruby(INGEST, &[&url, "depositor", DEPOSITOR, &a_s, &b_s, ""]);
    assert!(
        bid.starts_with("bid-"),
        "Merritt's form of the batch id: {bid}"
    );
    // Every Lading lookup takes Merritt's id.
    let batch = s.finished(&bid).await;
    s.completed(&batch, "Merritt's client's ingest").await;
    let (st, own) = s
        .api
        .get(DEPOSITOR, &format!("/api/v1/batches/{bid}"))
        .await;
    assert_eq!(st, reqwest::StatusCode::OK, "{own}");
    let jid = batch["jobs"]["batch-completed"][0]
        .as_str()
        .unwrap()
        .to_string();
    let (_, job) = s.api.get(ADMIN, &format!("/api/v1/jobs/{jid}")).await;
    let ark = job["identifiers"]["primary_id"]
        .as_str()
        .unwrap()
        .to_string();
    // The ERC file filled the job's metadata (the form named none of it).
    assert_eq!(job["metadata"]["erc_who"], "Doe, Jane", "{job}");
    assert_eq!(job["metadata"]["erc_what"], "Two letters", "{job}");
    assert_eq!(job["metadata"]["erc_when"], "2026", "{job}");
    // The stored files, byte for byte, and the ERC file kept with them.
    let stored = s.stored();
    for (name, want) in [
        ("letter-1.txt", &b"Dear Merritt,\n"[..]),
        ("letter-2.txt", &b"Yours, Lading\n"[..]),
    ] {
        let f = stored
            .iter()
            .find(|p| p.ends_with(name))
            .unwrap_or_else(|| panic!("{name} in {stored:?}"));
        assert_eq!(std::fs::read(f).unwrap(), want);
    }
    let erc = stored
        .iter()
        .find(|p| p.ends_with("mrt-erc.txt"))
        .expect("the ERC file is stored");
    assert!(
        std::fs::read_to_string(erc)
            .unwrap()
            .contains("who: Doe, Jane")
    );
    // An update through Merritt's UI path: version 2 of the same object.
    let url = format!("{}/object/update", s.api.base);
    std::fs::write(&b, b"Yours again, Lading\n").unwrap();
    let bid2 = ruby(INGEST, &[&url, "depositor", DEPOSITOR, &a_s, &b_s, &ark]);
    let batch2 = s.finished(&bid2).await;
    s.completed(&batch2, "Merritt's client's update").await;
    let v2 = s
        .stored()
        .into_iter()
        .find(|p| p.ends_with("letter-2.txt") && p.to_string_lossy().contains("/v2/"))
        .unwrap_or_else(|| panic!("version 2 in {:?}", s.stored()));
    assert_eq!(std::fs::read(v2).unwrap(), b"Yours again, Lading\n");
}

/// `curl -F` to the ingest service's form: both answer forms, a bad password, a wrong
/// collection and a missing file; each refusal leaves no batch.
async fn the_ingest_form_answers_as_merritt_does_and_refuses_clearly(store: Store) {
    let s = serve(store).await;
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("hello.txt");
    std::fs::write(&f, b"hello\n").unwrap();
    std::fs::write(
        s.dir.path().join("data/profiles/other.toml"),
        "collection = \"other\"\n",
    )
    .unwrap();
    let curl = |user: &str, fields: &[String]| s.form(user, "/poster/submit", fields);
    let me = format!("depositor:{DEPOSITOR}");
    let file = format!("file=@{}", f.display());
    // JSON, a file by its type.
    let (code, body) = curl(
        &me,
        &[
            file.clone(),
            "type=file".into(),
            "profile=demo".into(),
            "responseForm=json".into(),
            "title=Hello".into(),
        ],
    );
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let id = v["bat:batchState"]["bat:batchID"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(v["bat:batchState"]["bat:batchStatus"], "QUEUED");
    let b = s.finished(&id).await;
    s.completed(&b, "the batch").await;
    // XML, the type guessed (a plain file).
    let (code, body) = curl(
        &me,
        &[
            file.clone(),
            "profile=demo".into(),
            "responseForm=xml".into(),
        ],
    );
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("<bat:batchState xmlns:bat="), "{body}");
    assert!(
        body.contains("<bat:batchStatus>QUEUED</bat:batchStatus>"),
        "{body}"
    );
    let before = s.api.batch_ids(ADMIN, "limit=1000").await;
    // Refusals: a bad password, another collection, no file, an unknown type.
    let (code, body) = curl(
        "depositor:wrong-password-000000",
        &[file.clone(), "profile=demo".into()],
    );
    assert_eq!(code, 401, "{body}");
    let (code, body) = curl(
        &me,
        &[
            file.clone(),
            "profile=other".into(),
            "responseForm=json".into(),
        ],
    );
    assert_eq!(code, 403, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["exc:exception"]["exc:statusCode"], 403, "{body}");
    let (code, body) = curl(&me, &["profile=demo".into(), "responseForm=json".into()]);
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("\\\"file\\\""), "{body}");
    let (code, body) = curl(
        &me,
        &[file.clone(), "profile=demo".into(), "type=bogus".into()],
    );
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("<exc:statusCode>400</exc:statusCode>"),
        "{body}"
    );
    // A digest that does not match the file (md5 of "hello\n" is b1946ac9…).
    let (code, body) = curl(
        &me,
        &[
            file.clone(),
            "profile=demo".into(),
            "digestType=md5".into(),
            "digestValue=00000000000000000000000000000000".into(),
        ],
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("b1946ac92492d2347c6235b4d2611184"), "{body}");
    assert_eq!(
        s.api.batch_ids(ADMIN, "limit=1000").await,
        before,
        "nothing stored"
    );
    let uploads = std::fs::read_dir(s.dir.path().join("data/uploads"))
        .unwrap()
        .count();
    assert_eq!(uploads, 2, "only the two taken uploads are kept");
}
