//! `lading serve`: the HTTP API, every pipeline stage and the generic-jobs activity monitor in
//! one process.

use lading_core::time::system_clock;
use lading_jobs::Jobs;
use lading_server::{AppState, Auth};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub async fn serve(
    store: &str,
    config: Option<&std::path::Path>,
    listen: Option<String>,
    grace: Duration,
) -> anyhow::Result<()> {
    let cfg = crate::pipeline::config(config)?;
    let listen = listen.unwrap_or_else(|| cfg.listen.clone());
    let addr: SocketAddr = listen
        .parse()
        .map_err(|e| anyhow::anyhow!("--listen {listen:?} is not host:port: {e}"))?;
    let mut auth = Auth::new(&cfg.tokens).map_err(anyhow::Error::msg)?;
    if auth.is_empty() {
        if !addr.ip().is_loopback() {
            anyhow::bail!(
                "refusing to listen on {addr}: no API tokens are configured, so only loopback \
                 is allowed; add [[tokens]] to the config to serve other hosts"
            );
        }
        let (token, path, made) = lading_server::auth::admin_token(&cfg.data_dir)?;
        eprintln!(
            "lading: admin token {token} ({} {})",
            if made { "made and kept in" } else { "from" },
            path.display()
        );
        auth = auth.with_admin(&token);
    }
    let files = raise_open_files();
    if cfg.http.max_connections + 256 > files {
        eprintln!(
            "lading: warning: [http] max_connections = {} is close to this process's limit of \
             {files} open files; raise the limit (ulimit -n, LimitNOFILE=) or lower the cap",
            cfg.http.max_connections
        );
    }
    let ingest = crate::pipeline::ingest(store, cfg).await?;
    let tree = ingest.engine.tree().clone();
    let jobs = Arc::new(Jobs::new(
        tree,
        system_clock(),
        lading_store_sqlite::default_owner(),
    ));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let state = AppState {
        events: lading_server::events::EventHub::start(&ingest.engine),
        ingest: ingest.clone(),
        jobs: jobs.clone(),
        auth: Arc::new(auth),
        stopping: stop_rx.clone(),
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    eprintln!("lading: API on http://{}/api/v1", listener.local_addr()?);
    let mut rx = stop_rx.clone();
    let server = tokio::spawn(lading_server::serve(
        listener,
        lading_server::router(state),
        async move {
            let _ = rx.wait_for(|s| *s).await;
        },
        lading_server::conn::Limits::from(&ingest.cfg.http),
    ));
    let access_workers = access_workers(&ingest, &ACCESS_STAGES, &stop_rx);
    let monitor_stop = Arc::new(tokio::sync::Notify::new());
    let monitor = {
        let (j, s) = (jobs.clone(), monitor_stop.clone());
        tokio::spawn(async move { j.run_monitor(&s).await })
    };
    let on_stop = || {
        let _ = stop_tx.send(true);
        monitor_stop.notify_one();
    };
    // The tree is closed when the workers stop; the server and monitor stop first.
    let r = crate::pipeline::run_until_signal(&ingest, lading_ingest::STAGE_NAMES, grace, &on_stop)
        .await;
    on_stop();
    server.await??;
    monitor.await?;
    for w in access_workers {
        w.await?;
    }
    r
}

/// Raises this process's soft limit of open files to its hard limit; returns the limit.
fn raise_open_files() -> usize {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 1024;
        }
        if r.rlim_cur < r.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                r.rlim_cur = r.rlim_max;
            }
        }
    }
    r.rlim_cur.min(1 << 20) as usize
}

/// The access queues as `lading worker` stage names.
pub const ACCESS_STAGES: [&str; 2] = ["access-small", "access-large"];

/// Starts a worker for each access queue named (`access-small`, `access-large`); each runs
/// until `stop` turns true.
pub fn access_workers(
    ingest: &Arc<lading_ingest::Ingest>,
    names: &[&str],
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    use lading_core::layout::AccessQueue;
    names
        .iter()
        .filter_map(|n| match *n {
            "access-small" => Some(AccessQueue::Small),
            "access-large" => Some(AccessQueue::Large),
            _ => None,
        })
        .map(|q| {
            tokio::spawn(lading_server::access::run_worker(
                ingest.clone(),
                q,
                stop.clone(),
            ))
        })
        .collect()
}
