// Shared by the build scripts of `delayd` and `delayctl` (each `include!`s it): names the git
// revision a binary is built from, for its `--version` (and delayd's `delayd_build_info`).
//
// `emit_git_sha("X_GIT_SHA")` sets `X_GIT_SHA` for the compiler to the commit's first 12 hex
// digits, or to `unknown` outside a git checkout (a source tarball) or without git. The same
// variable set in the build's environment wins (a packager that knows the revision).
//
// Cheap on purpose: Cargo is asked to rerun the script only when `HEAD` or the branch it
// points to moves, never on a source change, and only the binary crates include it, so a new
// commit recompiles their own few files and nothing else of the workspace. Uncommitted changes
// are not looked at (that would mean rerunning on every edit).

use std::path::{Path, PathBuf};
use std::process::Command;

fn emit_git_sha(var: &str) {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed={var}");
    let sha = match std::env::var(var) {
        Ok(sha) if !sha.trim().is_empty() => sha.trim().to_string(),
        _ => {
            watch_git_head();
            git(&["rev-parse", "--short=12", "HEAD"])
                .filter(|s| s.len() == 12 && s.bytes().all(|b| b.is_ascii_hexdigit()))
                .unwrap_or_else(|| "unknown".into())
        }
    };
    println!("cargo:rustc-env={var}={sha}");
}

/// The trimmed output of a successful `git` command run in the crate's directory.
fn git(args: &[&str]) -> Option<String> {
    let dir =
        std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(|| PathBuf::from("."), PathBuf::from);
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_string())
}

/// Asks Cargo to rerun the script when the commit checked out changes: `HEAD` itself (a
/// checkout or a detached commit) and, when it names a branch, that branch's ref — as a loose
/// file, or in `packed-refs` after `git gc`. In a linked worktree `HEAD` lives in the
/// worktree's own git directory and the refs in the common one. Only existing paths are
/// named: Cargo reruns a script on every build while a path it watches is missing.
fn watch_git_head() {
    let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]).map(PathBuf::from) else {
        return;
    };
    let common = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"])
        .map_or_else(|| git_dir.clone(), PathBuf::from);
    let head = git_dir.join("HEAD");
    watch(&head);
    let Some(branch) = std::fs::read_to_string(&head)
        .ok()
        .and_then(|h| h.strip_prefix("ref:").map(|r| r.trim().to_string()))
    else {
        return;
    };
    let loose = common.join(&branch);
    if loose.exists() {
        watch(&loose);
    } else if let Some(dir) = loose.parent() {
        // Packed for now; a commit writes the loose file into this directory.
        watch(dir);
    }
    watch(&common.join("packed-refs"));
}

fn watch(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
