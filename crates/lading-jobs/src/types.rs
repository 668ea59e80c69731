//! Types: creating them and their settings (activity timeout, retry policy, rate limit,
//! retention), all in the type's node.

use super::*;

/// Longest backoff between attempts (one hour): the exponential growth stops there.
pub const MAX_BACKOFF_MS: u64 = 3_600_000;

/// A type's settings: the data of `/generic-jobs/TYPE`. Unknown fields are kept; a type made
/// by an older version (`{"timeout_s": N}`) gets the defaults for the rest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TypeSettings {
    /// Activity timeout: a running job not updated for this long is re-enqueued.
    pub timeout_s: u64,
    /// Runs a job gets before an error fails it (1: the first error fails it).
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    /// Backoff after the first error; doubled after each further one, up to an hour, with
    /// jitter (a random point in its upper half).
    #[serde(default = "default_backoff")]
    pub backoff_base_ms: u64,
    /// At most this many jobs accepted per second across every processor (0: no limit).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rate_per_s: u32,
    /// Finished jobs are removed this long after they finished (0: kept).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub keep_finished_s: u64,
    /// Failed jobs are removed this long after they failed (0: kept).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub keep_failed_s: u64,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

/// A type as the API and `lading jobs types` show it: every setting (defaults included, zeros
/// too) and its jobs per state.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TypeView {
    #[serde(rename = "type")]
    pub ty: String,
    pub timeout_s: u64,
    pub max_attempts: u32,
    pub backoff_base_ms: u64,
    /// 0: no limit.
    pub rate_per_s: u32,
    /// 0: kept.
    pub keep_finished_s: u64,
    pub keep_failed_s: u64,
    pub pending: u64,
    pub running: u64,
    pub finished: u64,
    pub failed: u64,
}

fn default_attempts() -> u32 {
    3
}
fn default_backoff() -> u64 {
    1000
}

impl TypeSettings {
    /// The defaults, with `timeout_s`.
    pub fn new(timeout_s: u64) -> TypeSettings {
        TypeSettings {
            timeout_s,
            max_attempts: default_attempts(),
            backoff_base_ms: default_backoff(),
            rate_per_s: 0,
            keep_finished_s: 0,
            keep_failed_s: 0,
            extra: Default::default(),
        }
    }

    /// The wait before the run after error number `attempts` (1 for the first): the base
    /// doubled per earlier error, at most an hour, then a random point in its upper half (so
    /// jobs that failed together do not come back together).
    pub fn backoff_ms(&self, attempts: u32, random: &dyn lading_core::random::Random) -> u64 {
        let exp = attempts.saturating_sub(1).min(40);
        let full = self
            .backoff_base_ms
            .saturating_mul(1u64 << exp)
            .min(MAX_BACKOFF_MS);
        let half = full / 2;
        full - half + random.below(half as usize + 1) as u64
    }

    fn check(&self) -> Result<()> {
        if self.timeout_s == 0 || self.timeout_s > MAX_TIMEOUT_S {
            return Err(JobsError::Invalid(format!(
                "an activity timeout must be 1 to {MAX_TIMEOUT_S} seconds (ten years), not {}",
                self.timeout_s
            )));
        }
        if !(1..=1000).contains(&self.max_attempts) {
            return Err(JobsError::Invalid(format!(
                "max_attempts must be 1 to 1000, not {}",
                self.max_attempts
            )));
        }
        if self.backoff_base_ms > MAX_BACKOFF_MS {
            return Err(JobsError::Invalid(format!(
                "backoff_base_ms must be at most {MAX_BACKOFF_MS} (an hour), not {}",
                self.backoff_base_ms
            )));
        }
        if self.rate_per_s > 1_000_000 {
            return Err(JobsError::Invalid(format!(
                "rate_per_s must be at most 1000000 (0: no limit), not {}",
                self.rate_per_s
            )));
        }
        for (name, v) in [
            ("keep_finished_s", self.keep_finished_s),
            ("keep_failed_s", self.keep_failed_s),
        ] {
            if v > MAX_TIMEOUT_S {
                return Err(JobsError::Invalid(format!(
                    "{name} must be at most {MAX_TIMEOUT_S} seconds (ten years; 0: kept), not {v}"
                )));
            }
        }
        Ok(())
    }
}

