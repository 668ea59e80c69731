//! `lading bench http`: the API under load on loopback — `GET /api/v1/jobs/{id}` and
//! `POST /api/v1/batches` (by URL) from C keep-alive connections, against a server in this
//! process on a fresh store. Client and server share this machine's cores, so the figures
//! are a floor for a server with the machine to itself.

use crate::{Scratch, cpu_seconds, percentile};
use lading_engine::Engine;
use lading_ingest::{Config, Ingest, TokenSettings};
use lading_node::node;
use lading_server::Auth;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

pub(crate) const TOKEN: &str = "bench-admin-token-0123456789";

/// One load phase: `total` requests from `conns` connections, each made by `make(i)`.
async fn load(
    conns: usize,
    total: usize,
    make: impl Fn(&reqwest::Client, usize) -> reqwest::RequestBuilder + Send + Sync + 'static,
    expect: reqwest::StatusCode,
) -> crate::Result<(f64, Vec<u64>, f64)> {
    let make = Arc::new(make);
    let next = Arc::new(AtomicUsize::new(0));
    let cpu0 = cpu_seconds();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..conns {
        // One client per task: one connection each, kept alive.
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(1)
            .tcp_nodelay(true)
            .build()?;
        let (make, next) = (make.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return Ok::<_, crate::BenchError>(lat);
                }
                let t = Instant::now();
                let r = make(&client, i).bearer_auth(TOKEN).send().await?;
                let status = r.status();
                let body = r.bytes().await?;
                if status != expect {
                    crate::error::bail!(
                        "request {i}: {status}: {}",
                        String::from_utf8_lossy(&body)
                    );
                }
                lat.push(t.elapsed().as_micros() as u64);
            }
        }));
    }
    let mut lat = Vec::with_capacity(total);
    for t in tasks {
        lat.extend(t.await??);
    }
    let secs = start.elapsed().as_secs_f64();
    let cores = (cpu_seconds() - cpu0) / secs;
    lat.sort_unstable();
    Ok((total as f64 / secs, lat, cores))
}

/// A server in this process on a fresh store, for a benchmark.
pub(crate) struct BenchServer {
    pub(crate) base: String,
    url: String,
    pub(crate) engine: Arc<Engine>,
    data: std::path::PathBuf,
    node: node::Node,
    st: node::Store,
    scratch: Scratch,
}

impl BenchServer {
    pub(crate) async fn start(
        store: Option<&str>,
        max_upload_bytes: u64,
    ) -> crate::Result<BenchServer> {
        let scratch = Scratch::new(store).await?;
        let (st, engine) = scratch.engine().await?;
        let url = scratch.url.clone();
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis();
        let data = std::path::PathBuf::from("lading-bench").join(format!("http-{stamp}"));
        let cfg = Config {
            data_dir: data.clone(),
            max_upload_bytes,
            // The bench submits a loopback URL that is never fetched.
            payload: lading_ingest::PayloadSettings {
                allow: vec!["http://127.0.0.1:9/".into()],
                ..Default::default()
            },
            ..Config::default()
        };
        std::fs::create_dir_all(cfg.profiles_dir())?;
        std::fs::write(
            cfg.profiles_dir().join("bench.toml"),
            "collection = \"bench\"\n",
        )?;
        let ingest = Ingest::new(engine.clone(), cfg);
        let auth = Auth::new(&[TokenSettings {
            name: "bench".into(),
            token: TOKEN.into(),
            role: "admin".into(),
            types: Vec::new(),
            collections: Vec::new(),
        }])
        .map_err(crate::BenchError::Other)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let node = node::Node::start(
            ingest,
            node::NodeSpec {
                http: Some((listener, auth)),
                ..Default::default()
            },
        )
        .await?;
        let base = format!("http://{}", node.addr.expect("listening"));
        Ok(BenchServer {
            base,
            url,
            engine,
            data,
            node,
            st,
            scratch,
        })
    }

    pub(crate) async fn finish(self) -> crate::Result<()> {
        // Stops the server and closes the store.
        self.node.join().await?;
        drop(self.st);
        self.scratch.finish().await?;
        let _ = std::fs::remove_dir_all(&self.data);
        Ok(())
    }
}

