//! File-system steps the stages share: atomic writes, durable folders, free space, listing and placing an object's files.

use super::*;

/// Writes through a temporary file and a rename, so a reader sees all or nothing (not
/// synced: callers that need durability sync what they wrote). The folder is made only when
/// it is missing: a `create_dir_all` before every write was two system calls (a `mkdir`
/// refused and a `statx`) for a folder that almost always exists.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    open_making_folder(&tmp, &opts)?.write_all(bytes)?;
    std::fs::rename(&tmp, path)
}

/// `path` opened with `opts`, its folder made first only when the open finds it missing.
pub fn open_making_folder(
    path: &Path,
    opts: &std::fs::OpenOptions,
) -> std::io::Result<std::fs::File> {
    match opts.open(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(p) = path.parent() {
                std::fs::create_dir_all(p)?;
            }
            opts.open(path)
        }
        r => r,
    }
}

/// Marks `dir` as the top of a directory hierarchy (ext4's `T` attribute, what `chattr +T`
/// sets), so the file system spreads the folders made in it — one per job, one per object —
/// across its block groups instead of packing them all into the group of `dir`.
///
/// Why: new files go into the block group of their folder, and a file system without a
/// journal makes every new inode step over the free ones deleted in that group in the last
/// `dirty_expire` interval. Working folders are made and removed all day, so packed into one
/// group each new job pays for every recent cleanup (measured: `bench pipeline` spent 40% of
/// its time there on a busy folder). Returns whether the attribute is set now; a file system
/// without it (`ENOTTY`, `EOPNOTSUPP`, `EINVAL`) is not an error.
pub fn spread_subdirs(dir: &Path) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    let d = std::fs::File::open(dir)?;
    let Some(flags) = inode_flags(&d)? else {
        return Ok(false);
    };
    if flags & TOPDIR != 0 {
        return Ok(true);
    }
    let flags = flags | TOPDIR;
    // SAFETY: FS_IOC_SETFLAGS reads one int from `flags`; `d` is open.
    if unsafe { libc::ioctl(d.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags) } != 0 {
        return unsupported::<()>(std::io::Error::last_os_error()).map(|_| false);
    }
    Ok(true)
}

/// `FS_TOPDIR_FL` in `linux/fs.h`.
pub(crate) const TOPDIR: libc::c_int = 0x0002_0000;

/// The inode flags of `f` (what `lsattr` shows); `None` where the file system has none.
pub(crate) fn inode_flags(f: &std::fs::File) -> std::io::Result<Option<libc::c_int>> {
    use std::os::fd::AsRawFd;
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int into `flags`, which we own; `f` is open.
    if unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) } != 0 {
        return unsupported(std::io::Error::last_os_error());
    }
    Ok(Some(flags))
}

/// `Ok(None)` for the errors of a file system without inode flags, `Err` for the others.
pub(crate) fn unsupported<T>(e: std::io::Error) -> std::io::Result<Option<T>> {
    match e.raw_os_error() {
        Some(libc::ENOTTY | libc::EOPNOTSUPP | libc::EINVAL) => Ok(None),
        _ => Err(e),
    }
}

/// Fsyncs `dir` and every folder under it, so the names of files synced inside are durable
/// too.
pub fn sync_dirs(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            sync_dirs(&e.path())?;
        }
    }
    std::fs::File::open(dir)?.sync_all()
}

/// `statvfs` of the file system holding `path`.
pub(crate) fn statvfs(path: &Path) -> std::io::Result<libc::statvfs> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("path contains NUL"))?;
    // SAFETY: statvfs writes into the zeroed struct we own; `c` is a valid C string.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(s)
}

/// Free bytes for unprivileged users on the file system holding `path`.
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    let s = statvfs(path)?;
    Ok((s.f_bavail as u64).saturating_mul(s.f_frsize as u64))
}

