//! Reading jobs: one, a listing, counts per state.

use super::*;

impl Jobs {
    /// [`Jobs::read`] of a job that must be there (`NoJob` if not).
    pub(crate) async fn read_existing(&self, ty: &str, id: &str) -> Result<(Record, i32)> {
        self.read(ty, id).await?.ok_or_else(|| JobsError::NoJob {
            ty: ty.into(),
            id: id.into(),
        })
    }

    pub async fn get_job(&self, ty: &str, id: &str) -> Result<JobView> {
        check_type(ty)?;
        check_id(id)?;
        let (record, _) = self.read_existing(ty, id).await?;
        Ok(JobView {
            ty: ty.into(),
            id: id.into(),
            record,
        })
    }

    pub async fn get_job_data(&self, ty: &str, id: &str) -> Result<Value> {
        Ok(self.get_job(ty, id).await?.record.data)
    }

    pub async fn get_job_state(&self, ty: &str, id: &str) -> Result<State> {
        Ok(self.get_job(ty, id).await?.record.state)
    }

    /// Up to `limit` jobs of a type with ids after `after`, in id order, optionally only
    /// those in `state`. The last id returned is the cursor for the next page.
    pub async fn list(
        &self,
        ty: &str,
        state: Option<State>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<JobView>> {
        self.require_type(ty).await?;
        let dir = format!("{ROOT}/{ty}/jobs");
        let mut out = Vec::new();
        let mut cursor = after.map(str::to_string);
        while out.len() < limit {
            let page = self
                .tree
                .children_page(&dir, cursor.as_deref(), PAGE.max(limit))
                .await?;
            for id in &page {
                if let Some((record, _)) = self.read(ty, id).await?
                    && state.is_none_or(|s| s == record.state)
                {
                    out.push(JobView {
                        ty: ty.into(),
                        id: id.clone(),
                        record,
                    });
                    if out.len() == limit {
                        break;
                    }
                }
            }
            if page.len() < PAGE.max(limit) {
                break;
            }
            cursor = page.last().cloned();
        }
        Ok(out)
    }

    /// A type as the API and `lading jobs types` show it.
    pub async fn type_view(&self, ty: &str, settings: &TypeSettings) -> Result<TypeView> {
        let c = self.counts(ty).await?;
        let n = |st| c.get(&st).copied().unwrap_or(0);
        Ok(TypeView {
            ty: ty.into(),
            timeout_s: settings.timeout_s,
            max_attempts: settings.max_attempts,
            backoff_base_ms: settings.backoff_base_ms,
            rate_per_s: settings.rate_per_s,
            keep_finished_s: settings.keep_finished_s,
            keep_failed_s: settings.keep_failed_s,
            pending: n(State::Pending),
            running: n(State::Running),
            finished: n(State::Finished),
            failed: n(State::Failed),
        })
    }

    /// Jobs of a type per state.
    pub async fn counts(&self, ty: &str) -> Result<HashMap<State, u64>> {
        self.require_type(ty).await?;
        let pending = self.tree.count_children(&pending_dir(ty)).await?;
        let running = self.tree.count_children(&active_dir(ty)).await?;
        let failed = self
            .tree
            .count_children(&concat(&[ROOT, "/", ty, "/failed"]))
            .await?;
        let all = self
            .tree
            .count_children(&format!("{ROOT}/{ty}/jobs"))
            .await?;
        Ok(HashMap::from([
            (State::Pending, pending),
            (State::Running, running),
            (State::Failed, failed),
            (
                State::Finished,
                all.saturating_sub(pending + running + failed),
            ),
        ]))
    }
}