pub async fn http(
    gets: usize,
    posts: usize,
    conns: usize,
    as_json: bool,
    store: Option<&str>,
) -> crate::Result<()> {
    let srv = BenchServer::start(store, 8 << 30).await?;
    let (base, url, engine) = (srv.base.clone(), srv.url.clone(), srv.engine.clone());
    // Setup (not measured): jobs to read.
    let n_jobs = 1000;
    let mut sub = serde_json::Map::new();
    sub.insert("profile_name".into(), json!("bench"));
    sub.insert("submitter".into(), json!("bench"));
    let bid = crate::fill(&engine, sub, n_jobs).await?;
    let ids: Arc<Vec<String>> = Arc::new(
        engine.batch(&bid).await?.jobs["batch-processing"]
            .iter()
            .map(ToString::to_string)
            .collect(),
    );

    let b = base.clone();
    let (get_rate, get_lat, get_cores) = load(
        conns,
        gets,
        move |c, i| c.get(format!("{b}/api/v1/jobs/{}", ids[i % ids.len()])),
        reqwest::StatusCode::OK,
    )
    .await?;
    let b = base.clone();
    let (post_rate, post_lat, post_cores) = load(
        conns,
        posts,
        move |c, _| {
            c.post(format!("{b}/api/v1/batches"))
                .json(&json!({"payload_url": "http://127.0.0.1:9/object.bin", "profile": "bench"}))
        },
        reqwest::StatusCode::CREATED,
    )
    .await?;
    let made = engine.batch_ids().await?.len();
    if made != posts + 1 {
        crate::error::bail!("{made} batches in the store after {posts} submissions (+1 setup)");
    }
    srv.finish().await?;

    let ms = |v: &[u64], p| percentile(v, p);
    let figures = json!({
        "connections": conns, "store": url,
        "get_job": {"requests": gets, "per_s": get_rate, "p50_ms": ms(&get_lat, 0.5),
                    "p99_ms": ms(&get_lat, 0.99), "cores_busy": get_cores},
        "post_batch": {"requests": posts, "per_s": post_rate, "p50_ms": ms(&post_lat, 0.5),
                       "p99_ms": ms(&post_lat, 0.99), "cores_busy": post_cores},
    });
    if as_json {
        println!("{figures}");
    } else {
        println!(
            "lading bench http: {conns} keep-alive connections, client and server in this process, store {url}"
        );
        println!(
            "  GET  /api/v1/jobs/{{id}}  {get_rate:.0} requests/s, p50 {:.2} ms, p99 {:.2} ms ({gets} requests, {get_cores:.2} cores busy)",
            ms(&get_lat, 0.5),
            ms(&get_lat, 0.99)
        );
        println!(
            "  POST /api/v1/batches    {post_rate:.0} batches/s, p50 {:.2} ms, p99 {:.2} ms ({posts} submissions by URL, durable, {post_cores:.2} cores busy)",
            ms(&post_lat, 0.5),
            ms(&post_lat, 0.99)
        );
    }
    Ok(())
}

/// A `/proc/self/status` field in bytes (`VmRSS`, `VmHWM`).
pub(crate) fn proc_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

/// `lading bench upload`: one upload of `bytes` (generated on the fly by a client that sends
/// 1 MiB at a time over a plain socket) to an in-process server; the process's peak memory
/// growth while it streams to disk, and the rate.
pub async fn upload(bytes: u64, as_json: bool, store: Option<&str>) -> crate::Result<()> {
    let srv = BenchServer::start(store, bytes.saturating_add(1)).await?;
    let addr = srv.base.trim_start_matches("http://").to_string();
    // Peak memory from here on (Linux: writing 5 to clear_refs resets VmHWM).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let rss0 = proc_kib("VmRSS:");
    let start = Instant::now();
    let reply = tokio::task::spawn_blocking(move || -> crate::Result<String> {
        use std::io::{Read, Write};
        let boundary = "lading-bench-boundary";
        let head = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        );
        let tail = format!("\r\n--{boundary}--\r\n");
        let len = head.len() as u64 + bytes + tail.len() as u64;
        let mut s = std::net::TcpStream::connect(&addr)?;
        write!(
            s,
            "POST /api/v1/batches/upload?profile=bench HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n{head}"
        )?;
        let block: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        let mut left = bytes;
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            s.write_all(&block[..n])?;
            left -= n as u64;
        }
        s.write_all(tail.as_bytes())?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })
    .await??;
    let secs = start.elapsed().as_secs_f64();
    let peak = proc_kib("VmHWM:");
    if !reply.starts_with("HTTP/1.1 201") {
        crate::error::bail!(
            "upload refused: {}",
            reply.lines().last().unwrap_or_default()
        );
    }
    let stored = std::fs::read_dir(srv.data.join("uploads"))?
        .flatten()
        .map(|d| d.path().join("big.bin"))
        .find(|p| p.exists())
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .unwrap_or(0);
    srv.finish().await?;
    if stored != bytes {
        crate::error::bail!("stored {stored} bytes of {bytes}");
    }
    let growth = peak.saturating_sub(rss0);
    let mb = |b: u64| b as f64 / (1 << 20) as f64;
    if as_json {
        println!(
            "{}",
            json!({"bytes": bytes, "seconds": secs, "mb_per_s": mb(bytes) / secs,
                   "rss_before_mb": mb(rss0), "peak_mb": mb(peak), "growth_mb": mb(growth)})
        );
    } else {
        println!(
            "lading bench upload: {bytes} bytes in one multipart upload, streamed to disk and fsynced"
        );
        println!("  rate         {:.1} MB/s ({secs:.2} s)", mb(bytes) / secs);
        println!(
            "  memory       {:.1} MiB before, peak {:.1} MiB: growth {:.1} MiB (the whole process, client included)",
            mb(rss0),
            mb(peak),
            mb(growth)
        );
    }
    Ok(())
}
