//! Deliberate bugs, one per guarantee, for the simulator (`lading-sim --sabotage NAME`) to
//! prove it finds them. They exist only in a build with the `sabotage` feature, which no
//! normal build turns on; without it [`on`] is a constant `false` and the code it guards is
//! removed by the compiler.

/// A move of a leased job skips the lock: no session check, no lock check, no status
/// version.
pub const NO_FENCING: u32 = 1;
/// A job's move writes its status and its state references in two commits.
pub const SPLIT_MOVE: u32 = 2;
/// The move of a batch to Reporting ignores the status version it read.
pub const REPORT_UNGUARDED: u32 = 4;
/// A waiting worker does not watch its state folder: it misses the wake-up of a job
/// arriving and sees it only at its next periodic look.
pub const LOST_WAKEUP: u32 = 8;
/// A generic-jobs acceptor counts its accepts against the type's rate limit without the
/// version of the count it read: acceptors racing in one second each take the room left.
pub const RATE_UNGUARDED: u32 = 16;
/// Storing does not look for the version its job already stored: a job whose store is
/// retried (its process crashed, or its session ended, before the move on) stores again.
pub const STORE_TWICE: u32 = 32;
/// A waiting worker does not watch the locks of the busy jobs it found: a job whose holder
/// lets it go without moving it (a retry deferred, a lease given up) waits for the waiter's
/// periodic look. Caught by the simulator's lock probe (a job whose holder's process
/// crashes under it, at the end of each seed), since its periodic look is past the run.
pub const LOST_LOCK_WAKEUP: u32 = 64;
/// Waking a deferred job does not signal this process's waiters: one woken by the wake's
/// own commit, that looked before the deferral was forgotten, waits for its periodic look.
pub const LOST_WAKE_SIGNAL: u32 = 128;
/// A waiter that finds nothing free polls (one read of the tree) and looks again at once
/// instead of waiting: the simulated clock never moves, which the simulator's watchdog
/// reports (a livelock like seed 2005835's ends its run with a violation, not never).
pub const BUSY_WAIT: u32 = 256;
/// A waiter that finds nothing free looks again at once, reading nothing: a loop that never
/// reaches the tree, so the simulated clock's watchdog never sees it and the run never ends;
/// `lading-sim`'s stall monitor names the seed and ends the process instead.
pub const BUSY_SPIN: u32 = 512;

/// Every sabotage, by the name `--sabotage` takes.
pub const NAMES: &[(&str, u32)] = &[
    ("no-fencing", NO_FENCING),
    ("split-move", SPLIT_MOVE),
    ("report-unguarded", REPORT_UNGUARDED),
    ("lost-wakeup", LOST_WAKEUP),
    ("rate-unguarded", RATE_UNGUARDED),
    ("store-twice", STORE_TWICE),
    ("lost-lock-wakeup", LOST_LOCK_WAKEUP),
    ("lost-wake-signal", LOST_WAKE_SIGNAL),
    ("busy-wait", BUSY_WAIT),
    ("busy-spin", BUSY_SPIN),
];

#[cfg(feature = "sabotage")]
static ON: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Whether the sabotage `flag` is on (never, without the feature).
#[inline(always)]
pub fn on(flag: u32) -> bool {
    #[cfg(feature = "sabotage")]
    {
        ON.load(std::sync::atomic::Ordering::Relaxed) & flag != 0
    }
    #[cfg(not(feature = "sabotage"))]
    {
        let _ = flag;
        false
    }
}

/// Turns on the sabotage called `name`, for the whole process.
pub fn set(name: &str) -> Result<(), String> {
    let Some((_, flag)) = NAMES.iter().find(|(n, _)| *n == name) else {
        return Err(format!(
            "no sabotage {name:?}; there are {}",
            NAMES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
        ));
    };
    #[cfg(feature = "sabotage")]
    {
        ON.fetch_or(*flag, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
    #[cfg(not(feature = "sabotage"))]
    {
        let _ = flag;
        Err("this build has no sabotage: build with --features sabotage".into())
    }
}