/// A change of some of a type's settings (`None`: unchanged). Making a type needs
/// `timeout_s`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TypeUpdate {
    pub timeout_s: Option<u64>,
    pub max_attempts: Option<u32>,
    pub backoff_base_ms: Option<u64>,
    pub rate_per_s: Option<u32>,
    pub keep_finished_s: Option<u64>,
    pub keep_failed_s: Option<u64>,
}

impl TypeUpdate {
    fn apply(&self, s: &mut TypeSettings) {
        if let Some(v) = self.timeout_s {
            s.timeout_s = v;
        }
        if let Some(v) = self.max_attempts {
            s.max_attempts = v;
        }
        if let Some(v) = self.backoff_base_ms {
            s.backoff_base_ms = v;
        }
        if let Some(v) = self.rate_per_s {
            s.rate_per_s = v;
        }
        if let Some(v) = self.keep_finished_s {
            s.keep_finished_s = v;
        }
        if let Some(v) = self.keep_failed_s {
            s.keep_failed_s = v;
        }
    }
}

impl Jobs {
    /// Sets a type's activity timeout (whole seconds, at least 1), creating the type.
    pub async fn set_type_timeout(&self, ty: &str, timeout_s: u64) -> Result<()> {
        self.update_type(
            ty,
            &TypeUpdate {
                timeout_s: Some(timeout_s),
                ..Default::default()
            },
        )
        .await
        .map(drop)
    }

    /// Changes the settings `update` names, creating the type (which needs `timeout_s`).
    /// Returns the settings now in force. A refused value changes nothing.
    pub async fn update_type(&self, ty: &str, update: &TypeUpdate) -> Result<TypeSettings> {
        check_type(ty)?;
        let tp = type_path(ty);
        for _ in 0..MAX_OPTIMISTIC {
            let current = match self.tree.get(&tp).await? {
                Some(node) => Some((
                    parse_settings(&tp, node.data.as_deref())?,
                    node.stat.version,
                )),
                None => None,
            };
            let settings = match &current {
                Some((s, _)) => {
                    let mut s = s.clone();
                    update.apply(&mut s);
                    s
                }
                None => {
                    let Some(t) = update.timeout_s else {
                        return Err(JobsError::NoType(ty.into()));
                    };
                    let mut s = TypeSettings::new(t);
                    update.apply(&mut s);
                    s
                }
            };
            settings.check()?;
            let data = Some(serde_json::to_vec(&settings).expect("type settings are plain JSON"));
            let r = match current {
                Some((_, v)) => self.tree.multi(vec![Op::set(&tp, data, Some(v))]).await,
                None => {
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
                    let mut ops = vec![Op::create(&tp, data)];
                    ops.extend(type_dirs(ty).map(|d| Op::create(d, None)));
                    self.tree.multi(ops).await
                }
            };
            match r {
                Ok(_) => {
                    self.types
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(ty.into(), (Arc::new(settings.clone()), Instant::now()));
                    return Ok(settings);
                }
                Err(e) if is_race(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(JobsError::Conflict(tp))
    }

    /// A type's settings, read now.
    pub async fn read_type(&self, ty: &str) -> Result<TypeSettings> {
        check_type(ty)?;
        let tp = type_path(ty);
        let node = self
            .tree
            .get(&tp)
            .await?
            .ok_or_else(|| JobsError::NoType(ty.into()))?;
        parse_settings(&tp, node.data.as_deref())
    }

    /// A type's activity timeout in seconds.
    pub async fn get_type_timeout(&self, ty: &str) -> Result<u64> {
        Ok(self.read_type(ty).await?.timeout_s)
    }

    /// Every type with its settings, sorted by name.
    pub async fn types(&self) -> Result<Vec<(String, TypeSettings)>> {
        let mut names = match self.tree.children(ROOT).await {
            Err(TreeError::NoNode(_)) => return Ok(Vec::new()),
            r => r?,
        };
        names.sort();
        let mut out = Vec::new();
        for n in names {
            match self.read_type(&n).await {
                Ok(s) => out.push((n, s)),
                // Removed between the listing and the read.
                Err(JobsError::NoType(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}

fn parse_settings(path: &str, data: Option<&[u8]>) -> Result<TypeSettings> {
    lading_core::json::from_bytes(data.unwrap_or(b"null")).map_err(|e| JobsError::Corrupt {
        path: path.into(),
        reason: e.to_string(),
    })
}
