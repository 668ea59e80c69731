//! Storage nodes for the tests: a SeaweedFS bucket as a node, its credentials, an ingest
//! configured with nodes.

use super::World;
use lading_ingest::nodes::NodeSettings;
use lading_ingest::{Config, Ingest};
use lading_testkit::seaweed::{ACCESS_KEY, SECRET_KEY, Weed};
use sha2::Digest;
use std::sync::Arc;

pub fn env(k: &str) -> Option<String> {
    match k {
        "AWS_ACCESS_KEY_ID" => Some(ACCESS_KEY.into()),
        "AWS_SECRET_ACCESS_KEY" => Some(SECRET_KEY.into()),
        "WRONG_SECRET" => Some("not-the-secret".into()),
        _ => None,
    }
}

pub fn node(id: u32, weed: &Weed, bucket: &str) -> NodeSettings {
    node_at(id, weed.endpoint(), bucket)
}

/// Node `id` on bucket `bucket` of the S3 server at `endpoint`, with test-sized parts.
pub fn node_at(id: u32, endpoint: String, bucket: &str) -> NodeSettings {
    NodeSettings {
        id,
        url: format!("s3://{bucket}/lading"),
        endpoint: Some(endpoint),
        region: None,
        access_key_id_env: None,
        secret_access_key_env: None,
        part_size: Some(5 << 20),
        checksum: None,
    }
}

pub fn sha256(b: &[u8]) -> String {
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// The world's ingest with `nodes` configured and credentials from [`env`].
pub fn ingest_with(w: &World, nodes: Vec<NodeSettings>) -> Result<Arc<Ingest>, String> {
    let cfg = Config {
        storage_nodes: nodes,
        // The scheduled audit's schedule ticks each second (where a test runs it).
        fixity: lading_ingest::config::FixitySettings {
            audit_every_s: 1,
            ..w.cfg.fixity.clone()
        },
        ..w.cfg.clone()
    };
    Ingest::try_new_env(w.engine.clone(), cfg, env)
}
