//! BPF_PROG_TEST_RUN suite: door's XDP program, loaded into this kernel, run on packets built
//! with etherparse. Needs root (CAP_BPF); run with `--test-threads=1` (`cargo xtask test` does).
#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers: a failed step fails the test"
)]

use door_common::{Counter, PrefixKey};
use door_daemon::shield::Shield;
use door_tests::{
    packets::{Flags, arp, tcp4, tcp6, udp4},
    privileged_or_skip,
};

const XDP_PASS: u32 = 2;
const CLIENT4: [u8; 4] = [192, 0, 2, 7];
const SERVER4: [u8; 4] = [198, 51, 100, 1];
const CLIENT6: [u8; 16] = [
    0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0x42,
];
const SERVER6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

fn shield() -> Option<Shield> {
    if !privileged_or_skip("bpf_test_run") {
        return None;
    }
    // Display, not Debug: a refusal carries the verifier's log, printed whole and readable.
    match Shield::load() {
        Ok(shield) => Some(shield),
        Err(e) => panic!("door's XDP program did not load into this kernel: {e}"),
    }
}

fn counter(shield: &Shield, c: Counter) -> u64 {
    shield
        .counters()
        .unwrap()
        .into_iter()
        .find(|v| v.counter == c)
        .unwrap()
        .packets
}

fn syns(shield: &Shield, key: PrefixKey) -> Option<u64> {
    shield.prefix(&key).unwrap().map(|s| s.syns)
}

#[test]
fn ipv4_syn_increments_exactly_its_slash_32() {
    let Some(shield) = shield() else { return };
    let key = PrefixKey::from_ipv4(CLIENT4);
    let neighbour = PrefixKey::from_ipv4([192, 0, 2, 8]);
    assert_eq!(syns(&shield, key), None);
    let (action, _) = shield
        .test_run(&tcp4(CLIENT4, SERVER4, 443, Flags::SYN), 1)
        .unwrap();
    assert_eq!(action, XDP_PASS);
    assert_eq!(syns(&shield, key), Some(1));
    let (action, _) = shield
        .test_run(&tcp4(CLIENT4, SERVER4, 443, Flags::SYN), 3)
        .unwrap();
    assert_eq!(action, XDP_PASS);
    assert_eq!(
        syns(&shield, key),
        Some(4),
        "repeat=3 runs the program three times"
    );
    assert_eq!(syns(&shield, neighbour), None);
    assert_eq!(counter(&shield, Counter::PassSyn), 4);
}

#[test]
fn ipv6_syn_increments_exactly_its_slash_64() {
    let Some(shield) = shield() else { return };
    let key = PrefixKey::from_ipv6(CLIENT6);
    let mut same_64 = CLIENT6;
    same_64[15] = 0x99;
    same_64[9] = 0xaa;
    let mut other_64 = CLIENT6;
    other_64[7] = 3;
    shield
        .test_run(&tcp6(CLIENT6, SERVER6, 443, Flags::SYN), 1)
        .unwrap();
    let (action, _) = shield
        .test_run(&tcp6(same_64, SERVER6, 443, Flags::SYN), 1)
        .unwrap();
    assert_eq!(action, XDP_PASS);
    assert_eq!(
        syns(&shield, key),
        Some(2),
        "two addresses of one /64 share an entry"
    );
    assert_eq!(syns(&shield, PrefixKey::from_ipv6(other_64)), None);
    assert_eq!(key.to_string(), "2001:db8:1:2::/64");
}

