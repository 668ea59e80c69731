//! `lading-sim`: a whole Lading deployment on simulated time, from a seed.
//!
//! ```text
//! cargo run --release -p lading-sim -- --seeds 300 [--from S]
//! cargo run --release -p lading-sim -- --seed S --trace
//! cargo run --release -p lading-sim --features sabotage -- --seeds 2000 --sabotage no-fencing
//! ```
//! Options: `--nodes N` (3), `--batches N` (20), `--no-faults`, `--threads N` (the machine's
//! cores: seeds are independent, each on a runtime of its own; the output is in seed order),
//! `--hashes` (a line per seed with its steps and trace hash: two runs of one range must print
//! the same lines).
//! `LADING_SIM_LOG=debug`: the processes' own logs, to stderr. `LADING_SIM_CALLS=1`: every
//! call on the simulated tree counted by kind and path (ids shown as `*`), printed at the end:
//! where a seed's round trips go; a commit the tree refused (a lock another session holds, a
//! version check that failed; not one lost to a fault) is counted again as `refused`. With
//! `LADING_SIM_CALLERS=TEXT` as well, the calls whose line contains TEXT are counted per
//! caller (the first Lading frames of a backtrace; build with `--profile profiling` for
//! names).
//! Exit status 1 when any seed broke an invariant, 3 when a seed was stuck: no commit on its
//! simulated tree for 120 s of real time (`LADING_SIM_STALL_S` sets another figure), a loop
//! that never yields or never reaches the tree, which the simulated clock's own watchdog
//! cannot see; each seed stuck is named with the command that replays it, while the other
//! threads' seeds run on.

use lading_sim::sim::{Options, run};

/// mimalloc, as the `lading` binary: with glibc's allocator a fifth of a run was malloc and
/// free (perf, 20 seeds).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::process::ExitCode;
use std::time::Instant;

fn usage() -> ExitCode {
    eprintln!(
        "usage: lading-sim (--seeds N [--from S] | --seed S [--trace]) [--nodes N] [--batches N] \
         [--no-faults] [--sabotage NAME] [--stop-at-first] [--threads N] [--hashes]"
    );
    ExitCode::from(2)
}

/// What the command line asked for.
struct Args {
    opts: Options,
    first: u64,
    count: u64,
    sabotage: Option<String>,
    stop_first: bool,
    hashes: bool,
    threads: usize,
}

/// The command line read; `Err` with the exit code when it is wrong.
fn parse(args: &[String]) -> Result<Args, ExitCode> {
    let mut opts = Options::default();
    let (mut seeds, mut from, mut one, mut sabotage, mut stop_first) =
        (None, None, None, None, false);
    let mut hashes = false;
    let mut threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut i = 0;
    while i < args.len() {
        let val = |i: usize| args.get(i + 1).and_then(|v| v.parse::<u64>().ok());
        let flag = match args[i].as_str() {
            "--seeds" => {
                seeds = val(i);
                false
            }
            "--from" => {
                from = val(i);
                false
            }
            "--seed" => {
                one = val(i);
                false
            }
            "--nodes" => {
                opts.nodes = val(i).unwrap_or(3).max(1) as usize;
                false
            }
            "--batches" => {
                opts.batches = val(i).unwrap_or(20) as usize;
                false
            }
            "--threads" => {
                threads = val(i).unwrap_or(1).max(1) as usize;
                false
            }
            "--sabotage" => {
                sabotage = args.get(i + 1).cloned();
                false
            }
            "--trace" => {
                opts.trace = true;
                true
            }
            "--no-faults" => {
                opts.faults = false;
                true
            }
            "--hashes" => {
                hashes = true;
                true
            }
            "--stop-at-first" => {
                stop_first = true;
                true
            }
            _ => return Err(usage()),
        };
        if flag {
            i += 1;
            continue;
        }
        if args.get(i + 1).is_none() {
            return Err(usage());
        }
        i += 2;
    }
    let (first, count) = match (one, seeds) {
        (Some(s), _) => (s, 1),
        (None, Some(n)) => (from.unwrap_or_else(random_base), n),
        (None, None) => return Err(usage()),
    };
    Ok(Args {
        opts,
        first,
        count,
        sabotage,
        stop_first,
        hashes,
        threads,
    })
}

/// The command that replays `seed` with its trace, in the shape it ran in.
fn replay(a: &Args, seed: u64) -> String {
    let features = if a.sabotage.is_some() {
        " --features sabotage"
    } else {
        ""
    };
    let sab = a
        .sabotage
        .as_ref()
        .map(|s| format!(" --sabotage {s}"))
        .unwrap_or_default();
    let mut shape = String::new();
    if a.opts.nodes != 3 {
        shape += &format!(" --nodes {}", a.opts.nodes);
    }
    if a.opts.batches != 20 {
        shape += &format!(" --batches {}", a.opts.batches);
    }
    if !a.opts.faults {
        shape += " --no-faults";
    }
    format!("cargo run --release -p lading-sim{features} -- --seed {seed} --trace{sab}{shape}")
}

