//! The generic cell rate algorithm (GCRA, ITU-T I.371; the "virtual scheduling" form), in integer
//! nanoseconds: the token bucket both the XDP program (per-prefix SYN budget, churn guard) and the
//! daemon's configuration share. A bucket is one number, its theoretical arrival time (TAT).

/// The nanoseconds between two tokens for `rate` tokens per second, rounded up (so the bucket
/// never refills faster than configured), at least 1. Rates at or below zero (or NaN) give
/// `u64::MAX`, with which [`take`] never grants a token.
pub fn interval_ns(rate_per_s: f64) -> u64 {
    if rate_per_s.is_nan() || rate_per_s <= 0.0 {
        return u64::MAX;
    }
    let exact = 1e9 / rate_per_s;
    // `f64::ceil` needs std: truncate (the cast saturates) and round up by hand.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "exact is positive; `as` saturates at u64::MAX; the comparison only detects a fraction"
    )]
    let ns = {
        let t = exact as u64;
        if (t as f64) < exact {
            t.saturating_add(1)
        } else {
            t
        }
    };
    ns.max(1)
}

/// The tolerance of a bucket of `burst` tokens refilled every `interval_ns`: `burst × interval`,
/// saturating.
pub const fn tolerance_ns(interval_ns: u64, burst: u32) -> u64 {
    interval_ns.saturating_mul(burst as u64)
}

/// Takes one token at `now`: `Some(new_tat)` to store when the bucket had one, `None` when it was
/// empty (the state is then unchanged).
///
/// A fresh bucket (TAT 0, or any TAT in the past) is full: exactly `burst` calls at the same
/// instant succeed, the next one fails, and one more succeeds every `interval_ns` after that.
/// Arithmetic that would overflow `u64` refuses the token instead of wrapping.
pub const fn take(tat_ns: u64, now_ns: u64, interval_ns: u64, tolerance_ns: u64) -> Option<u64> {
    let start = if tat_ns > now_ns { tat_ns } else { now_ns };
    // `start + interval_ns` overflows exactly when `interval_ns > u64::MAX - start` (`!start`).
    // Tested so rather than with `checked_add`, whose overflow flag LLVM's BPF backend makes a
    // 0/1 value and then tests (five instructions for this comparison's three), on every SYN the
    // XDP program counts; `start + interval_ns < start` is folded back into `checked_add`'s form.
    if interval_ns > !start {
        return None;
    }
    let next = start + interval_ns;
    if next - now_ns > tolerance_ns {
        None
    } else {
        Some(next)
    }
}

/// How far `tat_ns` lies ahead of `now_ns`: the bucket's deficit in nanoseconds (0 when it is
/// full). A bucket of `burst` tokens holds `burst - deficit / interval` tokens.
pub const fn deficit_ns(tat_ns: u64, now_ns: u64) -> u64 {
    tat_ns.saturating_sub(now_ns)
}

/// Whether `n` tokens are available at `now_ns` in a bucket of `burst` tokens refilled every
/// `interval_ns`: `deficit ≤ (burst - n) × interval`. `n = 1` is exactly the condition under
/// which [`take`] grants a token; `n > burst` is never available.
pub const fn available(tat_ns: u64, now_ns: u64, interval_ns: u64, burst: u32, n: u64) -> bool {
    let Some(spare) = (burst as u64).checked_sub(n) else {
        return false;
    };
    deficit_ns(tat_ns, now_ns) <= spare.saturating_mul(interval_ns)
}

/// Nanoseconds from `now_ns` until `n` tokens are available (0 if they are now), exact: after
/// that long, [`available`] holds if nothing was spent meanwhile. `u64::MAX` when `n > burst`.
pub const fn wait_ns(tat_ns: u64, now_ns: u64, interval_ns: u64, burst: u32, n: u64) -> u64 {
    let Some(spare) = (burst as u64).checked_sub(n) else {
        return u64::MAX;
    };
    deficit_ns(tat_ns, now_ns).saturating_sub(spare.saturating_mul(interval_ns))
}

