//! Holds and pauses: queue pause flags and collection holds, read through watched flags.

use super::*;

impl Engine {
    /// A boolean read of the tree, remembered under the process's shared watch on `path`
    /// (see [`crate::watched`]) until it fires, or this engine changes a flag itself. Costs no
    /// round trip while nothing changes.
    ///
    /// Whether the watch has fired is asked of the watch itself at each read, and a waiter
    /// waits on that same watch. (A task that waited on a watch of its own and marked the
    /// value stale ran after a waiter woken by the same change had read the old value: the
    /// waiter slept until its sweep, 10 s.)
    pub(crate) async fn watched_flag<F>(&self, path: &str, kind: WatchKind, read: F) -> Result<bool>
    where
        F: std::future::Future<Output = Result<bool>>,
    {
        self.watched_read(path, kind, read).await
    }

    pub(crate) async fn flag(&self, path: &str, on: bool) -> Result<bool> {
        // This process's own change is seen by its next read, not when the watch event comes.
        self.watched.forget(path, WatchKind::Data);
        self.watched
            .forget(lading_core::tree::split_path(path).0, WatchKind::Children);
        let r = if on {
            self.tree
                .create(path, None, CreateMode::Persistent)
                .await
                .map(|_| ())
        } else {
            self.tree.delete(path, None).await
        };
        match r {
            Ok(()) => Ok(true),
            Err(TreeError::NodeExists(_)) | Err(TreeError::NoNode(_)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Pauses a queue (`ingest`, `accessSmall`, `accessLarge`). Returns false if already paused.
    pub async fn pause_queue(&self, name: &str) -> Result<bool> {
        check_queue(name)?;
        self.flag(&queue_lock(name), true).await
    }

    pub async fn resume_queue(&self, name: &str) -> Result<bool> {
        check_queue(name)?;
        self.flag(&queue_lock(name), false).await
    }

    /// Whether a queue is paused, read from the tree now.
    pub async fn queue_paused(&self, name: &str) -> Result<bool> {
        check_queue(name)?;
        Ok(self.tree.exists(&queue_lock(name)).await?.is_some())
    }

    /// The same, as acquisition reads it: remembered under a watch, so another process's pause
    /// takes effect here when its watch event arrives (milliseconds), at no round trip before.
    pub(crate) async fn queue_paused_watched(&self, name: &str) -> Result<bool> {
        check_queue(name)?;
        let path = queue_lock(name);
        self.watched_flag(&path, WatchKind::Data, async {
            Ok(self.tree.exists(&path).await?.is_some())
        })
        .await
    }

    /// Holds a collection: its pending batches and jobs turn Held when next acquired.
    pub async fn hold_collection(&self, name: &str) -> Result<bool> {
        check_name("collection", name)?;
        self.flag(&collection_lock(name), true).await
    }

    /// Every collection held now, by name.
    pub async fn held_collections(&self) -> Result<Vec<String>> {
        match self
            .tree
            .children(lading_core::layout::COLLECTION_LOCKS)
            .await
        {
            Ok(names) => Ok(names),
            Err(TreeError::NoNode(_)) => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn collection_held(&self, name: &str) -> Result<bool> {
        check_name("collection", name)?;
        Ok(self.tree.exists(&collection_lock(name)).await?.is_some())
    }

    /// Releases a collection hold and puts every Held batch and job of that collection back to
    /// Pending. Returns how many items were released.
    pub async fn release_collection(&self, name: &str) -> Result<usize> {
        check_name("collection", name)?;
        self.flag(&collection_lock(name), false).await?;
        let mut released = 0;
        for b in self.batch_ids().await? {
            let Ok((st, _)) = self.batch_status(&b).await else {
                continue;
            };
            if st.status == BatchState::Held
                && self.batch_collection(&b).await?.as_deref() == Some(name)
            {
                self.release_batch(&b).await?;
                released += 1;
            }
        }
        let mut after: Option<String> = None;
        loop {
            let page = self
                .tree
                .children_page(&job_state_folder(JobState::Held), after.as_deref(), PAGE)
                .await?;
            // A short page is the last (see `Tree::children_page`).
            let last = (page.len() == PAGE).then(|| page.last().cloned()).flatten();
            for name_ref in &page {
                let Some((_, job)) = parse_job_ref(name_ref) else {
                    continue;
                };
                if self.job_collection(&job).await?.as_deref() == Some(name) {
                    self.admin_job(&job, |p| p.apply(Event::To(JobState::Pending)))
                        .await?;
                    released += 1;
                }
            }
            if last.is_none() {
                break;
            }
            after = last;
        }
        Ok(released)
    }

    pub(crate) async fn batch_collection(&self, batch: &BatchId) -> Result<Option<String>> {
        let sub: Option<(Map<String, Value>, i32)> =
            self.read_json(&batch_node(batch, "submission")).await?;
        Ok(sub.and_then(|(m, _)| {
            m.get("collection")
                .and_then(Value::as_str)
                .map(str::to_string)
        }))
    }

    pub(crate) async fn job_collection(&self, job: &JobId) -> Result<Option<String>> {
        let cfg = self.job_configuration(job).await?;
        Ok(cfg.text("collection").map(str::to_string))
    }

    pub(crate) async fn any_collection_held(&self) -> Result<bool> {
        self.watched_flag(COLLECTION_LOCKS, WatchKind::Children, async {
            Ok(self.tree.count_children(COLLECTION_LOCKS).await? > 0)
        })
        .await
    }
}
