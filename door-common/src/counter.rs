//! The XDP program's packet counters: one `u64` per [`Counter`] in a per-CPU array
//! ([`crate::MAP_COUNTERS`]), so that no two CPUs ever write the same slot. The daemon sums the
//! per-CPU values.

/// What the XDP program did with a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// `XDP_PASS`: handed to the kernel's stack.
    Pass,
    /// `XDP_DROP`: discarded at the driver.
    Drop,
    /// `XDP_TX`: answered from the driver, out of the interface it came in on (a SYN rewritten
    /// in place into a SYN-ACK carrying the kernel's SYN cookie).
    Tx,
}

impl Verdict {
    /// `"pass"`, `"drop"` or `"tx"`, as exported in metrics and `/status`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Drop => "drop",
            Verdict::Tx => "tx",
        }
    }
}

/// One packet counter: a verdict and the reason for it. The discriminant is the index in the
/// per-CPU array [`crate::MAP_COUNTERS`]; every packet the program sees increments exactly one.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Passed: not IPv4 or IPv6 (ARP, LLDP, other EtherTypes).
    PassNotIp = 0,
    /// Passed: IP but not TCP (UDP, ICMP, ESP, …).
    PassNotTcp = 1,
    /// Passed: TCP without the SYN-only flag pattern (ACK, SYN-ACK, RST, data).
    PassNotSyn = 2,
    /// Passed: a SYN (SYN set, ACK clear) within its prefix's budget, counted against it.
    PassSyn = 3,
    /// Passed: the packet or its IP datagram ended before a header the program needed
    /// (fail-open), including a tiny TCP first fragment while the shield only observes.
    PassTruncated = 4,
    /// Passed: a SYN whose prefix could not be recorded (map update failed; fail-open).
    PassMapFull = 5,
    /// Passed: a header had impossible contents (wrong IP version, IPv4 IHL below 5, TCP data
    /// offset below 5; in cookie mode, a SYN with a bad IPv4 header checksum; fail-open).
    PassMalformed = 6,
    /// Passed: an IPv4 or IPv6 fragment other than the first (carries no TCP header).
    PassFragment = 7,
    /// Passed: a SYN to a destination port not in `[xdp] ports`.
    PassUnprotectedPort = 8,
    /// Passed: a SYN from an exempt address (trusted proxy or allowlist).
    PassExempt = 9,
    /// Passed: more than two VLAN tags (fail-open), or an IPv6 packet whose extension headers the
    /// program cannot walk to the end, within its source's SYN budget (see
    /// [`Counter::DropUnwalkable`]).
    PassTooManyHeaders = 10,
    /// Passed: a SYN from a new prefix while the churn guard is closed, within the shared
    /// overflow bucket's budget.
    PassOverflowSyn = 11,
    /// Dropped: a SYN over its prefix's budget (`syn_rate`, `syn_burst`).
    DropSynBudget = 12,
    /// Dropped: a SYN from a new prefix while the churn guard is closed, over the shared overflow
    /// bucket's budget.
    DropOverflow = 13,
    /// Dropped: a SYN from a prefix on the daemon's blocklist, before its deadline.
    DropBlocked = 14,
    /// Dropped: a TCP first fragment to a protected port too short to hold the TCP header
    /// (RFC 1858 §3.1: its flags would arrive in a later fragment).
    DropTinyFragment = 15,
    /// Dropped: an IPv6 packet whose extension headers the program cannot walk to the end, over
    /// its source's SYN budget.
    DropUnwalkable = 16,
    /// Dropped: a SYN from an address on the operator's deny list (`deny`).
    DropDenied = 17,
    /// Passed: a SYN within every budget while this CPU is in cookie mode, of a shape the program
    /// does not answer from XDP (IPv4 options, an IPv4 first fragment, IPv6 extension headers), or
    /// one the kernel would not answer itself (a group Ethernet address, a multicast, broadcast
    /// or martian IP address, a datagram longer than its frame, TCP options past the datagram's
    /// end): the kernel handles it as usual.
    PassCookieUnavailable = 18,
    /// Answered (`XDP_TX`): a SYN within every budget while this CPU is in cookie mode, rewritten
    /// into a SYN-ACK carrying the kernel's SYN cookie for the listening socket (RFC 4987 §3.6).
    TxSynCookie = 19,
    /// Passed: a SYN in cookie mode for which the kernel declined to make a cookie
    /// (`bpf_tcp_gen_syncookie` failed: `-ENOENT` while `net.ipv4.tcp_syncookies = 1` and the
    /// listener's SYN queue is not full, or with `tcp_syncookies = 0`, or its accept queue full).
    PassCookieDeclined = 20,
    /// Passed: a SYN in cookie mode to an address and port with no listening socket in the
    /// interface's network namespace (the kernel answers it with a RST).
    PassNoListener = 21,
}

