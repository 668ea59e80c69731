//! `lading serve`: the HTTP API, every pipeline stage and the generic-jobs activity monitor in
//! one process.

use lading_node::node::{self, Node, NodeSpec};
use lading_server::Auth;
use std::net::SocketAddr;
use std::time::Duration;

pub async fn serve(
    store: &str,
    cfg: lading_ingest::Config,
    listen: Option<String>,
    stages: (NodeSpec, String),
    grace: Duration,
) -> anyhow::Result<()> {
    let listen = listen.unwrap_or_else(|| cfg.listen.clone());
    let addr: SocketAddr = listen
        .parse()
        .map_err(|e| anyhow::anyhow!("--listen {listen:?} is not host:port: {e}"))?;
    let mut auth = Auth::new(&cfg.tokens).map_err(anyhow::Error::msg)?;
    // The admin token this process made or read itself, for the console's address.
    let mut made_token = None;
    if auth.is_empty() {
        if !addr.ip().is_loopback() {
            anyhow::bail!(
                "refusing to listen on {addr}: no API tokens are configured, so only loopback \
                 is allowed; add [[tokens]] to the config to serve other hosts"
            );
        }
        let (token, path, made) = lading_server::auth::admin_token(&cfg.data_dir)?;
        say!(
            "lading: admin token {token} ({} {})",
            if made { "made and kept in" } else { "from" },
            path.display()
        );
        auth = auth.with_admin(&token);
        made_token = Some(token);
    }
    let files = lading_server::conn::raise_open_files();
    if cfg.http.max_connections + 256 > files {
        say!(
            "lading: warning: [http] max_connections = {} is close to this process's limit of \
             {files} open files; raise the limit (ulimit -n, LimitNOFILE=) or lower the cap",
            cfg.http.max_connections
        );
    }
    let ingest = node::ingest(store, cfg).await?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    let (spec, what) = stages;
    let node = Node::start(
        ingest,
        NodeSpec {
            monitor: true,
            http: Some((listener, auth)),
            ..spec
        },
    )
    .await?;
    if let Some(a) = node.addr {
        say!("lading: API on http://{a}/api/v1");
        // The console signs in by itself with a token in the address's fragment (never
        // sent to the server, kept by the browser).
        match made_token {
            Some(t) => say!("lading: console on http://{a}/#token={t}"),
            None => say!("lading: console on http://{a}/ (sign in with an admin token)"),
        }
    }
    let running = format!("lading: running {what} (stop with Ctrl-C)");
    Ok(node
        .run_until_signal(grace, &running, crate::say_line)
        .await?)
}
