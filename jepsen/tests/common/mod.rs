//! What the tests against the real `delayd` binary share.

use std::path::PathBuf;

/// The delayd binary: `DELAYD_BIN`, or `target/debug/delayd` next to the test binary; `None`
/// when there is neither (the tests then pass with a note).
pub fn delayd_bin() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("DELAYD_BIN") {
        return Some(PathBuf::from(p));
    }
    // target/debug/deps/<test>-… → target/debug/delayd
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.parent()?.join("delayd");
    bin.is_file().then_some(bin)
}

/// A scratch directory of this test process, named after `name`.
pub fn work_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("delayd-jepsen-{name}-{}", std::process::id()))
}