/// Number of counters, the length of the per-CPU array [`crate::MAP_COUNTERS`].
pub const COUNTER_COUNT: u32 = 22;

impl Counter {
    /// Every counter, in index order.
    pub const ALL: [Counter; COUNTER_COUNT as usize] = [
        Counter::PassNotIp,
        Counter::PassNotTcp,
        Counter::PassNotSyn,
        Counter::PassSyn,
        Counter::PassTruncated,
        Counter::PassMapFull,
        Counter::PassMalformed,
        Counter::PassFragment,
        Counter::PassUnprotectedPort,
        Counter::PassExempt,
        Counter::PassTooManyHeaders,
        Counter::PassOverflowSyn,
        Counter::DropSynBudget,
        Counter::DropOverflow,
        Counter::DropBlocked,
        Counter::DropTinyFragment,
        Counter::DropUnwalkable,
        Counter::DropDenied,
        Counter::PassCookieUnavailable,
        Counter::TxSynCookie,
        Counter::PassCookieDeclined,
        Counter::PassNoListener,
    ];

    /// The index of this counter in [`crate::MAP_COUNTERS`].
    pub const fn index(self) -> u32 {
        self as u32
    }

    /// The verdict this counter records.
    pub const fn verdict(self) -> Verdict {
        match self {
            Counter::PassNotIp
            | Counter::PassNotTcp
            | Counter::PassNotSyn
            | Counter::PassSyn
            | Counter::PassTruncated
            | Counter::PassMapFull
            | Counter::PassMalformed
            | Counter::PassFragment
            | Counter::PassUnprotectedPort
            | Counter::PassExempt
            | Counter::PassTooManyHeaders
            | Counter::PassOverflowSyn
            | Counter::PassCookieUnavailable
            | Counter::PassCookieDeclined
            | Counter::PassNoListener => Verdict::Pass,
            Counter::DropSynBudget
            | Counter::DropOverflow
            | Counter::DropBlocked
            | Counter::DropTinyFragment
            | Counter::DropUnwalkable
            | Counter::DropDenied => Verdict::Drop,
            Counter::TxSynCookie => Verdict::Tx,
        }
    }

    /// The reason, as exported in metrics and `/status` (`snake_case`).
    pub const fn reason(self) -> &'static str {
        match self {
            Counter::PassNotIp => "not_ip",
            Counter::PassNotTcp => "not_tcp",
            Counter::PassNotSyn => "not_syn",
            Counter::PassSyn => "syn",
            Counter::PassTruncated => "truncated",
            Counter::PassMapFull => "map_full",
            Counter::PassMalformed => "malformed",
            Counter::PassFragment => "fragment",
            Counter::PassUnprotectedPort => "unprotected_port",
            Counter::PassExempt => "exempt",
            Counter::PassTooManyHeaders => "too_many_headers",
            Counter::PassOverflowSyn => "overflow_syn",
            Counter::DropSynBudget => "syn_budget",
            Counter::DropOverflow => "overflow",
            Counter::DropBlocked => "blocked",
            Counter::DropTinyFragment => "tiny_fragment",
            Counter::DropUnwalkable => "unwalkable",
            Counter::DropDenied => "denied",
            Counter::PassCookieUnavailable => "cookie_unavailable",
            Counter::TxSynCookie => "syn_cookie",
            Counter::PassCookieDeclined => "cookie_declined",
            Counter::PassNoListener => "no_listener",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_are_dense_and_in_order() {
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(c.index() as usize, i, "{c:?}");
        }
    }
}
