//! Sets `DELAYCTL_GIT_SHA`, the git revision `delayctl --version` names (see
//! `crates/build-support/git_sha.rs`).

include!("../build-support/git_sha.rs");

fn main() {
    println!("cargo:rerun-if-changed=../build-support/git_sha.rs");
    emit_git_sha("DELAYCTL_GIT_SHA");
}
