//! What a simulated process is configured with: the ingest's settings, its profiles (on
//! bucket nodes, on folder nodes, on the storage root), its fetcher and stage settings.

use super::*;

/// The storage nodes' part size: a payload's file (up to some 800 bytes) goes up in one PUT
/// or as a multipart upload of a few parts, as do a version's own records (its manifests,
/// `lading-version.json`), under the same faults as every other request.
pub(super) const PART_SIZE: u64 = 256;

/// The profile every simulated batch is submitted under: its report is mailed and each
/// job's outcome called back (both through the real outbox, to the simulated world).
pub(super) const PROFILE: &str = "sim";

/// The ingest settings the real Notify and Reporting stages and the outbox deliverer run
/// with: a mail relay named, a short settling time after requeues, and deliveries retried
/// quickly and for as long as it takes (the simulated relay comes back).
pub(super) fn ingest_config(
    work: &std::path::Path,
    name: &str,
    retention_hours: u64,
) -> lading_ingest::Config {
    let mut cfg = lading_ingest::Config {
        smtp_host: Some("relay.sim.invalid".into()),
        mail_from: "lading@sim.invalid".into(),
        report_settle_s: 2,
        // Cleanup (by each process that reports) and the working-folder sweep (by each that
        // keeps working folders): every 10 s where ended batches are kept 0 h, else every
        // minute (the sweep then finds nothing old enough in a run, and costs a look at each
        // folder).
        retention_hours,
        cleanup_every_s: if retention_hours == 0 {
            CLEANUP_EVERY_S
        } else {
            6 * CLEANUP_EVERY_S
        },
        // Each process its own working folder (a host's disk); the storage root and the
        // inventory shared by all (a shared file system, one database).
        data_dir: work.join(format!("{name}-data")),
        work_dir: Some(work.join(name)),
        work_root_id: Some(name.into()),
        storage_root: Some(work.join("storage")),
        inventory: Some(work.join("inventory.db")),
        // The scheduled fixity audit, every 10 s: with the inventory's clock two days
        // behind ([`Behind`]), each share reads every recorded copy.
        fixity: lading_ingest::config::FixitySettings {
            every_days: 1,
            bytes_per_s: 0,
            audit_every_s: AUDIT_EVERY_S,
            abort_uploads_after_s: ABORT_UPLOADS_AFTER_S,
        },
        ..Default::default()
    };
    // Every stage as [`stage_config`] says (the outbox below).
    for name in lading_ingest::STAGE_NAMES {
        let c = stage_config();
        cfg.stages.insert(
            name.to_string(),
            lading_ingest::config::StageSettings {
                concurrency: Some(c.concurrency),
                timeout_s: Some(c.timeout.as_secs()),
                max_attempts: Some(c.max_attempts),
                backoff_base_ms: Some(c.backoff_base.as_millis() as u64),
                backoff_max_ms: Some(c.backoff_max.as_millis() as u64),
            },
        );
    }
    cfg.stages.insert(
        "outbox".into(),
        lading_ingest::config::StageSettings {
            concurrency: Some(2),
            timeout_s: Some(60),
            max_attempts: Some(u32::MAX),
            backoff_base_ms: Some(200),
            backoff_max_ms: Some(3_000),
        },
    );
    cfg
}

/// How often cleanup and the working-folder sweep run.
pub(super) const CLEANUP_EVERY_S: u64 = 10;

/// How often the scheduled fixity audit's schedule ticks.
pub(super) const AUDIT_EVERY_S: u64 = 10;

/// After how long the scheduled audit aborts an upload left open (`[fixity]
/// abort_uploads_after_s`, its least).
pub(super) const ABORT_UPLOADS_AFTER_S: u64 = 60;

/// The profile of some payload batches: stored on bucket node 1 and copied to node 2.
pub(super) const NODES_PROFILE: &str = "sim-nodes";

pub(super) fn nodes_profile() -> lading_ingest::Profile {
    lading_ingest::Profile {
        name: NODES_PROFILE.into(),
        storage_nodes: vec![1, 2],
        ..profile()
    }
}

/// The profile of other payload batches: stored on folder node 3 and copied to folder node 4
/// (folders shared by every process, as a mounted file system is).
pub(super) const FOLDERS_PROFILE: &str = "sim-folders";

pub(super) fn folders_profile() -> lading_ingest::Profile {
    lading_ingest::Profile {
        name: FOLDERS_PROFILE.into(),
        storage_nodes: vec![3, 4],
        ..profile()
    }
}

/// Folder nodes 3 (a primary) and 4 (its replica), as a process opens them from its
/// settings (`file://` URLs).
pub(super) fn folder_nodes(work: &std::path::Path) -> [lading_ingest::nodes::Node; 2] {
    [3, 4].map(|id| {
        let settings = lading_ingest::config::NodeSettings::at(
            id,
            &format!("file://{}", work.join(format!("node{id}")).display()),
        );
        lading_ingest::nodes::Node::open(&settings, |_| None).expect("a folder node")
    })
}

pub(super) fn profile() -> lading_ingest::Profile {
    lading_ingest::Profile {
        name: PROFILE.into(),
        collection: "sim".into(),
        notification: vec!["depositor@sim.invalid".into()],
        callback_url: Some("http://callbacks.sim.invalid/lading".into()),
        command: Some(crate::command::SCAN.into()),
        // The quota the simulated Pending keeps (in the profile's own folder), and the
        // real waker wakes by.
        max_in_flight_per_submitter: Some(QUOTA_LIMIT as u32),
        ..Default::default()
    }
}

/// One fetcher for every simulated process of the program (its HTTP clients are costly to
/// make, and nothing in the simulation fetches).
pub(super) fn fetcher() -> lading_ingest::fetch::Fetcher {
    static F: std::sync::OnceLock<lading_ingest::fetch::Fetcher> = std::sync::OnceLock::new();
    F.get_or_init(|| {
        lading_ingest::fetch::Fetcher::with_settings(&Default::default())
            .expect("default payload settings")
    })
    .clone()
}

pub(super) fn stage_config() -> StageConfig {
    StageConfig {
        concurrency: 2,
        timeout: Duration::from_secs(60),
        max_attempts: 4,
        backoff_base: Duration::from_millis(200),
        backoff_max: Duration::from_secs(3),
    }
}