/// Spends one token at `now_ns` whether or not one is available (the caller checked, or is
/// settling a token it held): the new TAT, `max(tat, now) + interval`, saturating.
pub const fn spend(tat_ns: u64, now_ns: u64, interval_ns: u64) -> u64 {
    let start = if tat_ns > now_ns { tat_ns } else { now_ns };
    start.saturating_add(interval_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_burst_at_one_instant_then_one_per_interval() {
        let interval = interval_ns(10.0);
        assert_eq!(interval, 100_000_000);
        let tol = tolerance_ns(interval, 5);
        let now = 7_000_000_000;
        let mut tat = 0;
        for i in 0..5 {
            tat = take(tat, now, interval, tol).unwrap_or_else(|| panic!("token {i}"));
        }
        assert_eq!(take(tat, now, interval, tol), None);
        assert_eq!(take(tat, now + interval - 1, interval, tol), None);
        let tat = take(tat, now + interval, interval, tol).unwrap();
        assert_eq!(take(tat, now + interval, interval, tol), None);
    }

    #[test]
    fn degenerate_rates_never_refill_and_never_overflow() {
        assert_eq!(interval_ns(0.0), u64::MAX);
        assert_eq!(interval_ns(-1.0), u64::MAX);
        assert_eq!(interval_ns(f64::NAN), u64::MAX);
        assert_eq!(interval_ns(1e12), 1);
        let tol = tolerance_ns(u64::MAX, 3);
        assert_eq!(tol, u64::MAX);
        assert_eq!(
            take(0, 5, u64::MAX, tol),
            None,
            "a zero rate grants nothing"
        );
        assert_eq!(take(u64::MAX - 1, 5, 10, u64::MAX), None, "no wrap-around");
    }

    /// Any of a value's edges (0, 1, `u64::MAX - 1`, `u64::MAX`) or any value at all.
    fn edgy() -> impl proptest::strategy::Strategy<Value = u64> {
        use proptest::prelude::*;
        prop_oneof![
            Just(0),
            Just(1),
            Just(u64::MAX - 1),
            Just(u64::MAX),
            any::<u64>()
        ]
    }

    proptest::proptest! {
        /// `take` is the GCRA of its doc in exact (128-bit) arithmetic: a token when
        /// `max(tat, now) + interval - now <= tolerance` and the new TAT fits in `u64`, and then
        /// that TAT; never a wrapped one.
        #[test]
        fn take_is_the_exact_gcra(tat in edgy(), now in edgy(), interval in edgy(), tolerance in edgy()) {
            let next = u128::from(tat.max(now)) + u128::from(interval);
            let exact = (next <= u128::from(u64::MAX)
                && next - u128::from(now) <= u128::from(tolerance))
            .then(|| u64::try_from(next).unwrap_or(u64::MAX));
            proptest::prop_assert_eq!(take(tat, now, interval, tolerance), exact);
        }
    }

    #[test]
    fn available_and_take_agree_and_wait_is_exact() {
        let interval = 1_000;
        let burst = 4;
        let tol = tolerance_ns(interval, burst);
        let mut tat = 0;
        let now = 50_000;
        for _ in 0..burst {
            assert!(available(tat, now, interval, burst, 1));
            tat = take(tat, now, interval, tol).unwrap();
            assert_eq!(tat, spend(tat - interval, now, interval));
        }
        assert!(!available(tat, now, interval, burst, 1));
        let wait = wait_ns(tat, now, interval, burst, 2);
        assert_eq!(wait, 2 * interval);
        assert!(!available(tat, now + wait - 1, interval, burst, 2));
        assert!(available(tat, now + wait, interval, burst, 2));
        assert!(!available(0, now, interval, burst, u64::from(burst) + 1));
        assert_eq!(wait_ns(0, now, interval, burst, 5), u64::MAX);
    }
}
