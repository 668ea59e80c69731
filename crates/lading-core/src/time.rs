//! Time, injected. Everything that reads the clock takes a [`Clock`], so tests can set time
//! instead of sleeping; timestamps are written the way Merritt writes them
//! (`2026-11-21 14:03:07 +0000`) and read in that form or RFC 3339.

use crate::BoxFuture;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;

    /// For a clock that moves on its own schedule (a test's [`ManualClock`]): a future that
    /// completes once the clock reads at least `ms`. `None` for the real clock: whoever
    /// waits for a time sleeps for the difference on the runtime's timer.
    fn reaches(self: Arc<Self>, _ms: u64) -> Option<BoxFuture<'static, ()>> {
        None
    }
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to; whoever waits for a time on it (see
/// [`Clock::reaches`]) is woken when it is moved there.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
    /// Wakers of futures waiting for the clock to reach their time.
    waiting: Mutex<Vec<Waker>>,
}

impl ManualClock {
    pub fn new(start_ms: u64) -> Arc<Self> {
        Arc::new(ManualClock {
            now: AtomicU64::new(start_ms),
            waiting: Mutex::default(),
        })
    }
    pub fn advance_ms(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
        // Each looks at the new time itself, and waits again if it is not there yet.
        let woken = std::mem::take(&mut *self.waiting.lock().unwrap_or_else(|p| p.into_inner()));
        woken.into_iter().for_each(Waker::wake);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }

    fn reaches(self: Arc<Self>, ms: u64) -> Option<BoxFuture<'static, ()>> {
        Some(Box::pin(std::future::poll_fn(
            move |cx: &mut Context<'_>| {
                // Registered before the time is read: an advance in between still wakes it.
                let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
                if !waiting.iter().any(|w| w.will_wake(cx.waker())) {
                    waiting.push(cx.waker().clone());
                }
                drop(waiting);
                if self.now_ms() >= ms {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            },
        )))
    }
}

pub type SharedClock = Arc<dyn Clock>;

pub fn system_clock() -> SharedClock {
    Arc::new(SystemClock)
}

/// This process's CPU time so far, (user, system) in seconds, from `/proc/self/stat`
/// (every thread's); (0, 0) where it cannot be read. What the benchmarks and the simulator
/// divide by the work done: the machine's other load moves it less than a rate does.
pub fn process_cpu() -> (f64, f64) {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return (0.0, 0.0);
    };
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return (0.0, 0.0);
    };
    let f: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the command name; in
    // clock ticks, which are 100 per second on Linux.
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) / 100.0, ticks(12) / 100.0)
}

// Civil-date conversion after Howard Hinnant's `days_from_civil` / `civil_from_days`.
/// Days since 1970-01-01 of a date.
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date `(year, month, day)` of day `z` since 1970-01-01.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

/// Formats epoch milliseconds as `yyyy-MM-dd HH:mm:ss +0000` (UTC).
pub fn format_ts(ms: u64) -> String {
    match ts_bytes(ms) {
        Some(b) => String::from_utf8_lossy(&b).into_owned(),
        None => formatted_ts(ms),
    }
}

/// [`format_ts`] through `format!`: years after 9999, and what the fast form is checked by.
fn formatted_ts(ms: u64) -> String {
    let secs = (ms / 1000) as i64;
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{mo:02}-{d:02} {:02}:{:02}:{:02} +0000",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// [`format_ts`] written digit by digit, for years of four digits (`None` after 9999): a
/// time is shown in every event and transition id, and `format!` made it 3% of a
/// simulator run's instructions.
fn ts_bytes(ms: u64) -> Option<[u8; 25]> {
    let secs = ms / 1000;
    let (y, mo, d) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    let y = u32::try_from(y).ok().filter(|y| *y <= 9999)?;
    let mut b = *b"0000-00-00 00:00:00 +0000";
    let mut put = |at: usize, v: u32, width: usize| {
        let mut v = v;
        for i in (at..at + width).rev() {
            b[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, y, 4);
    put(5, mo, 2);
    put(8, d, 2);
    put(11, (rem / 3600) as u32, 2);
    put(14, (rem % 3600 / 60) as u32, 2);
    put(17, (rem % 60) as u32, 2);
    Some(b)
}

/// When something happened, as Lading's records give it (`yyyy-MM-dd HH:mm:ss +0000`, whole
/// seconds): a time Lading wrote, kept as its seconds since the epoch and written out only
/// when shown, or a time an older writer wrote as text, kept as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stamp {
    Secs(u64),
    Text(String),
}

impl Stamp {
    /// The whole second `ms` falls in.
    pub fn at_ms(ms: u64) -> Stamp {
        Stamp::Secs(ms / 1000)
    }

    /// Milliseconds since the epoch (a whole second); 0 for text that is not a time.
    pub fn ms(&self) -> u64 {
        match self {
            Stamp::Secs(s) => s * 1000,
            Stamp::Text(t) => parse_ts(t).unwrap_or(0),
        }
    }
}

impl std::fmt::Display for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stamp::Secs(s) => match ts_bytes(s.saturating_mul(1000)) {
                Some(b) => f.write_str(std::str::from_utf8(&b).map_err(|_| std::fmt::Error)?),
                None => f.write_str(&formatted_ts(s.saturating_mul(1000))),
            },
            Stamp::Text(t) => f.write_str(t),
        }
    }
}

