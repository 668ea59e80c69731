//! Download slots shared fairly between submitters.
//!
//! A process has `concurrency` downloading slots. One submitter may hold them all while
//! nobody else waits; when jobs of other submitters wait in Downloading, each submitter's
//! share is `concurrency / (submitters)`, at least one. A submitter at its share is not given
//! another slot (the job waits, uncounted), and one over it gives a slot back: one of its
//! downloads stops and waits (uncounted; the file is fetched again later), so a slow
//! or endless download of one submitter cannot keep another's tiny file waiting.
//!
//! Who waits is read from the tree (the first `LOOK` jobs in Downloading not locked by a
//! worker), and only when a submitter holds a slot already: one with none always gets one.

use crate::Ingest;
use lading_core::JobState;
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

/// Jobs in Downloading looked at to find who else waits.
const LOOK: usize = 32;
/// How often a running download checks whether it is over its share.
pub const CHECK: Duration = Duration::from_secs(2);

/// The downloads this process runs, per submitter.
#[derive(Default)]
pub struct Slots {
    active: Mutex<HashMap<String, usize>>,
}

/// A slot held; given back when dropped.
pub struct Held<'a> {
    slots: &'a Slots,
    who: String,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut a = self.slots.active.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = a.get_mut(&self.who) {
            *n -= 1;
            if *n == 0 {
                a.remove(&self.who);
            }
        }
    }
}

impl Slots {
    fn count(&self, who: &str) -> (usize, BTreeSet<String>) {
        let a = self.active.lock().unwrap_or_else(|p| p.into_inner());
        let others = a.keys().filter(|k| *k != who).cloned().collect();
        (a.get(who).copied().unwrap_or(0), others)
    }

    fn take(&self, who: &str) -> Held<'_> {
        *self
            .active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(who.to_string())
            .or_default() += 1;
        Held {
            slots: self,
            who: who.to_string(),
        }
    }
}

/// Submitters other than `who` with a job waiting (not locked) in Downloading.
async fn waiting_others(ingest: &Ingest, who: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let Ok(jobs) = ingest
        .engine
        .list_jobs(JobState::Downloading, None, LOOK)
        .await
    else {
        return out;
    };
    let tree = ingest.engine.tree();
    for (_, jid) in jobs {
        let lock = lading_core::layout::job_node(&jid, "lock");
        if tree.exists(&lock).await.ok().flatten().is_some() {
            continue;
        }
        let Ok(cfg) = ingest.engine.job_configuration(&jid).await else {
            continue;
        };
        if let Some(s) = cfg.typed().ok().and_then(|c| c.submitter.as_deref())
            && s != who
        {
            out.insert(s.to_string());
        }
    }
    out
}

/// `who`'s share of `total` slots, and whether anyone else wants one.
async fn share(ingest: &Ingest, who: &str, total: usize) -> (usize, usize, bool) {
    let (mine, mut others) = ingest.slots.count(who);
    others.extend(waiting_others(ingest, who).await);
    let share = (total / (others.len() + 1)).max(1);
    (mine, share, !others.is_empty())
}

/// A slot for a download of `who`'s, or the reason to wait.
pub async fn admit<'a>(ingest: &'a Ingest, who: &str) -> Result<Held<'a>, String> {
    let total = ingest.cfg.stage("downloading").concurrency.max(1);
    if ingest.slots.count(who).0 > 0 {
        let (mine, share, contended) = share(ingest, who, total).await;
        if contended && mine >= share {
            return Err(format!(
                "waiting for a fair share of the download slots: {who} holds {mine} of {total} \
                 while other submitters wait"
            ));
        }
    }
    Ok(ingest.slots.take(who))
}

/// Completes when `who` holds more than its share while others wait (checked every
/// [`CHECK`]); never otherwise.
pub async fn over_share(ingest: &Ingest, who: &str) -> String {
    let total = ingest.cfg.stage("downloading").concurrency.max(1);
    loop {
        tokio::time::sleep(CHECK).await;
        if ingest.slots.count(who).0 <= 1 {
            continue;
        }
        let (mine, share, contended) = share(ingest, who, total).await;
        if contended && mine > share {
            return format!(
                "gave its download slot to other submitters ({who} held {mine} of {total}); \
                 fetched again later"
            );
        }
    }
}
