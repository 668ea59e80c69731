//! Space reservations of provisioning (`/reservations/JID`): a job admitted into a working
//! root reserves its bytes there until its download ends either way, so jobs admitted at the
//! same moment, in any number of processes and hosts, never share the same free space.
//!
//! Admission is optimistic: it reads the reservations, and creates its own in one `multi`
//! with a version-checked write of `/reservations` itself, so of two admissions that read the
//! same sum only one commits; the other reads again. The job's status carries
//! `reserved_bytes` (set in the same `multi`), and the job's move out of Downloading (or out
//! of Provisioning any other way) deletes the reservation in its own `multi`.

use crate::{Engine, EngineError, JobLease, MAX_OPTIMISTIC, Result, json_bytes};
use lading_core::layout::{RESERVATIONS, job_node};
use lading_core::{Op, TreeError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Status field of a job holding a reservation: its bytes.
pub const RESERVED_FIELD: &str = "reserved_bytes";

/// One reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// The working root it is on (hosts sharing one file system share the id).
    pub root: String,
    pub bytes: u64,
}

pub(crate) fn reservation_path(job: &str) -> String {
    lading_core::layout::slashed([RESERVATIONS, job])
}

impl Engine {
    /// The reservations, by job.
    pub async fn reservations(&self) -> Result<Vec<(String, Reservation)>> {
        let names = self.tree.children(RESERVATIONS).await?;
        let mut out = Vec::with_capacity(names.len());
        for n in names {
            if let Some((r, _)) = self.read_json::<Reservation>(&reservation_path(&n)).await? {
                out.push((n, r));
            }
        }
        Ok(out)
    }

    /// Reserves `bytes` on `root` for a leased job if `free` (what the file system has now)
    /// less every other reservation on that root still leaves `keep`. Returns `Ok(None)`
    /// when reserved (or already reserved by this job), else `Ok(Some(reserved))`: the
    /// bytes others hold there.
    pub async fn reserve_space(
        &self,
        lease: &mut JobLease,
        root: &str,
        bytes: u64,
        free: u64,
        keep: u64,
    ) -> Result<Option<u64>> {
        self.check_job_lease(lease)?;
        if lease.status.extra.contains_key(RESERVED_FIELD) {
            return Ok(None);
        }
        for _ in 0..MAX_OPTIMISTIC {
            let Some(top) = self.tree.get(RESERVATIONS).await? else {
                return Err(EngineError::Invalid(
                    "the store has no /reservations".into(),
                ));
            };
            let mut held = 0u64;
            for (job, r) in self.reservations().await? {
                if r.root == root && job != lease.job.as_str() {
                    held = held.saturating_add(r.bytes);
                }
            }
            if free.saturating_sub(held) < bytes.saturating_add(keep) {
                return Ok(Some(held));
            }
            let mut status = lease.status.clone();
            status
                .extra
                .insert(RESERVED_FIELD.into(), Value::from(bytes));
            let path = reservation_path(lease.job.as_str());
            let mut ops = vec![
                Op::check(job_node(&lease.job, "lock"), None),
                Op::set(
                    job_node(&lease.job, "status"),
                    json_bytes(&status),
                    Some(lease.status_version),
                ),
                // Bumps the version every admission checks: concurrent ones cannot both win.
                Op::set(RESERVATIONS, None, Some(top.stat.version)),
            ];
            // A reservation left by this job (a crash between the two steps of an older
            // version) is replaced.
            if self.tree.exists(&path).await?.is_some() {
                ops.push(Op::delete(&path, None));
            }
            ops.push(Op::create(
                &path,
                json_bytes(&Reservation {
                    root: root.to_string(),
                    bytes,
                }),
            ));
            match self.tree.multi_on(lease.session, ops).await {
                Ok(_) => {
                    lease.status = status;
                    lease.status_version += 1;
                    return Ok(None);
                }
                Err(e) if matches!(e.root(), TreeError::BadVersion { path, .. } if path == RESERVATIONS) =>
                {
                    continue;
                }
                Err(e) => return Err(self.lease_error(e, lease.job.as_str())),
            }
        }
        Err(EngineError::Conflict(RESERVATIONS.to_string()))
    }
}
