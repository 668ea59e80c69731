//! Schedules (an extension of couch_jobs): a job added per tick, every N seconds or on a cron
//! expression (UTC), by whichever activity monitor gets there first.
//!
//! A schedule is a node `/generic-jobs/TYPE/schedules/NAME` holding its last tick. A monitor
//! that finds a tick due writes, in one `multi`, the schedule's new last tick (against the
//! version it read), the job `NAME@TICK` (TICK in seconds since the epoch) and its pending
//! entry. Of monitors racing on any number of hosts exactly one `multi` succeeds, so each
//! tick adds one job. Ticks missed while no monitor ran are not made up: the latest one due
//! is added, once.

use super::*;
use lading_core::time::{civil_from_days, days_from_civil};

/// Most schedules a type may have.
pub const MAX_SCHEDULES: usize = 1000;

/// When a schedule ticks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Every {
    /// At every multiple of this many seconds since the epoch.
    Seconds(u64),
    /// On a cron expression, UTC.
    Cron(Cron),
}

impl Every {
    /// The first tick strictly after `ms` (ms).
    pub fn next_after(&self, ms: u64) -> u64 {
        match self {
            Every::Seconds(s) => {
                let step = s * 1000;
                (ms / step + 1) * step
            }
            Every::Cron(c) => c.next_after(ms),
        }
    }
}

/// A schedule as stored.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The data of each job it adds.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub data: Value,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: i32,
    /// The last tick a job was added for (ms); before the first, when it was made.
    pub last_tick_ms: u64,
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub extra: serde_json::Map<String, Value>,
}

/// A schedule as the API and `lading jobs schedules` show it: as stored, with its `name` and
/// `next_tick_ms` (none when its rule no longer parses).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleView {
    pub name: String,
    pub next_tick_ms: Option<u64>,
    #[serde(flatten)]
    pub schedule: Schedule,
}

impl Schedule {
    /// The schedule as the API and `lading jobs schedules` show it.
    pub fn view(&self, name: &str) -> ScheduleView {
        ScheduleView {
            name: name.into(),
            next_tick_ms: self.next_tick_ms(),
            schedule: self.clone(),
        }
    }

    pub fn every(&self) -> Result<Every> {
        match (self.every_s, &self.cron) {
            (Some(s), None) if (1..=MAX_TIMEOUT_S).contains(&s) => Ok(Every::Seconds(s)),
            (None, Some(c)) => Ok(Every::Cron(Cron::parse(c)?)),
            _ => Err(JobsError::Invalid(
                "a schedule has either every_s (1 second to ten years) or cron".into(),
            )),
        }
    }

    /// The next tick after the last (ms).
    pub fn next_tick_ms(&self) -> Option<u64> {
        self.every().ok().map(|e| e.next_after(self.last_tick_ms))
    }
}

/// The id of the job a schedule adds for a tick.
pub fn tick_id(name: &str, tick_ms: u64) -> String {
    format!("{name}@{}", tick_ms / 1000)
}

/// A cron expression: `minute hour day-of-month month day-of-week`, each `*`, a number, a
/// range `a-b`, any of those with a step `/n`, or a comma-separated list of them. Days of
/// the week are 0–7 (0 and 7 are Sunday). As in cron, when both day fields are restricted a
/// day matching either is a match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cron {
    /// The expression as given.
    pub source: String,
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    days_any: bool,
    weekdays_any: bool,
}