/// Size of the file system holding `path`, as unprivileged users can use it.
pub fn total_bytes(path: &Path) -> std::io::Result<u64> {
    let s = statvfs(path)?;
    // Blocks reserved for root are not ours.
    let reserved = (s.f_bfree as u64).saturating_sub(s.f_bavail as u64);
    Ok((s.f_blocks as u64)
        .saturating_sub(reserved)
        .saturating_mul(s.f_frsize as u64))
}

/// Places the files of `from` under `to`: a hard link where both are on one file system (no
/// second copy of the bytes, no new inode), a copy otherwise (or when `link` is false). Safe
/// because nothing rewrites a working file in place: downloads, unpacking and manifests all
/// write a temporary file and rename it. Returns how many files were linked and copied.
pub(crate) fn place_tree(from: &Path, to: &Path, link: bool) -> std::io::Result<(u64, u64)> {
    std::fs::create_dir_all(to)?;
    let (mut linked, mut copied) = (0, 0);
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let t = e.file_type()?;
        let dest = to.join(e.file_name());
        if t.is_dir() {
            let (l, c) = place_tree(&e.path(), &dest, link)?;
            linked += l;
            copied += c;
        } else if t.is_file() {
            if link && std::fs::hard_link(e.path(), &dest).is_ok() {
                linked += 1;
            } else {
                std::fs::copy(e.path(), &dest)?;
                copied += 1;
            }
            // Only this version's own data is flushed (a file-system-wide sync would also
            // wait for every other job's writes).
            std::fs::File::open(&dest)?.sync_data()?;
        }
    }
    Ok((linked, copied))
}

/// Replaces each file under `dir` whose bytes a file of `earlier` (the object's version
/// before, at any path) holds with a hard link to that file, so a new version on the storage
/// root does not store its unchanged files twice (a later deletion of either version leaves
/// the other's link whole). Compared by size, then by the SHA-256 of both, read here rather
/// than trusted from a record. Returns how many files were linked.
pub(crate) fn link_unchanged(dir: &Path, earlier: &Path) -> std::io::Result<usize> {
    use std::collections::HashMap;
    use std::os::unix::fs::MetadataExt;
    let mut by_size: HashMap<u64, Vec<PathBuf>> = HashMap::new();
    for (rel, path, size) in crate::files::files(earlier)? {
        if rel != crate::files::VERSION_FILE {
            by_size.entry(size).or_default().push(path);
        }
    }
    let mut digests: HashMap<PathBuf, String> = HashMap::new();
    let mut linked = 0;
    for (_, path, size) in crate::files::files(dir)? {
        let Some(candidates) = by_size.get(&size) else {
            continue;
        };
        let mine = std::fs::metadata(&path)?;
        let digest = crate::files::file_sha256(&path)?.1;
        for c in candidates {
            let theirs = std::fs::metadata(c)?;
            if (theirs.dev(), theirs.ino()) == (mine.dev(), mine.ino()) {
                break;
            }
            if !digests.contains_key(c) {
                digests.insert(c.clone(), crate::files::file_sha256(c)?.1);
            }
            if digests.get(c) == Some(&digest) {
                let tmp = path.with_extension("carry-tmp");
                let _ = std::fs::remove_file(&tmp);
                std::fs::hard_link(c, &tmp)?;
                std::fs::rename(&tmp, &path)?;
                linked += 1;
                break;
            }
        }
    }
    Ok(linked)
}

/// The process's file-creation mask (set by the `lading` binary): files 0600, folders 0700.
pub const DEFAULT_UMASK: u32 = 0o077;

/// Sets the modes of everything under `dir` (and `dir`) as `umask` would have made them.
pub(crate) fn set_modes(dir: &Path, umask: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777 & !umask))?;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let t = e.file_type()?;
        if t.is_dir() {
            set_modes(&e.path(), umask)?;
        } else if t.is_file() {
            std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o666 & !umask))?;
        }
    }
    Ok(())
}