#[test]
fn non_syn_traffic_is_passed_and_not_counted_as_syn() {
    let Some(shield) = shield() else { return };
    let key = PrefixKey::from_ipv4(CLIENT4);
    let truncated = {
        let mut p = tcp4(CLIENT4, SERVER4, 443, Flags::SYN);
        p.truncate(14 + 20 + 10);
        p
    };
    let cases: [(&str, Vec<u8>, Counter); 7] = [
        (
            "SYN-ACK",
            tcp4(CLIENT4, SERVER4, 443, Flags::SYN_ACK),
            Counter::PassNotSyn,
        ),
        (
            "ACK",
            tcp4(CLIENT4, SERVER4, 443, Flags::ACK),
            Counter::PassNotSyn,
        ),
        (
            "RST",
            tcp4(CLIENT4, SERVER4, 443, Flags::RST),
            Counter::PassNotSyn,
        ),
        (
            "IPv6 SYN-ACK",
            tcp6(CLIENT6, SERVER6, 443, Flags::SYN_ACK),
            Counter::PassNotSyn,
        ),
        ("UDP", udp4(CLIENT4, SERVER4, 443), Counter::PassNotTcp),
        ("ARP", arp(CLIENT4, SERVER4), Counter::PassNotIp),
        ("truncated TCP", truncated, Counter::PassTruncated),
    ];
    for (name, packet, expected) in cases {
        let before = counter(&shield, expected);
        let (action, _) = shield.test_run(&packet, 1).unwrap();
        assert_eq!(action, XDP_PASS, "{name}");
        assert_eq!(
            counter(&shield, expected),
            before + 1,
            "{name} counted as {expected:?}"
        );
    }
    assert_eq!(syns(&shield, key), None, "no SYN was counted");
    assert_eq!(syns(&shield, PrefixKey::from_ipv6(CLIENT6)), None);
    assert_eq!(counter(&shield, Counter::PassSyn), 0);
}

#[test]
fn every_header_boundary_truncation_passes() {
    let Some(shield) = shield() else { return };
    // BPF_PROG_TEST_RUN refuses XDP input shorter than an Ethernet header (EINVAL), so the
    // shortest packet the program can be handed this way is 14 bytes.
    let full = tcp4(CLIENT4, SERVER4, 443, Flags::SYN);
    for len in 14..full.len() {
        let (action, _) = shield.test_run(&full[..len], 1).unwrap();
        assert_eq!(action, XDP_PASS, "truncated at {len} bytes");
    }
    assert_eq!(syns(&shield, PrefixKey::from_ipv4(CLIENT4)), None);
}

/// The BPF functions of door's XDP object: the entry point, the cookie answer (kept apart for
/// its stack frame), the rare events' logging, and the memory builtins the compiler may leave.
/// Matched against the end of each symbol's (mangled) name.
const FUNCTIONS: [&str; 8] = [
    "door_xdp",
    "6cookie6answer",
    "6events11cookie_mode",
    "6events12guard_closed",
    "6events8map_full",
    "memcpy",
    "memmove",
    "memset",
];

/// A counted SYN calls no BPF function of its own: the object holds no function but those of
/// [`FUNCTIONS`], none of them on that path. A BPF-to-BPF call costs a return, a mispredicted
/// branch under the kernel's SRSO "safe RET" mitigation; LLVM once compiled a closure on the SYN
/// path (cookie mode's `is_some_and`) as such a function, 6–18 ns a SYN (docs/performance.md,
/// "Cookie mode standing by, made cheap"). Reads the object only: needs no privileges.
#[test]
fn a_counted_syn_calls_no_bpf_function() {
    use object::{Object as _, ObjectSymbol as _, SymbolKind};

    let elf = object::File::parse(door_daemon::shield::PROGRAM)
        .expect("door's XDP object is an ELF file (built without AYA_BUILD_SKIP)");
    let functions: Vec<String> = elf
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
        .filter_map(|s| s.name().ok().map(str::to_owned))
        .collect();
    assert!(
        functions.iter().any(|f| f == "door_xdp"),
        "the entry point is among the object's functions: {functions:?}"
    );
    let unexpected: Vec<&String> = functions
        .iter()
        .filter(|f| !FUNCTIONS.iter().any(|known| f.ends_with(known)))
        .collect();
    assert!(
        unexpected.is_empty(),
        "BPF functions the program should not have (inline them, or add a rare path's to \
         FUNCTIONS): {unexpected:?}"
    );
}
