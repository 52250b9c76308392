//! Gives `delayctl --version` the git revision it was built from.
//!
//! Sets `DELAYCTL_GIT_SHA` for the compiler: `git rev-parse --short=12 HEAD`, or `unknown`
//! outside a git checkout (a source tarball) or without git. Cargo is asked to run this
//! again when HEAD moves — a commit, a checkout — by watching the checkout's `HEAD` file,
//! the ref it points to and `packed-refs`. In a worktree `HEAD` lives in the worktree's own
//! git directory and the refs in the common one, hence both `--git-dir` and
//! `--git-common-dir`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    let dir = manifest_dir.unwrap_or_else(|| PathBuf::from("."));
    let sha = git(&dir, &["rev-parse", "--short=12", "HEAD"])
        .filter(|s| s.len() == 12 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=DELAYCTL_GIT_SHA={sha}");
    if let (Some(git_dir), Some(common_dir)) =
        (git(&dir, &["rev-parse", "--git-dir"]), git(&dir, &["rev-parse", "--git-common-dir"]))
    {
        let git_dir = dir.join(git_dir);
        let common_dir = dir.join(common_dir);
        let head = git_dir.join("HEAD");
        watch(&head);
        // `ref: refs/heads/main` when on a branch; a detached HEAD names the commit itself.
        let target = std::fs::read_to_string(&head).ok();
        if let Some(name) = target.as_deref().and_then(|t| t.trim().strip_prefix("ref: ")) {
            let branch = common_dir.join(name);
            if branch.exists() {
                watch(&branch);
            } else if let Some(parent) = branch.parent() {
                // Packed for now: the next commit writes it loose, into this directory.
                watch(parent);
            }
        }
        watch(&common_dir.join("packed-refs"));
    }
}

/// Watches `path` (a file, or a directory and all below it) if it exists: cargo would
/// rebuild on every run for one that does not.
fn watch(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

/// The trimmed output of `git <args>` run in `dir`, if it succeeded.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8(out.stdout).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}