/// Real time without a commit on a thread's simulated trees after which the seed it runs is
/// taken to be stuck (a whole seed takes well under a second); `LADING_SIM_STALL_S` sets
/// another.
const STALL: std::time::Duration = std::time::Duration::from_secs(120);

fn stall() -> std::time::Duration {
    std::env::var("LADING_SIM_STALL_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(STALL, std::time::Duration::from_secs)
}

/// A thread running seeds: the seed it runs (`u64::MAX`: none), and the commits on its
/// simulated trees so far (see `tree::count_commits_into`).
struct Slot {
    seed: std::sync::atomic::AtomicU64,
    commits: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Slot {
    fn idle() -> Slot {
        Slot {
            seed: std::sync::atomic::AtomicU64::new(u64::MAX),
            commits: Default::default(),
        }
    }
}

/// Until every thread is done (`alive` disconnects): when a thread's simulated trees have
/// not committed for [`STALL`] while it runs the same seed, names that seed and ends the
/// process (exit status 3). Thread by thread: a seed stuck beside others that run on is named
/// in time too.
fn monitor(a: &Args, slots: &[Slot], alive: std::sync::mpsc::Receiver<()>) {
    use std::sync::mpsc::RecvTimeoutError;
    let stall = stall();
    let mut seen = Seen::new(slots, Instant::now());
    while let Err(RecvTimeoutError::Timeout) = alive.recv_timeout(stall / 24) {
        let stuck = seen.stuck(slots, stall, Instant::now());
        if stuck.is_empty() {
            continue;
        }
        for seed in stuck {
            println!(
                "seed {seed}: stuck (no commit on its simulated tree for {} s of real time)\n  replay: {}",
                stall.as_secs(),
                replay(a, seed)
            );
        }
        std::process::exit(3);
    }
}

/// What the monitor last saw of each thread (its seed and commits) and since when.
struct Seen(Vec<((u64, u64), Instant)>);

impl Seen {
    fn look(s: &Slot) -> (u64, u64) {
        use std::sync::atomic::Ordering::SeqCst;
        (s.seed.load(SeqCst), s.commits.load(SeqCst))
    }

    fn new(slots: &[Slot], now: Instant) -> Seen {
        Seen(slots.iter().map(|s| (Seen::look(s), now)).collect())
    }

    /// The seeds of the threads that have run the same seed without a commit for `stall`.
    fn stuck(&mut self, slots: &[Slot], stall: std::time::Duration, now: Instant) -> Vec<u64> {
        let mut stuck = Vec::new();
        for (slot, (last, since)) in slots.iter().zip(self.0.iter_mut()) {
            let seen = Seen::look(slot);
            if seen != *last {
                (*last, *since) = (seen, now);
            } else if seen.0 != u64::MAX && now.duration_since(*since) >= stall {
                stuck.push(seen.0);
            }
        }
        stuck
    }
}

/// Every seed asked for, on `threads` threads (each seed on a runtime of its own), in seed
/// order whatever order the threads ended them in; a stuck seed ends the process
/// ([`monitor`]).
fn run_all(a: &Args) -> Vec<(u64, lading_sim::sim::Run)> {
    let end = a.first.saturating_add(a.count);
    let next = std::sync::atomic::AtomicU64::new(a.first);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (tx, rx) = std::sync::mpsc::channel();
    let threads = a.threads.min(a.count.max(1) as usize);
    let slots: Vec<Slot> = (0..threads).map(|_| Slot::idle()).collect();
    let (alive, all_done) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        scope.spawn(|| monitor(a, &slots, all_done));
        for slot in &slots {
            let (tx, next, stop, alive) = (tx.clone(), &next, &stop, alive.clone());
            scope.spawn(move || {
                // Held while this thread runs seeds: the monitor ends once every one is gone.
                let _alive = alive;
                use std::sync::atomic::Ordering::SeqCst;
                lading_sim::tree::count_commits_into(slot.commits.clone());
                while !stop.load(SeqCst) {
                    let seed = next.fetch_add(1, SeqCst);
                    if seed >= end {
                        break;
                    }
                    slot.seed.store(seed, SeqCst);
                    let r = run(seed, &a.opts);
                    slot.seed.store(u64::MAX, SeqCst);
                    if a.stop_first && !r.violations.is_empty() {
                        stop.store(true, SeqCst);
                    }
                    if tx.send((seed, r)).is_err() {
                        break;
                    }
                }
            });
        }
        drop((tx, alive));
    });
    let mut results: Vec<_> = rx.into_iter().collect();
    results.sort_by_key(|(seed, _)| *seed);
    results
}

