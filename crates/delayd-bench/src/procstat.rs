//! CPU time of processes, from `/proc/<pid>/stat`: what the cluster bench measures the
//! servers and itself with, and what `delayd-apply-bench` measures itself with (it includes
//! this file as a module of its own: the crate has no library).

/// Clock ticks per second of `/proc/<pid>/stat`'s CPU times: `getconf CLK_TCK`, read once;
/// 100 (what Linux reports everywhere in practice) if that cannot be run.
pub fn clock_ticks_per_s() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// CPU time (user + system, all threads) that process `pid` (or `self`) has used so far, in
/// clock ticks, from `/proc/<pid>/stat`.
pub fn cpu_ticks(pid: &str) -> Option<u64> {
    stat_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// User + system CPU ticks from the text of a process's or a thread's `stat`.
pub fn stat_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may hold spaces: count fields after
    // its closing parenthesis, where field 3 (state) is the first.
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().collect();
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    Some(utime + stime)
}
