//! `lading bench bag`: a bag of F files, S bytes in all, with md5 and sha256 manifests,
//! validated by Lading (as Processing validates an unpacked bag) and by the Library of
//! Congress's `bagit.py --validate --processes 2`, alternately in the same run: MB/s of each,
//! their ratio, and Lading's peak memory while it validates.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// A size such as `1GiB`, `200MiB`, `64k` or `1000` (bytes).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits: String = t.chars().take_while(|c| c.is_ascii_digit()).collect();
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is not a size"))?;
    let unit = t[digits.len()..].trim().to_ascii_lowercase();
    let mul: u64 = match unit.trim_end_matches("ib").trim_end_matches('b') {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        _ => {
            return Err(format!(
                "{s:?}: unknown unit (k, M, G, T, with or without iB)"
            ));
        }
    };
    n.checked_mul(mul)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Writes `files` files of `size` bytes in all under `dir/data` (not compressible), and the
/// bag around them: `bagit.py --md5 --sha256` when there is one, else Lading's own manifests.
fn make_bag(dir: &Path, size: u64, files: usize) -> crate::Result<bool> {
    let data = dir.join("data");
    std::fs::create_dir_all(&data)?;
    let each = size / files as u64;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut buf = vec![0u8; 1 << 20];
    for i in 0..files {
        let mut f = std::io::BufWriter::new(std::fs::File::create(
            data.join(format!("d{}/f{i:05}.bin", i % 10)).tap_parent()?,
        )?);
        let mut left = if i + 1 == files {
            size - each * (files as u64 - 1)
        } else {
            each
        };
        while left > 0 {
            for chunk in buf.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
            }
            let n = left.min(buf.len() as u64) as usize;
            f.write_all(&buf[..n])?;
            left -= n as u64;
        }
        f.flush()?;
    }
    // bagit.py bags a folder in place: its contents move under data/.
    let staged = dir.with_extension("staging");
    std::fs::rename(&data, &staged)?;
    std::fs::remove_dir_all(dir).ok();
    std::fs::rename(&staged, dir)?;
    let made = std::process::Command::new("bagit.py")
        .args(["--quiet", "--md5", "--sha256", "--processes", "2"])
        .arg(dir)
        .status();
    Ok(matches!(made, Ok(s) if s.success()))
}

trait TapParent {
    fn tap_parent(self) -> std::io::Result<std::path::PathBuf>;
}

impl TapParent for std::path::PathBuf {
    /// The path, its folder made.
    fn tap_parent(self) -> std::io::Result<std::path::PathBuf> {
        if let Some(p) = self.parent() {
            std::fs::create_dir_all(p)?;
        }
        Ok(self)
    }
}

pub fn bag(size: u64, files: usize, rounds: usize, as_json: bool) -> crate::Result<()> {
    let files = files.max(1);
    let tmp = tempfile::Builder::new()
        .prefix("lading-bench-bag")
        .tempdir_in(std::env::var_os("TMPDIR").map_or_else(std::env::temp_dir, Into::into))?;
    let dir = tmp.path().join("benchbag");
    let started = Instant::now();
    if !make_bag(&dir, size, files)? {
        crate::error::bail!(
            "bagit.py (PyPI bagit) is needed to make the bench's bag and to compare with"
        );
    }
    let made_s = started.elapsed().as_secs_f64();
    let mb = |b: u64, s: f64| b as f64 / (1 << 20) as f64 / s.max(1e-9);
    let (mut lading, mut bagit, mut peaks) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds.max(1) {
        // Lading: peak memory from here (writing 5 to clear_refs resets VmHWM).
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        let rss0 = crate::http::proc_kib("VmRSS:");
        let t = Instant::now();
        let bag =
            lading_ingest::bagit::validate(&dir, "benchbag", "application/tar", &[], u64::MAX)
                .map_err(|p| {
                    crate::BenchError::Other(format!(
                        "Lading found the bench's bag invalid: {}",
                        p.join("; ")
                    ))
                })?;
        let s = t.elapsed().as_secs_f64();
        crate::error::ensure!(
            bag.payload_bytes == size,
            "validated {} bytes",
            bag.payload_bytes
        );
        lading.push(mb(size, s));
        peaks.push((rss0, crate::http::proc_kib("VmHWM:")));
        // bagit.py, the same bag, right after.
        let t = Instant::now();
        let st = std::process::Command::new("bagit.py")
            .args(["--quiet", "--validate", "--processes", "2"])
            .arg(&dir)
            .status()?;
        let s = t.elapsed().as_secs_f64();
        crate::error::ensure!(
            st.success(),
            "bagit.py --validate failed on the bench's bag"
        );
        bagit.push(mb(size, s));
    }
    let mut child = unsafe { std::mem::zeroed::<libc::rusage>() };
    // SAFETY: getrusage fills the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut child) };
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (l, b) = (median(&mut lading.clone()), median(&mut bagit.clone()));
    let peak = peaks.iter().map(|(_, p)| *p).max().unwrap_or(0);
    let base = peaks.iter().map(|(r, _)| *r).min().unwrap_or(0);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    if as_json {
        println!(
            "{}",
            serde_json::json!({
                "bytes": size, "files": files, "rounds": rounds.max(1),
                "algorithms": ["md5", "sha256"],
                "mb_per_s": l, "lading_mb_per_s": lading,
                "bagit_py_mb_per_s": b, "bagit_py_rounds_mb_per_s": bagit,
                "ratio": l / b,
                "peak_rss_mb": mib(peak), "rss_before_mb": mib(base),
                "bagit_py_peak_rss_mb": child.ru_maxrss as f64 / 1024.0,
                "make_s": made_s,
            })
        );
    } else {
        println!(
            "bag: {files} files, {:.0} MiB, md5 and sha256 manifests ({made_s:.1} s to make)",
            mib(size)
        );
        println!("  Lading validate       {l:.0} MB/s (rounds: {lading:.0?})");
        println!("  bagit.py --processes 2 {b:.0} MB/s (rounds: {bagit:.0?})");
        println!("  ratio                 {:.2}", l / b);
        println!(
            "  Lading peak RSS       {:.1} MiB ({:.1} MiB before); bagit.py's largest process {:.1} MiB",
            mib(peak),
            mib(base),
            child.ru_maxrss as f64 / 1024.0
        );
    }
    Ok(())
}
