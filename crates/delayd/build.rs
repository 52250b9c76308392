//! Sets `DELAYD_GIT_SHA`, the git revision `delayd --version` and the `delayd_build_info`
//! metric name (see `crates/build-support/git_sha.rs`).

include!("../build-support/git_sha.rs");

fn main() {
    println!("cargo:rerun-if-changed=../build-support/git_sha.rs");
    emit_git_sha("DELAYD_GIT_SHA");
}
