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

/// CPU time as [`cpu_ticks`], plus that of the children `pid` has waited for: a server's
/// work done in a child process (Redis rewrites its AOF in one) counts once the server has
/// reaped the child.
pub fn cpu_ticks_with_children(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_field_sum(&stat, 14..=17)
}

/// User + system CPU ticks from the text of a process's or a thread's `stat`.
pub fn stat_ticks(stat: &str) -> Option<u64> {
    stat_field_sum(stat, 14..=15)
}

/// The sum of `stat`'s numeric fields `fields` (numbered from 1, as in proc(5)).
fn stat_field_sum(stat: &str, fields: std::ops::RangeInclusive<usize>) -> Option<u64> {
    // The command name (field 2) is in parentheses and may hold spaces: count fields after
    // its closing parenthesis, where field 3 (state) is the first.
    let after: Vec<&str> = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().collect();
    fields.map(|n| after.get(n - 3)?.parse::<u64>().ok()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fields 14 to 17 are the process's user and system time and those of the children it
    /// waited for; the name in parentheses may hold spaces and parentheses.
    #[test]
    fn own_and_reaped_childrens_ticks_are_read_after_the_name() {
        let stat = "4242 (redis (x) server) S 1 4242 4242 0 -1 4194560 900 0 0 0 100 20 300 4 20 0";
        assert_eq!(stat_ticks(stat), Some(120));
        assert_eq!(stat_field_sum(stat, 14..=17), Some(424));
        assert_eq!(stat_ticks("4242 (short) S 1 2"), None);
    }
}