impl Cron {
    pub fn parse(expr: &str) -> Result<Cron> {
        let fields: Vec<&str> = expr.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(JobsError::Invalid(format!(
                "cron expression {expr:?} has {} fields; it needs 5: minute hour day-of-month month day-of-week",
                fields.len()
            )));
        }
        let mut weekdays = field(fields[4], "day of week", 0, 7)?;
        if weekdays & (1 << 7) != 0 {
            weekdays = (weekdays | 1) & !(1 << 7);
        }
        Ok(Cron {
            source: fields.join(" "),
            minutes: field(fields[0], "minute", 0, 59)?,
            hours: field(fields[1], "hour", 0, 23)?,
            days: field(fields[2], "day of month", 1, 31)?,
            months: field(fields[3], "month", 1, 12)?,
            weekdays,
            days_any: fields[2] == "*",
            weekdays_any: fields[4] == "*",
        })
    }

    /// The first matching minute strictly after `ms` (ms). A day never matching (February
    /// 30th) gives a time more than ten years ahead: never, in practice.
    pub fn next_after(&self, ms: u64) -> u64 {
        let mut t = (ms / 60_000 + 1) as i64; // minutes since the epoch
        // Each step moves to the next month, day, hour or minute that can match: a few
        // hundred steps at most for a year.
        for _ in 0..100_000 {
            let day = t.div_euclid(1440);
            let (y, m, d) = civil_from_days(day);
            if self.months & (1 << m) == 0 {
                let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                t = days_from_civil(ny, nm, 1) * 1440;
                continue;
            }
            let weekday = (day + 4).rem_euclid(7) as u32; // 1970-01-01 was a Thursday
            let dom = self.days & (1 << d) != 0;
            let dow = self.weekdays & (1 << weekday) != 0;
            let day_ok = match (self.days_any, self.weekdays_any) {
                (true, true) => true,
                (false, true) => dom,
                (true, false) => dow,
                (false, false) => dom || dow,
            };
            if !day_ok {
                t = (day + 1) * 1440;
                continue;
            }
            let minute_of_day = t.rem_euclid(1440);
            if self.hours & (1 << (minute_of_day / 60)) == 0 {
                t = (t / 60 + 1) * 60;
                continue;
            }
            if self.minutes & (1 << (minute_of_day % 60)) == 0 {
                t += 1;
                continue;
            }
            return t as u64 * 60_000;
        }
        u64::MAX / 2
    }
}

/// One cron field as a bit set of the values it matches.
fn field(text: &str, what: &str, lo: u32, hi: u32) -> Result<u64> {
    let bad = |why: String| JobsError::Invalid(format!("cron {what} {text:?}: {why}"));
    let num = |s: &str| -> Result<u32> {
        let n: u32 = s
            .parse()
            .map_err(|_| bad(format!("{s:?} is not a number")))?;
        if n < lo || n > hi {
            return Err(bad(format!("{n} is outside {lo}-{hi}")));
        }
        Ok(n)
    };
    let mut bits = 0u64;
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => {
                let s: u32 = s
                    .parse()
                    .ok()
                    .filter(|s| *s >= 1)
                    .ok_or_else(|| bad(format!("step {s:?} is not a number of at least 1")))?;
                (r, s)
            }
            None => (item, 1),
        };
        let (a, b) = match range {
            "*" => (lo, hi),
            r => match r.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None if step > 1 => (num(r)?, hi),
                None => {
                    let n = num(r)?;
                    (n, n)
                }
            },
        };
        if a > b {
            return Err(bad(format!("range {a}-{b} runs backwards")));
        }
        for v in (a..=b).step_by(step as usize) {
            bits |= 1 << v;
        }
    }
    Ok(bits)
}

fn schedule_path(ty: &str, name: &str) -> String {
    concat(&[ROOT, "/", ty, "/schedules/", name])
}

