//! Records the git commit the binary is built from, for `lading --version`.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(&dir)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    println!(
        "cargo:rustc-env=LADING_COMMIT={commit}{}",
        if dirty { "-modified" } else { "" }
    );
    // Rebuilt when HEAD moves (a commit, a checkout).
    let watch = |p: String| {
        // Relative to the crate, or absolute (a worktree): `join` keeps an absolute path.
        let p = std::path::Path::new(&dir).join(p);
        println!("cargo:rerun-if-changed={}", p.display());
    };
    if let Some(head) = git(&["rev-parse", "--git-path", "HEAD"]) {
        watch(head);
    }
    if let Some(refs) = git(&["rev-parse", "--symbolic-full-name", "HEAD"])
        && let Some(path) = git(&["rev-parse", "--git-path", &refs])
    {
        watch(path);
    }
    println!("cargo:rerun-if-changed=build.rs");
}