fn main() -> ExitCode {
    // `LADING_SIM_LOG=debug`: the processes' own logs, to stderr.
    if let Ok(filter) = std::env::var("LADING_SIM_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a = match parse(&args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    if let Some(name) = &a.sabotage
        && let Err(e) = lading_engine::sabotage::set(name)
    {
        eprintln!("lading-sim: {e}");
        return ExitCode::from(2);
    }
    let began = Instant::now();
    let (mut sim_ms, mut steps, mut jobs, mut stored, mut bad, mut first_bad) =
        (0u64, 0u64, 0usize, 0usize, 0u64, None);
    let mut done = 0;
    for (seed, r) in run_all(&a) {
        done += 1;
        sim_ms += r.sim_ms;
        steps += r.steps;
        jobs += r.jobs;
        stored += r.stored;
        if a.hashes {
            println!(
                "seed {seed}: steps {} stored {} trace hash {:016x}",
                r.steps, r.stored, r.trace_hash
            );
        }
        if let Some(full) = &r.full {
            for l in full {
                println!("{l}");
            }
            println!("trace hash {:016x}", r.trace_hash);
        }
        if !r.violations.is_empty() {
            bad += 1;
            first_bad.get_or_insert(seed);
            println!(
                "seed {seed}: {} violation(s); the first: {}",
                r.violations.len(),
                r.violations[0]
            );
            if r.full.is_none() {
                println!("  the last steps:");
                for l in &r.tail {
                    println!("    {l}");
                }
            }
            println!("  replay: {}", replay(&a, seed));
            if a.stop_first {
                break;
            }
        }
    }
    let took = began.elapsed().as_secs_f64();
    let (user, system) = lading_core::time::process_cpu();
    let cpu_ms = (user + system) * 1000.0;
    println!(
        "seeds {done} (from {}), simulated {:.1} h, steps {steps}, jobs {jobs} ({stored} stored and checked), violations {bad}{}, {:.1} seeds/s, {:.2} ms of CPU per job",
        a.first,
        sim_ms as f64 / 3_600_000.0,
        first_bad
            .map(|s| format!(" (first at seed {s}, after {} seeds)", s - a.first + 1))
            .unwrap_or_default(),
        done as f64 / took.max(1e-9),
        cpu_ms / jobs.max(1) as f64
    );
    print_tree_calls();
    if bad > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// The tree calls counted (when the build counts them), by kind.
fn print_tree_calls() {
    if let Some(calls) = &*lading_sim::tree::CALLS {
        let calls = calls.lock().unwrap_or_else(|p| p.into_inner());
        let mut rows: Vec<_> = calls.iter().collect();
        rows.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let sum = |refused: bool| -> u64 {
            rows.iter()
                .filter(|r| r.0.starts_with("refused ") == refused)
                .map(|r| r.1)
                .sum()
        };
        eprintln!(
            "tree calls: {} (commits refused: {})",
            sum(false),
            sum(true)
        );
        for (k, n) in rows {
            eprintln!("{n:>9} {k}");
        }
    }
}

/// A base seed nobody chose: the time and the process id.
fn random_base() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    (t ^ ((std::process::id() as u64) << 32)) % 1_000_000_000
}

#[cfg(test)]
mod tests {
    use super::{Seen, Slot};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    use std::time::{Duration, Instant};

    fn slot(seed: u64) -> (Slot, Arc<AtomicU64>) {
        let s = Slot::idle();
        s.seed.store(seed, SeqCst);
        let commits = s.commits.clone();
        (s, commits)
    }

    /// A thread whose seed stops committing is named once the stall has passed, while the
    /// other thread goes on committing (the monitor counted all threads together before, so
    /// a stuck seed was named only when every other thread had run out of seeds); a thread
    /// that moved to another seed, or runs none, is not.
    #[test]
    fn a_seed_stuck_beside_running_ones_is_named() {
        let stall = Duration::from_secs(120);
        let (stuck, _) = slot(7);
        let (busy, busy_commits) = slot(8);
        let (idle, _) = slot(u64::MAX);
        let (moving, _) = slot(10);
        let slots = [stuck, busy, idle, moving];
        let t0 = Instant::now();
        let mut seen = Seen::new(&slots, t0);
        for minute in 1..=2u64 {
            busy_commits.fetch_add(1, SeqCst);
            slots[3].seed.store(10 + minute, SeqCst);
            let at = t0 + Duration::from_secs(60 * minute);
            let named = seen.stuck(&slots, stall, at);
            assert_eq!(named, if minute == 2 { vec![7] } else { vec![] });
        }
    }
}