impl serde::Serialize for Stamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Formats epoch milliseconds as RFC 3339 in UTC, `yyyy-MM-ddTHH:mm:ssZ`.
pub fn format_rfc3339(ms: u64) -> String {
    let t = format_ts(ms);
    format!("{}T{}Z", &t[..10], &t[11..19])
}

/// Parses `yyyy-MM-dd HH:mm:ss ±hhmm` (Merritt's form) or RFC 3339
/// (`yyyy-MM-ddTHH:mm:ss[.fff](Z|±hh:mm)`) into epoch milliseconds.
pub fn parse_ts(s: &str) -> Option<u64> {
    let s = s.trim();
    let b = s.as_bytes();
    if b.len() < 19
        || b[4] != b'-'
        || b[7] != b'-'
        || !(b[10] == b' ' || b[10] == b'T' || b[10] == b't')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let part = s.get(r)?;
        if part.bytes().all(|c| c.is_ascii_digit()) {
            part.parse().ok()
        } else {
            None
        }
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let mut rest = &s[19..];
    let mut millis = 0u64;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let padded = format!("{:0<3}", &frac[..digits.min(3)]);
        millis = padded.parse().ok()?;
        rest = &frac[digits..];
    }
    let rest = rest.trim_start();
    let offset_secs: i64 = if rest.eq_ignore_ascii_case("z") {
        0
    } else {
        let sign = match rest.as_bytes().first()? {
            b'+' => 1,
            b'-' => -1,
            _ => return None,
        };
        let digits: String = rest[1..].chars().filter(|c| *c != ':').collect();
        if digits.len() != 4 || !digits.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        let oh: i64 = digits[..2].parse().ok()?;
        let om: i64 = digits[2..].parse().ok()?;
        sign * (oh * 3600 + om * 60)
    };
    let days = days_from_civil(y as i64, mo, d);
    let secs = days * 86_400 + (h * 3600 + mi * 60 + se) as i64 - offset_secs;
    u64::try_from(secs).ok().map(|s| s * 1000 + millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_wakes_whoever_waits_for_a_time_when_moved_there() {
        use std::sync::atomic::AtomicUsize;
        use std::task::Wake;
        struct Count(AtomicUsize);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let clock = ManualClock::new(1_000);
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut until = clock
            .clone()
            .reaches(1_500)
            .expect("a manual clock can be waited on");
        assert!(until.as_mut().poll(&mut cx).is_pending());
        assert!(
            until.as_mut().poll(&mut cx).is_pending(),
            "polled twice, one waker kept"
        );
        clock.advance_ms(499);
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken to look");
        assert!(until.as_mut().poll(&mut cx).is_pending(), "not there yet");
        clock.advance_ms(1);
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert!(until.as_mut().poll(&mut cx).is_ready());
        assert!(SystemClock.now_ms() > 0);
        assert!(
            Arc::new(SystemClock).reaches(0).is_none(),
            "the real clock is slept on"
        );
    }

    #[test]
    fn formats_like_merritt() {
        assert_eq!(format_ts(0), "1970-01-01 00:00:00 +0000");
        // 2026-11-21 14:03:07 UTC
        assert_eq!(format_ts(1_795_269_787_000), "2026-11-21 14:03:07 +0000");
        assert_eq!(format_rfc3339(1_795_269_787_000), "2026-11-21T14:03:07Z");
        assert_eq!(
            parse_ts(&format_rfc3339(1_795_269_787_000)),
            Some(1_795_269_787_000)
        );
    }

    #[test]
    fn parses_both_forms() {
        let ms = 1_795_269_787_000;
        assert_eq!(parse_ts("2026-11-21 14:03:07 +0000"), Some(ms));
        assert_eq!(parse_ts("2026-11-21 06:03:07 -0800"), Some(ms));
        assert_eq!(parse_ts("2026-11-21T14:03:07Z"), Some(ms));
        assert_eq!(parse_ts("2026-11-21T15:03:07.250+01:00"), Some(ms + 250));
        assert_eq!(parse_ts("2026-13-21 14:03:07 +0000"), None);
        assert_eq!(parse_ts("yesterday"), None);
    }

    #[test]
    fn formats_digit_by_digit_as_format_would() {
        let slow = formatted_ts;
        let last = 253_402_300_799_000; // 9999-12-31 23:59:59
        for ms in (0..last)
            .step_by(86_400_000 * 13 + 3_601_999)
            .chain([last, last + 1000])
        {
            assert_eq!(format_ts(ms), slow(ms), "{ms}");
            assert_eq!(Stamp::Secs(ms / 1000).to_string(), slow(ms), "{ms}");
        }
        assert_eq!(format_ts(last + 1000), "10000-01-01 00:00:00 +0000");
    }

    #[test]
    fn round_trips_over_a_range_of_days() {
        for day in (0..40_000u64).step_by(37) {
            let ms = day * 86_400_000 + 45_296_000;
            assert_eq!(parse_ts(&format_ts(ms)), Some(ms));
        }
    }
}
