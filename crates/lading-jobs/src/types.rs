//! Types: creating them and their settings (the activity timeout).

use super::*;

impl Jobs {
    /// Sets a type's activity timeout (whole seconds, at least 1), creating the type.
    pub async fn set_type_timeout(&self, ty: &str, timeout_s: u64) -> Result<()> {
        check_type(ty)?;
        if timeout_s == 0 || timeout_s > MAX_TIMEOUT_S {
            return Err(JobsError::Invalid(format!(
                "an activity timeout must be 1 to {MAX_TIMEOUT_S} seconds (ten years), not {timeout_s}"
            )));
        }
        let data = Some(serde_json::to_vec(&serde_json::json!({"timeout_s": timeout_s})).unwrap());
        let tp = type_path(ty);
        for _ in 0..MAX_OPTIMISTIC {
            if self.tree.exists(&tp).await?.is_some() {
                match self.tree.set(&tp, data.clone(), None).await {
                    Err(TreeError::NoNode(_)) => continue,
                    r => {
                        r?;
                        return Ok(());
                    }
                }
            }
            if self.tree.exists(ROOT).await?.is_none() {
                match self
                    .tree
                    .create(ROOT, None, lading_core::CreateMode::Persistent)
                    .await
                {
                    Ok(_) | Err(TreeError::NodeExists(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            let ops = vec![
                Op::create(&tp, data.clone()),
                Op::create(format!("{tp}/jobs"), None),
                Op::create(format!("{tp}/pending"), None),
                Op::create(format!("{tp}/active"), None),
            ];
            match self.tree.multi(ops).await {
                Ok(_) => return Ok(()),
                Err(e) if is_race(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(JobsError::Conflict(tp))
    }

    /// A type's activity timeout in seconds.
    pub async fn get_type_timeout(&self, ty: &str) -> Result<u64> {
        check_type(ty)?;
        let tp = type_path(ty);
        let node = self
            .tree
            .get(&tp)
            .await?
            .ok_or_else(|| JobsError::NoType(ty.into()))?;
        let v: Value =
            serde_json::from_slice(node.data.as_deref().unwrap_or(b"null")).map_err(|e| {
                JobsError::Corrupt {
                    path: tp.clone(),
                    reason: e.to_string(),
                }
            })?;
        v.get("timeout_s")
            .and_then(Value::as_u64)
            .ok_or_else(|| JobsError::Corrupt {
                path: tp,
                reason: "no timeout_s".into(),
            })
    }

    /// Every type with its timeout, sorted by name.
    pub async fn types(&self) -> Result<Vec<(String, u64)>> {
        let names = match self.tree.children(ROOT).await {
            Err(TreeError::NoNode(_)) => return Ok(Vec::new()),
            r => r?,
        };
        let mut out = Vec::new();
        for n in names {
            out.push((n.clone(), self.get_type_timeout(&n).await?));
        }
        Ok(out)
    }
}