impl Jobs {
    /// Makes (or replaces) schedule `name` of `ty`. A replaced schedule keeps its last tick,
    /// so the tick in progress is not added twice.
    pub async fn set_schedule(
        &self,
        ty: &str,
        name: &str,
        every: Every,
        data: Value,
        priority: i32,
    ) -> Result<Schedule> {
        check_type(ty)?;
        check_name(name, "schedule name", MAX_TYPE, "._-")?;
        check_priority(priority)?;
        self.require_type(ty).await?;
        let (every_s, cron) = match &every {
            Every::Seconds(s) if (1..=MAX_TIMEOUT_S).contains(s) => (Some(*s), None),
            Every::Seconds(s) => {
                return Err(JobsError::Invalid(format!(
                    "a schedule's interval must be 1 to {MAX_TIMEOUT_S} seconds, not {s}"
                )));
            }
            Every::Cron(c) => (None, Some(c.clone())),
        };
        let path = schedule_path(ty, name);
        for _ in 0..MAX_OPTIMISTIC {
            let now = self.now_ms();
            let current = self.read_schedule(ty, name).await?;
            let (last_tick_ms, op_version) = match &current {
                Some((s, v)) => (s.last_tick_ms, Some(*v)),
                None => {
                    let n = self.tree.count_children(&schedules_dir(ty)).await?;
                    if n as usize >= MAX_SCHEDULES {
                        return Err(JobsError::Invalid(format!(
                            "type {ty:?} has {n} schedules, the most it may have; remove some first"
                        )));
                    }
                    (now, None)
                }
            };
            let sched = Schedule {
                every_s,
                cron: cron.as_ref().map(|c| c.source.clone()),
                data: data.clone(),
                priority,
                last_tick_ms,
                extra: Default::default(),
            };
            let bytes = Some(serde_json::to_vec(&sched).expect("a schedule is plain JSON"));
            let op = match op_version {
                Some(v) => Op::set(&path, bytes, Some(v)),
                None => Op::create(&path, bytes),
            };
            match self.tree.multi(vec![op]).await {
                Ok(_) => return Ok(sched),
                Err(e) if is_race(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(JobsError::Conflict(path))
    }

    async fn read_schedule(&self, ty: &str, name: &str) -> Result<Option<(Schedule, i32)>> {
        let path = schedule_path(ty, name);
        let Some(node) = self.tree.get(&path).await? else {
            return Ok(None);
        };
        let s = lading_core::json::from_bytes(node.data.as_deref().unwrap_or(b"null")).map_err(
            |e| JobsError::Corrupt {
                path,
                reason: e.to_string(),
            },
        )?;
        Ok(Some((s, node.stat.version)))
    }

    /// A type's schedules, by name.
    pub async fn schedules(&self, ty: &str) -> Result<Vec<(String, Schedule)>> {
        self.require_type(ty).await?;
        let mut names = self.tree.children(&schedules_dir(ty)).await?;
        names.sort();
        let mut out = Vec::new();
        for n in names {
            if let Some((s, _)) = self.read_schedule(ty, &n).await? {
                out.push((n, s));
            }
        }
        Ok(out)
    }

    /// Removes a schedule (the jobs it added stay).
    pub async fn remove_schedule(&self, ty: &str, name: &str) -> Result<()> {
        check_type(ty)?;
        check_name(name, "schedule name", MAX_TYPE, "._-")?;
        match self.tree.delete(&schedule_path(ty, name), None).await {
            Ok(()) => Ok(()),
            Err(TreeError::NoNode(_)) => Err(JobsError::NoSchedule {
                ty: ty.into(),
                name: name.into(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// One pass over every schedule of `ty`: for each with a tick due, adds its job (the
    /// latest tick due) unless another monitor did. Returns the jobs this call added, and
    /// the time of the earliest tick not yet due.
    pub(crate) async fn tick_schedules(&self, ty: &str) -> Result<(usize, Option<u64>)> {
        let mut added = 0;
        let mut next: Option<u64> = None;
        let dir = schedules_dir(ty);
        let names = match self.tree.children(&dir).await {
            Err(TreeError::NoNode(_)) => return Ok((0, None)),
            r => r?,
        };
        for name in names {
            for _ in 0..MAX_OPTIMISTIC {
                let Some((mut sched, v)) = self.read_schedule(ty, &name).await? else {
                    break;
                };
                let Ok(every) = sched.every() else {
                    tracing::warn!(ty, name, "schedule with neither every_s nor cron: skipped");
                    break;
                };
                let now = self.now_ms();
                let mut tick = every.next_after(sched.last_tick_ms);
                if tick > now {
                    next = Some(next.map_or(tick, |n| n.min(tick)));
                    break;
                }
                // Ticks missed while no monitor ran are not made up: the latest due only.
                for _ in 0..100_000 {
                    let t = every.next_after(tick);
                    if t > now {
                        break;
                    }
                    tick = t;
                }
                sched.last_tick_ms = tick;
                let id = tick_id(&name, tick);
                let set = Op::set(
                    schedule_path(ty, &name),
                    Some(serde_json::to_vec(&sched).expect("a schedule is plain JSON")),
                    Some(v),
                );
                let rec = Record::new(sched.data.clone(), tick, sched.priority, now);
                let with_job = vec![
                    set.clone(),
                    Op::create(job_path(ty, &id), Some(rec.to_bytes())),
                    Op::create(pending_path(ty, sched.priority, tick, &id), None),
                ];
                match self.tree.multi(with_job).await {
                    Ok(_) => {
                        added += 1;
                        tracing::info!(ty, schedule = name, job = id, "schedule: job added");
                        break;
                    }
                    // The job exists (added by hand, or left from before): the tick is
                    // spent all the same.
                    Err(e)
                        if matches!(e.root(), TreeError::NodeExists(_))
                            && e.failed_op() == Some(1) =>
                    {
                        match self.tree.multi(vec![set]).await {
                            Ok(_) => break,
                            Err(e) if is_race(&e) => continue,
                            Err(e) => return Err(e.into()),
                        }
                    }
                    // Another monitor took the tick (or changed the schedule): read again.
                    Err(e) if is_race(&e) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok((added, next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(y: i64, mo: u32, d: u32, h: u64, mi: u64) -> u64 {
        days_from_civil(y, mo, d) as u64 * 86_400_000 + h * 3_600_000 + mi * 60_000
    }

    #[test]
    fn cron_finds_the_next_matching_minute() {
        let c = Cron::parse("*/15 * * * *").unwrap();
        assert_eq!(
            c.next_after(ms(2026, 11, 25, 10, 7)),
            ms(2026, 11, 25, 10, 15)
        );
        assert_eq!(
            c.next_after(ms(2026, 11, 25, 10, 15)),
            ms(2026, 11, 25, 10, 30)
        );
        let c = Cron::parse("30 2 * * 1-5").unwrap(); // 02:30 on weekdays
        // 2026-11-27 is a Friday: the next is Monday the 30th.
        assert_eq!(
            c.next_after(ms(2026, 11, 27, 3, 0)),
            ms(2026, 11, 30, 2, 30)
        );
        let c = Cron::parse("0 0 1 1 *").unwrap();
        assert_eq!(c.next_after(ms(2026, 6, 1, 0, 0)), ms(2027, 1, 1, 0, 0));
        let c = Cron::parse("0 12 29 2 *").unwrap();
        assert_eq!(c.next_after(ms(2026, 3, 1, 0, 0)), ms(2028, 2, 29, 12, 0));
        // Sunday as 7 and as 0.
        let c = Cron::parse("0 0 * * 7").unwrap();
        assert_eq!(c.next_after(ms(2026, 11, 25, 0, 0)), ms(2026, 11, 29, 0, 0));
        for bad in [
            "* * * *",
            "60 * * * *",
            "* 24 * * *",
            "5-1 * * * *",
            "*/0 * * * *",
            "x * * * *",
        ] {
            let e = Cron::parse(bad).unwrap_err().to_string();
            assert!(e.contains("cron"), "{bad}: {e}");
        }
        assert_eq!(
            Every::Seconds(60).next_after(ms(2026, 1, 1, 0, 0) + 1),
            ms(2026, 1, 1, 0, 1)
        );
    }
}
