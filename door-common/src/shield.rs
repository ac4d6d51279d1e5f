//! Layouts of the shield's configuration and guard maps (docs/design.md, "Flood shield").

use crate::PrefixState;

/// [`ShieldConfig::flags`]: the daemon has written this configuration. Without it the program only
/// observes (counts SYNs per prefix on every port, drops nothing).
pub const CONFIG_WRITTEN: u64 = 1;
/// [`ShieldConfig::flags`]: every destination port is protected (`ports = []`).
pub const CONFIG_ALL_PORTS: u64 = 2;

/// [`ShieldConfig::flags`]: the exempt trie has entries (otherwise the program skips the lookup).
pub const CONFIG_HAS_EXEMPT: u64 = 4;
/// [`ShieldConfig::flags`]: the blocklist may have entries (set by the daemon right after its
/// first insert; the program skips the lookup while it is clear).
pub const CONFIG_HAS_BLOCKLIST: u64 = 8;

/// [`ShieldConfig::flags`]: cookie mode is enabled (`[xdp] syn_cookies = "auto"`): while this
/// CPU's SYN rate is over its share of `cookie_threshold`, SYNs that passed every other check are
/// answered with a SYN-ACK carrying a SYN cookie.
pub const CONFIG_COOKIES: u64 = 16;

/// [`ShieldConfig::flags`]: the lists filter ([`crate::list_filter`]) holds the bits of the lists
/// trie's entries under [`ShieldConfig::lead_mask_v4`] and [`ShieldConfig::lead_mask_v6`]: a source
/// whose bit is clear is on no list, and the trie is not walked. Clear while the daemon changes
/// the trie (every source walks it then).
pub const CONFIG_LIST_FILTER: u64 = 32;

/// Words of the destination-port bitmap (65,536 bits).
pub const PORT_WORDS: usize = 1_024;

/// The shield's settings, written by the daemon into [`crate::MAP_CONFIG`] at start (and on
/// reload); read by the program on every SYN.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShieldConfig {
    /// [`CONFIG_WRITTEN`] | [`CONFIG_ALL_PORTS`] | [`CONFIG_HAS_EXEMPT`] | [`CONFIG_HAS_BLOCKLIST`]
    /// | [`CONFIG_COOKIES`] | [`CONFIG_LIST_FILTER`].
    pub flags: u64,
    /// Nanoseconds between two SYN tokens of a prefix (`[xdp] syn_rate`, see
    /// [`crate::gcra::interval_ns`]).
    pub syn_interval_ns: u64,
    /// `syn_burst × syn_interval_ns`, nanoseconds.
    pub syn_tolerance_ns: u64,
    /// Nanoseconds between two new-prefix tokens of the churn guard (`[xdp] new_prefix_rate`);
    /// 0 disables the guard.
    pub new_prefix_interval_ns: u64,
    /// `new_prefix_burst × new_prefix_interval_ns`, nanoseconds.
    pub new_prefix_tolerance_ns: u64,
    /// Nanoseconds between two tokens of the overflow bucket shared by new prefixes while the
    /// churn guard is closed (`[xdp] overflow_syn_rate`).
    pub overflow_interval_ns: u64,
    /// `overflow_syn_burst × overflow_interval_ns`, nanoseconds.
    pub overflow_tolerance_ns: u64,
    /// Nanoseconds between two tokens of each CPU's cookie-mode bucket: this CPU's share of
    /// `[xdp] cookie_threshold` (the threshold divided by the number of possible CPUs). Read only
    /// with [`CONFIG_COOKIES`].
    pub cookie_interval_ns: u64,
    /// Tolerance of the cookie-mode bucket, nanoseconds (one second's worth of tokens, at least one
    /// interval): how long the rate may stay over the threshold before cookie mode starts.
    pub cookie_tolerance_ns: u64,
    /// Interval of the bucket that ends cookie mode: 80% of the cookie-mode rate, nanoseconds.
    pub cookie_leave_interval_ns: u64,
    /// Tolerance of the bucket that ends cookie mode, nanoseconds.
    pub cookie_leave_tolerance_ns: u64,
    /// How long the SYN rate must stay within the leave bucket before cookie mode ends, ns.
    pub cookie_hold_ns: u64,
    /// The lists filter's lead mask for IPv4 sources: [`crate::list_filter::lead_mask`] of the
    /// shortest IPv4 network listed, over [`crate::list_filter::lead_v4`]'s 64 bits (the address
    /// in the top 32); read only with [`CONFIG_LIST_FILTER`].
    pub lead_mask_v4: u64,
    /// The lists filter's lead mask for IPv6 sources, as [`ShieldConfig::lead_mask_v4`].
    pub lead_mask_v6: u64,
    /// Protected destination ports, one bit each: port `p` is bit `p % 64` of word `p / 64`.
    pub ports: [u64; PORT_WORDS],
}

const _: () = assert!(size_of::<ShieldConfig>() == 14 * 8 + PORT_WORDS * 8);

