//! A process's memory and CPU time from `/proc` (Linux), for the benches that report a process's
//! own cost beside a baseline. Unreadable values are zero: a bench prints them rather than fail.

use std::time::Duration;

/// A `/proc/PID/status` field in KiB (`VmRSS`, `RssAnon`, …); zero when unreadable.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Resident memory of `pid` in KiB (`VmRSS`).
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS")
}

/// Resident memory of `pid` in MiB (`VmRSS`).
pub fn rss_mib(pid: u32) -> f64 {
    rss_kib(pid) as f64 / 1024.0
}

/// CPU time (user + system) `pid` has used so far, from `/proc/PID/stat`; zero when unreadable.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces: utime and
    // stime (fields 14 and 15) are the 12th and 13th of these.
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks: u64 = [11, 12].iter().filter_map(|&i| fields.get(i)?.parse::<u64>().ok()).sum();
    static TICKS_PER_SECOND: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let per_second = *TICKS_PER_SECOND.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<f64>().ok())
            .unwrap_or(100.0)
    });
    Duration::from_secs_f64(ticks as f64 / per_second)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_memory_and_cpu_time() {
        let pid = std::process::id();
        assert!(rss_kib(pid) > 0);
        assert!(status_kib(pid, "RssAnon") <= rss_kib(pid));
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(50) {
            std::hint::black_box(0u64);
        }
        assert!(cpu_time(pid) > Duration::ZERO);
        assert_eq!(rss_kib(u32::MAX), 0, "an unreadable process reads as zero");
    }
}
