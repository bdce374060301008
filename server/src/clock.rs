//! A cheap clock for per-request bookkeeping (a client's last command, the
//! rate limit of log events): the monotonic clock at the kernel's tick
//! resolution (1–4 ms), which the vDSO answers from memory without reading
//! the (virtualised, on a VM costly) time-stamp counter. Measuring anything
//! shorter than a few milliseconds uses `Instant`.

/// Milliseconds on the coarse monotonic clock (an arbitrary origin).
pub fn coarse_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the timespec it is given, which
    // lives on this stack for the whole call.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    if r != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1000) + ts.tv_nsec as u64 / 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coarse_ms_moves_with_time() {
        let a = coarse_ms();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let b = coarse_ms();
        assert!(a > 0 && b >= a + 20 && b < a + 1000, "{a} {b}");
    }
}