impl ShieldConfig {
    /// A configuration with no port protected and the guard off (flags: written).
    pub const fn new(syn_interval_ns: u64, syn_tolerance_ns: u64) -> Self {
        Self {
            flags: CONFIG_WRITTEN,
            syn_interval_ns,
            syn_tolerance_ns,
            new_prefix_interval_ns: 0,
            new_prefix_tolerance_ns: 0,
            overflow_interval_ns: syn_interval_ns,
            overflow_tolerance_ns: syn_tolerance_ns,
            cookie_interval_ns: 0,
            cookie_tolerance_ns: 0,
            cookie_leave_interval_ns: 0,
            cookie_leave_tolerance_ns: 0,
            cookie_hold_ns: 0,
            lead_mask_v4: 0,
            lead_mask_v6: 0,
            ports: [0; PORT_WORDS],
        }
    }

    /// Marks `port` protected.
    pub fn protect(&mut self, port: u16) {
        if let Some(word) = self.ports.get_mut(usize::from(port / 64)) {
            *word |= 1 << (port % 64);
        }
    }

    /// Whether `port` is protected (every port is when [`CONFIG_ALL_PORTS`] is set).
    pub fn is_protected(&self, port: u16) -> bool {
        self.flags & CONFIG_ALL_PORTS != 0
            || self
                .ports
                .get(usize::from(port / 64))
                .is_some_and(|w| w & (1 << (port % 64)) != 0)
    }
}

/// The churn guard (docs/design.md, "Flood shield"; compare Katran's flood guard): a bucket of
/// new-prefix tokens, and the one overflow bucket shared by every new prefix that arrives when it
/// is empty.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuardState {
    /// Theoretical arrival time of the new-prefix bucket, `bpf_ktime_get_coarse_ns` clock, ns.
    pub new_prefix_tat_ns: u64,
    /// The shared overflow bucket: SYN counts, drops and its SYN-bucket TAT.
    pub overflow: PrefixState,
}

const _: () = assert!(size_of::<GuardState>() == 40);

/// One CPU's cookie-mode state, in the per-CPU array [`crate::MAP_COOKIE`] (entry 0). Each CPU
/// decides on its own from the SYNs it sees, so no two CPUs write the same value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CookieState {
    /// 1 while this CPU is in cookie mode, 0 otherwise.
    pub active: u64,
    /// Theoretical arrival time of the bucket that starts cookie mode, ns.
    pub tat_ns: u64,
    /// Theoretical arrival time of the bucket that ends it (80% of the rate), ns.
    pub leave_tat_ns: u64,
    /// Since when (ns) the rate has stayed within the leave bucket while in cookie mode; 0 when it
    /// has not.
    pub below_since_ns: u64,
    /// Times this CPU entered cookie mode (events).
    pub entered: u64,
    /// Times this CPU left cookie mode (events).
    pub left: u64,
}

const _: () = assert!(size_of::<CookieState>() == 48);

/// Whether a CPU in cookie mode has been quiet for the hold time by `now_ns`: its leave bucket,
/// whose theoretical arrival time is `leave_tat_ns`, has been full for at least `hold_ns`, so its
/// SYN rate has stayed under the leave rate (80% of its share of the threshold) for the whole
/// hold. Such a CPU leaves cookie mode at its next SYN, which it judges as out of it (the XDP
/// program), and reads as out of it already ([`CookieState::active`] notwithstanding: the
/// daemon's count). Nanoseconds of the `bpf_ktime_get_coarse_ns` clock.
#[must_use]
pub const fn cookie_quiet(leave_tat_ns: u64, hold_ns: u64, now_ns: u64) -> bool {
    leave_tat_ns.saturating_add(hold_ns) <= now_ns
}

/// Key of the exempt LPM trie: the address in [`crate::PrefixKey`]'s 16-byte form (IPv4 as
/// `::ffff:a.b.c.d`) but not masked; an IPv4 CIDR `/n` is stored with prefix length `96 + n`.
/// The kernel's `struct bpf_lpm_trie_key` puts a `u32` prefix length before the data.
pub type ExemptKey = [u8; 16];

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPU is quiet once its leave bucket has been full for the hold: from the bucket's TAT
    /// plus the hold on, not a nanosecond before.
    #[test]
    fn cookie_quiet_after_a_full_hold() {
        let (tat, hold) = (5_000, 1_000);
        assert!(!cookie_quiet(tat, hold, 5_999));
        assert!(cookie_quiet(tat, hold, 6_000));
        assert!(!cookie_quiet(u64::MAX, hold, u64::MAX - 1), "saturates");
    }

    #[test]
    fn port_bitmap() {
        let mut c = ShieldConfig::new(1, 1);
        for p in [0, 63, 64, 443, 8443, 65_535] {
            assert!(!c.is_protected(p));
            c.protect(p);
            assert!(c.is_protected(p), "{p}");
        }
        assert!(!c.is_protected(444));
        c.flags |= CONFIG_ALL_PORTS;
        assert!(c.is_protected(444));
    }
}
