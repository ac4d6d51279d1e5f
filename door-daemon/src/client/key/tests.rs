//! Tests of the client key: the rules of docs/design.md ("Client key") in one table, a larger
//! table per rule, the trusted-proxy list, bounded work on long chains, and properties (proptest).

use core::net::IpAddr;

use door_common::PrefixKey;
use http::{HeaderMap, HeaderValue};
use proptest::prelude::*;

use super::*;
use crate::client::forwarded::{FORWARDED_HEADER, X_FORWARDED_FOR};

const XFF: ForwardedSource = ForwardedSource::Xff;
const FWD: ForwardedSource = ForwardedSource::Forwarded;

/// The trusted list most cases use: an IPv4 /8, an IPv6 /48, both loopbacks, a link-local /64.
const T: &str = "10.0.0.0/8, 2001:db8:ffff::/48, 127.0.0.1, ::1, fe80::/64";

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn trusted(text: &str) -> TrustedProxies {
    TrustedProxies::parse_list(text).unwrap()
}

fn headers(xff: &[&[u8]], forwarded: &[&[u8]]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for line in xff {
        map.append(&X_FORWARDED_FOR, HeaderValue::from_bytes(line).unwrap());
    }
    for line in forwarded {
        map.append(&FORWARDED_HEADER, HeaderValue::from_bytes(line).unwrap());
    }
    map
}

fn key_of(
    peer: &str,
    list: &str,
    xff: &[&str],
    forwarded: &[&str],
    source: ForwardedSource,
) -> KeyDecision {
    let xff: Vec<&[u8]> = xff.iter().map(|s| s.as_bytes()).collect();
    let forwarded: Vec<&[u8]> = forwarded.iter().map(|s| s.as_bytes()).collect();
    client_key(ip(peer), &headers(&xff, &forwarded), &trusted(list), source)
}

fn first(header: ForwardedSource, position_from_right: usize) -> Rule {
    Rule::FirstUntrustedEntry {
        header,
        position_from_right,
    }
}

fn malformed(header: ForwardedSource, position_from_right: usize) -> Rule {
    Rule::MalformedEntry {
        header,
        position_from_right,
    }
}

fn all(header: ForwardedSource, entries: usize) -> Rule {
    Rule::AllTrusted { header, entries }
}

/// One row: peer, trusted list, XFF lines, Forwarded lines, source, expected client, rule, flag.
struct Case {
    name: &'static str,
    peer: &'static str,
    trusted: &'static str,
    xff: &'static [&'static str],
    forwarded: &'static [&'static str],
    source: ForwardedSource,
    client: &'static str,
    rule: Rule,
    flagged: bool,
}

const fn case(
    name: &'static str,
    peer: &'static str,
    xff: &'static [&'static str],
    client: &'static str,
    rule: Rule,
) -> Case {
    Case {
        name,
        peer,
        trusted: T,
        xff,
        forwarded: &[],
        source: XFF,
        client,
        rule,
        flagged: false,
    }
}

const fn fwd_case(
    name: &'static str,
    peer: &'static str,
    forwarded: &'static [&'static str],
    client: &'static str,
    rule: Rule,
) -> Case {
    Case {
        name,
        peer,
        trusted: T,
        xff: &[],
        forwarded,
        source: XFF,
        client,
        rule,
        flagged: false,
    }
}

fn check(cases: &[Case]) {
    for c in cases {
        let got = key_of(c.peer, c.trusted, c.xff, c.forwarded, c.source);
        let want_client = ip(c.client);
        assert_eq!(got.client, want_client, "{}: client ({got})", c.name);
        assert_eq!(got.key, PrefixKey::from_ip(want_client), "{}: key", c.name);
        assert_eq!(got.rule, c.rule, "{}: rule ({got})", c.name);
        assert_eq!(got.ignored_untrusted_xff, c.flagged, "{}: flag", c.name);
    }
}

const fn f1() -> Rule {
    Rule::FirstUntrustedEntry {
        header: XFF,
        position_from_right: 1,
    }
}

// ----- The rules of docs/design.md, "Client key", in one table -------------------------------

#[test]
fn client_key_rules_table() {
    // A /64 is one key.
    let a = key_of("2001:db8:1:2::1", "", &[], &[], XFF);
    let b = key_of("2001:db8:1:2:ffff:ffff:ffff:ffff", "", &[], &[], XFF);
    let other = key_of("2001:db8:1:3::1", "", &[], &[], XFF);
    assert_eq!(a.key, b.key);
    assert_ne!(a.key, other.key);
    assert_eq!(a.key.to_string(), "2001:db8:1:2::/64");

    check(&[
        case(
            "client, proxy keys the client",
            "10.0.0.1",
            &["203.0.113.7, 10.0.0.2"],
            "203.0.113.7",
            first(XFF, 2),
        ),
        case(
            "client behind one proxy",
            "10.0.0.1",
            &["203.0.113.7"],
            "203.0.113.7",
            f1(),
        ),
        case(
            "mapped peer is unmapped before the trust check",
            "::ffff:10.0.0.1",
            &["203.0.113.7"],
            "203.0.113.7",
            f1(),
        ),
        case(
            "mapped XFF value is unmapped before the trust check",
            "10.0.0.1",
            &["203.0.113.7, ::ffff:10.0.0.2"],
            "203.0.113.7",
            first(XFF, 2),
        ),
        case(
            "zoned XFF value is stripped before the trust check",
            "10.0.0.1",
            &["203.0.113.7, fe80::1%eth0"],
            "203.0.113.7",
            first(XFF, 2),
        ),
        case(
            "mapped client is keyed as IPv4",
            "10.0.0.1",
            &["::ffff:203.0.113.7"],
            "203.0.113.7",
            f1(),
        ),
        case(
            "two-line chain: first untrusted entry despite malformed text to its left",
            "10.0.0.1",
            &["garbage, unknown, 0127.0.0.1 ,", "203.0.113.7, 10.0.0.2"],
            "203.0.113.7",
            first(XFF, 2),
        ),
        case(
            "a walked malformed entry keys the last trusted hop",
            "10.0.0.1",
            &["203.0.113.7, unknown, 10.0.0.2"],
            "10.0.0.2",
            malformed(XFF, 2),
        ),
        case(
            "a malformed rightmost entry keys the peer",
            "10.0.0.1",
            &["203.0.113.7, unknown"],
            "10.0.0.1",
            malformed(XFF, 1),
        ),
        case(
            "an all-trusted chain keys the last trusted hop",
            "10.0.0.1",
            &["10.0.0.3, 10.0.0.2"],
            "10.0.0.3",
            all(XFF, 2),
        ),
        Case {
            trusted: "",
            flagged: true,
            ..case(
                "untrusted loopback XFF is ignored and flagged",
                "127.0.0.1",
                &["203.0.113.7"],
                "127.0.0.1",
                Rule::PeerUntrusted,
            )
        },
    ]);
}

// ----- A larger table, rule by rule ------------------------------------------------------------

#[test]
fn untrusted_peer_is_the_key() {
    check(&[
        case(
            "public peer, XFF ignored, not flagged",
            "198.51.100.9",
            &["203.0.113.7"],
            "198.51.100.9",
            Rule::PeerUntrusted,
        ),
        case(
            "public peer without headers",
            "198.51.100.9",
            &[],
            "198.51.100.9",
            Rule::PeerUntrusted,
        ),
        case(
            "untrusted peer claiming to be a trusted proxy",
            "198.51.100.9",
            &["10.0.0.1"],
            "198.51.100.9",
            Rule::PeerUntrusted,
        ),
        case(
            "mapped untrusted peer keyed as IPv4",
            "::ffff:198.51.100.9",
            &[],
            "198.51.100.9",
            Rule::PeerUntrusted,
        ),
        case(
            "IPv6 peer keyed on its /64",
            "2001:db8:5:6::99",
            &["203.0.113.7"],
            "2001:db8:5:6::99",
            Rule::PeerUntrusted,
        ),
        case(
            "NAT64 peer keyed on its IPv4",
            "64:ff9b::cb00:7107",
            &[],
            "64:ff9b::cb00:7107",
            Rule::PeerUntrusted,
        ),
        Case {
            trusted: "",
            ..case(
                "empty trusted list: even loopback is untrusted",
                "127.0.0.1",
                &[],
                "127.0.0.1",
                Rule::PeerUntrusted,
            )
        },
    ]);
    // NAT64 keys on the embedded IPv4, the same key as that IPv4 connecting directly.
    let nat64 = key_of("64:ff9b::cb00:7107", T, &[], &[], XFF);
    assert_eq!(nat64.key, PrefixKey::from_ip(ip("203.0.113.7")));
    assert!(nat64.is_untrusted_peer());
}

#[test]
fn untrusted_local_peers_are_flagged() {
    let local = [
        "127.0.0.1",
        "127.9.9.9",
        "::1",
        "::ffff:127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.1.1",
        "169.254.1.1",
        "fd00::1",
        "fc00::1",
        "fe80::1",
    ];
    for peer in local {
        for (xff, fwd) in [
            (&["203.0.113.7"][..], &[][..]),
            (&[][..], &["for=203.0.113.7"][..]),
            (&[""][..], &[][..]),
        ] {
            let got = key_of(peer, "", xff, fwd, XFF);
            assert!(got.ignored_untrusted_xff, "{peer} {xff:?} {fwd:?}");
            assert_eq!(got.client, canonical(ip(peer)));
            assert_eq!(got.rule, Rule::PeerUntrusted);
        }
        let without = key_of(peer, "", &[], &[], XFF);
        assert!(!without.ignored_untrusted_xff, "{peer} without headers");
    }
    for peer in [
        "198.51.100.1",
        "172.32.0.1",
        "2001:db8::1",
        "64:ff9b::7f00:1",
    ] {
        let got = key_of(peer, "", &["203.0.113.7"], &[], XFF);
        assert!(!got.ignored_untrusted_xff, "{peer}");
    }
    // A trusted local peer is not flagged: its header is used.
    let got = key_of("127.0.0.1", T, &["203.0.113.7"], &[], XFF);
    assert!(!got.ignored_untrusted_xff);
    assert_eq!(got.client, ip("203.0.113.7"));
}

#[test]
fn trusted_peer_without_entries_is_the_key() {
    check(&[
        case("no header", "10.0.0.1", &[], "10.0.0.1", Rule::PeerNoHeader),
        case(
            "empty header line",
            "10.0.0.1",
            &[""],
            "10.0.0.1",
            Rule::PeerNoHeader,
        ),
        case(
            "only empty elements and whitespace",
            "10.0.0.1",
            &[" , ,\t,", "  "],
            "10.0.0.1",
            Rule::PeerNoHeader,
        ),
        case(
            "trusted IPv6 proxy, no header",
            "2001:db8:ffff:1::5",
            &[],
            "2001:db8:ffff:1::5",
            Rule::PeerNoHeader,
        ),
        fwd_case(
            "empty Forwarded",
            "10.0.0.1",
            &[" , "],
            "10.0.0.1",
            Rule::PeerNoHeader,
        ),
    ]);
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "a table of cases reads best as one list"
)]
fn first_untrusted_entry_is_the_key() {
    check(&[
        case(
            "port on IPv4 entries",
            "10.0.0.1",
            &["203.0.113.7:54321, 10.0.0.2:443"],
            "203.0.113.7",
            first(XFF, 2),
        ),
        case(
            "bracketed IPv6",
            "10.0.0.1",
            &["[2001:db8:5::9]"],
            "2001:db8:5::9",
            f1(),
        ),
        case(
            "bracketed IPv6 with port",
            "10.0.0.1",
            &["[2001:db8:5::9]:443, [2001:db8:ffff::2]:8443"],
            "2001:db8:5::9",
            first(XFF, 2),
        ),
        case(
            "bare IPv6",
            "10.0.0.1",
            &["2001:db8:5::9, 2001:db8:ffff::2"],
            "2001:db8:5::9",
            first(XFF, 2),
        ),
        case(
            "zoned client is stripped",
            "10.0.0.1",
            &["fe80:1::9%eth0"],
            "fe80:1::9",
            f1(),
        ),
        case(
            "bracketed zoned client with port",
            "10.0.0.1",
            &["[fe80:1::9%25]:80"],
            "fe80:1::9",
            f1(),
        ),
        case(
            "mapped trusted hop is skipped",
            "10.0.0.1",
            &["203.0.113.7, [::ffff:10.0.0.2]:80"],
            "203.0.113.7",
            first(XFF, 2),
        ),
        case(
            "mapped IPv6 peer, mapped hops",
            "::ffff:10.0.0.1",
            &["::ffff:203.0.113.7,::ffff:10.2.3.4"],
            "203.0.113.7",
            first(XFF, 2),
        ),
        case(
            "loopback hop trusted",
            "127.0.0.1",
            &["203.0.113.7, ::1, 127.0.0.1"],
            "203.0.113.7",
            first(XFF, 3),
        ),
        case(
            "NAT64 client",
            "10.0.0.1",
            &["64:ff9b::203.0.113.7"],
            "64:ff9b::cb00:7107",
            f1(),
        ),
        case(
            "tabs and spaces trimmed, no spaces at all",
            "10.0.0.1",
            &["\t203.0.113.7\t,\t10.0.0.2 ,10.0.0.3"],
            "203.0.113.7",
            first(XFF, 3),
        ),
        case(
            "empty elements are not counted",
            "10.0.0.1",
            &[",, 203.0.113.7 ,, , 10.0.0.2,,"],
            "203.0.113.7",
            first(XFF, 2),
        ),
        case(
            "three lines in wire order",
            "10.0.0.1",
            &["198.51.100.1", "203.0.113.7", "10.0.0.3, 10.0.0.2"],
            "203.0.113.7",
            first(XFF, 3),
        ),
        case(
            "client-supplied chain left of the client",
            "10.0.0.1",
            &["1.1.1.1, 10.0.0.99, 203.0.113.7, 10.0.0.2"],
            "203.0.113.7",
            first(XFF, 2),
        ),
        case(
            "garbage left of the client is never parsed",
            "10.0.0.1",
            &["\u{e9}x, 0x7f.1, 1.2.3, 0127.0.0.1, unknown, _hidden, 203.0.113.7"],
            "203.0.113.7",
            f1(),
        ),
        case(
            "untrusted IPv6 client keyed on /64",
            "2001:db8:ffff::1",
            &["2001:db8:7:8::1234"],
            "2001:db8:7:8::1234",
            f1(),
        ),
        case(
            "an untrusted private address is still a client",
            "10.0.0.1",
            &["192.168.0.7"],
            "192.168.0.7",
            f1(),
        ),
    ]);
}

#[test]
fn malformed_entry_keys_the_last_trusted_hop() {
    let bad = [
        "unknown",
        "_hidden",
        "example.com",
        "localhost",
        "0127.0.0.1",
        "127.0.0.01",
        "1.2.3",
        "1.2.3.4.5",
        "0x7f.1",
        "0x7f000001",
        "2130706433",
        "256.0.0.1",
        "203.0.113.7 198.51.100.1",
        "[203.0.113.7]",
        "203.0.113.7:",
        "203.0.113.7:99999",
        "203.0.113.7:http",
        "[2001:db8::1",
        "2001:db8::1]",
        "[2001:db8::1]:",
        "fe80::1%",
        "203.0.113.7%eth0",
        "\"203.0.113.7\"",
        "::ffff:1.2.3",
        "1::2::3",
        "for=203.0.113.7",
        "-",
    ];
    for entry in bad {
        // Rightmost: the peer is the last trusted hop.
        let line = format!("203.0.113.7, {entry}");
        let got = key_of("10.0.0.1", T, &[&line], &[], XFF);
        assert_eq!(got.client, ip("10.0.0.1"), "{entry:?}: {got}");
        assert_eq!(got.rule, malformed(XFF, 1), "{entry:?}");
        // Behind a trusted hop: that hop.
        let line = format!("203.0.113.7, {entry}, 10.0.0.2, 10.0.0.3");
        let got = key_of("10.0.0.1", T, &[&line], &[], XFF);
        assert_eq!(got.client, ip("10.0.0.2"), "{entry:?}: {got}");
        assert_eq!(got.rule, malformed(XFF, 3), "{entry:?}");
    }
    check(&[
        case(
            "malformed in its own line",
            "10.0.0.1",
            &["203.0.113.7", "nope", "10.0.0.2"],
            "10.0.0.2",
            malformed(XFF, 2),
        ),
        case(
            "mapped trusted hop before a malformed entry is unmapped",
            "10.0.0.1",
            &["nope, ::ffff:10.0.0.2"],
            "10.0.0.2",
            malformed(XFF, 2),
        ),
        case(
            "zoned trusted hop before a malformed entry is stripped",
            "10.0.0.1",
            &["nope, fe80::2%eth0"],
            "fe80::2",
            malformed(XFF, 2),
        ),
    ]);
}

#[test]
fn non_ascii_header_bytes_are_malformed_entries() {
    let trusted_list = trusted(T);
    for bytes in [
        &b"203.0.113.7\xff"[..],
        b"\xc3\xa9",
        b"203.0.113.\xd9\xa7",
        b"\x80, 10.0.0.2",
    ] {
        let map = headers(&[bytes], &[]);
        let got = client_key(ip("10.0.0.1"), &map, &trusted_list, XFF);
        assert!(
            matches!(got.rule, Rule::MalformedEntry { .. }),
            "{}: {got}",
            bytes.escape_ascii()
        );
    }
    // Non-ASCII text left of the client is never looked at.
    let map = headers(
        &[b"\xff\xfe, 203.0.113.7"],
        &[b"for=\"\xff\", for=203.0.113.8"],
    );
    let got = client_key(ip("10.0.0.1"), &map, &trusted_list, XFF);
    assert_eq!(got.client, ip("203.0.113.7"));
    let got = client_key(ip("10.0.0.1"), &map, &trusted_list, FWD);
    assert_eq!(got.client, ip("203.0.113.8"));
}

#[test]
fn all_trusted_chain_keys_the_last_trusted_hop() {
    check(&[
        case(
            "one trusted entry",
            "10.0.0.1",
            &["10.0.0.2"],
            "10.0.0.2",
            all(XFF, 1),
        ),
        case(
            "leftmost across lines",
            "10.0.0.1",
            &["10.0.0.5", "10.0.0.4, 10.0.0.3"],
            "10.0.0.5",
            all(XFF, 3),
        ),
        case(
            "mapped leftmost is unmapped",
            "10.0.0.1",
            &["::ffff:10.0.0.5, 10.0.0.3"],
            "10.0.0.5",
            all(XFF, 2),
        ),
        case(
            "IPv6 trusted chain",
            "::1",
            &["[2001:db8:ffff:2::1]:1, ::1"],
            "2001:db8:ffff:2::1",
            all(XFF, 2),
        ),
    ]);
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "a table of cases reads best as one list"
)]
fn forwarded_table() {
    check(&[
        fwd_case(
            "simple for=",
            "10.0.0.1",
            &["for=203.0.113.7"],
            "203.0.113.7",
            first(FWD, 1),
        ),
        fwd_case(
            "quoted bracketed IPv6 with port (RFC 7239 §4 example)",
            "10.0.0.1",
            &["for=\"[2001:db8:cafe::17]:4711\""],
            "2001:db8:cafe::17",
            first(FWD, 1),
        ),
        fwd_case(
            "case-insensitive names, other parameters ignored",
            "10.0.0.1",
            &["For=203.0.113.7;Proto=https;BY=10.0.0.1, fOr=10.0.0.2;host=\"a.example\""],
            "203.0.113.7",
            first(FWD, 2),
        ),
        fwd_case(
            "parameter order does not matter",
            "10.0.0.1",
            &["proto=http;by=\"[::1]\";for=203.0.113.7"],
            "203.0.113.7",
            first(FWD, 1),
        ),
        fwd_case(
            "multiple lines, multiple elements",
            "10.0.0.1",
            &[
                "for=198.51.100.1, for=203.0.113.7",
                "for=10.0.0.3,for=\"10.0.0.2:80\"",
            ],
            "203.0.113.7",
            first(FWD, 3),
        ),
        fwd_case(
            "quoted separators in other parameters",
            "10.0.0.1",
            &["for=203.0.113.7;host=\"a,b;c=d\", for=10.0.0.2"],
            "203.0.113.7",
            first(FWD, 2),
        ),
        fwd_case(
            "obfuscated port",
            "10.0.0.1",
            &["for=\"203.0.113.7:_p1\""],
            "203.0.113.7",
            first(FWD, 1),
        ),
        fwd_case(
            "mapped and zoned hops canonicalised before the trust check",
            "10.0.0.1",
            &["for=203.0.113.7, for=\"[::ffff:10.0.0.2]\", for=\"[fe80::1%eth0]:9\""],
            "203.0.113.7",
            first(FWD, 3),
        ),
        fwd_case(
            "for=unknown keys the last trusted hop",
            "10.0.0.1",
            &["for=203.0.113.7, for=unknown, for=10.0.0.2"],
            "10.0.0.2",
            malformed(FWD, 2),
        ),
        fwd_case(
            "obfuscated identifier keys the last trusted hop",
            "10.0.0.1",
            &["for=203.0.113.7, for=\"_gazonk\""],
            "10.0.0.1",
            malformed(FWD, 1),
        ),
        fwd_case(
            "element without for= is malformed",
            "10.0.0.1",
            &["for=203.0.113.7, proto=https"],
            "10.0.0.1",
            malformed(FWD, 1),
        ),
        fwd_case(
            "unterminated quote is malformed",
            "10.0.0.1",
            &["for=203.0.113.7, for=10.0.0.5, for=\"10.0.0.2"],
            "10.0.0.1",
            malformed(FWD, 1),
        ),
        fwd_case(
            "unbalanced quote LEFT of the client is never read",
            "10.0.0.1",
            &["for=\"oops, for=203.0.113.7, for=10.0.0.2"],
            "203.0.113.7",
            first(FWD, 2),
        ),
        fwd_case(
            "octal-looking address is malformed",
            "10.0.0.1",
            &["for=0127.0.0.1, for=10.0.0.2"],
            "10.0.0.2",
            malformed(FWD, 2),
        ),
        fwd_case(
            "all trusted",
            "10.0.0.1",
            &["for=10.0.0.3, for=\"[2001:db8:ffff::9]\""],
            "10.0.0.3",
            all(FWD, 2),
        ),
        Case {
            trusted: "",
            flagged: true,
            ..fwd_case(
                "untrusted private peer with Forwarded is flagged",
                "192.168.0.1",
                &["for=203.0.113.7"],
                "192.168.0.1",
                Rule::PeerUntrusted,
            )
        },
    ]);
}

#[test]
fn source_chooses_between_both_headers() {
    let xff = &["203.0.113.1"][..];
    let fwd = &["for=203.0.113.2"][..];
    let got = key_of("10.0.0.1", T, xff, fwd, XFF);
    assert_eq!((got.client, got.rule), (ip("203.0.113.1"), first(XFF, 1)));
    let got = key_of("10.0.0.1", T, xff, fwd, FWD);
    assert_eq!((got.client, got.rule), (ip("203.0.113.2"), first(FWD, 1)));
    // Only one present: that one, whatever the source says.
    let got = key_of("10.0.0.1", T, &[], fwd, XFF);
    assert_eq!((got.client, got.rule), (ip("203.0.113.2"), first(FWD, 1)));
    let got = key_of("10.0.0.1", T, xff, &[], FWD);
    assert_eq!((got.client, got.rule), (ip("203.0.113.1"), first(XFF, 1)));
    // An empty authoritative header is still authoritative (no fallback to the other).
    let got = key_of("10.0.0.1", T, &[""], fwd, XFF);
    assert_eq!((got.client, got.rule), (ip("10.0.0.1"), Rule::PeerNoHeader));
    assert_eq!(ForwardedSource::default(), XFF);
}

#[test]
fn forwarded_source_parses_and_displays() {
    for (text, want) in [
        ("xff", XFF),
        ("XFF", XFF),
        ("X-Forwarded-For", XFF),
        (" forwarded ", FWD),
        ("Forwarded", FWD),
    ] {
        assert_eq!(text.parse::<ForwardedSource>(), Ok(want), "{text}");
    }
    let err = "proxy".parse::<ForwardedSource>().unwrap_err();
    assert_eq!(
        err,
        KeyError::BadSource {
            value: "proxy".into()
        }
    );
    assert!(err.to_string().contains("\"proxy\""));
    assert_eq!(XFF.to_string(), "X-Forwarded-For");
    assert_eq!(FWD.to_string(), "Forwarded");
}

#[test]
fn rule_and_decision_explain_themselves() {
    let got = key_of("10.0.0.1", T, &["203.0.113.7, 10.0.0.2"], &[], XFF);
    assert_eq!(
        got.to_string(),
        "key 203.0.113.7/32 (client 203.0.113.7): X-Forwarded-For entry 2 from the right is the first untrusted address"
    );
    assert!(!got.is_untrusted_peer());
    let lines = [
        Rule::PeerUntrusted,
        Rule::PeerNoHeader,
        first(FWD, 1),
        malformed(XFF, 3),
        all(FWD, 4),
    ]
    .map(|rule| rule.to_string());
    assert!(lines[0].contains("not a trusted proxy"));
    assert!(lines[1].contains("no forwarding entries"));
    assert!(lines[2].starts_with("Forwarded entry 1 from the right"));
    assert!(lines[3].contains("entry 3") && lines[3].contains("last trusted hop"));
    assert!(lines[4].contains("all 4 Forwarded entries"));
    assert!(lines.iter().all(|line| !line.contains('\n')));
}

// ----- Trusted proxies ---------------------------------------------------------------------------

#[test]
fn trusted_proxies_parse() {
    let list = trusted(" 10.0.0.0/8,\t192.0.2.7 ,, 2001:db8::/32, ::1, ::ffff:172.16.0.0/108,");
    assert_eq!(
        list.to_string(),
        "10.0.0.0/8, 192.0.2.7/32, 2001:db8::/32, ::1/128, 172.16.0.0/12"
    );
    assert_eq!(
        TrustedProxies::parse_list(&list.to_string()),
        Ok(list.clone())
    );
    assert_eq!(list.nets().len(), 5);
    assert!(!list.is_empty());
    assert!(list.contains(ip("10.255.0.1")));
    assert!(list.contains(ip("::ffff:10.255.0.1")));
    assert!(list.contains(ip("192.0.2.7")));
    assert!(!list.contains(ip("192.0.2.8")));
    assert!(list.contains(ip("172.31.0.1")));
    assert!(list.contains(ip("::ffff:172.31.0.1")));
    assert!(list.contains(ip("2001:db8:1::1")));
    assert!(list.contains(ip("::1")));
    assert!(!list.contains(ip("::2")));
    assert!(
        !list.contains(ip("64:ff9b::a00:1")),
        "NAT64 is not unmapped"
    );

    for empty in ["", " ", " , ,\t"] {
        let list = trusted(empty);
        assert!(list.is_empty());
        assert_eq!(list.to_string(), "");
    }
    assert_eq!(
        "10.0.0.0/8".parse::<TrustedProxies>(),
        Ok(trusted("10.0.0.0/8"))
    );
}

#[test]
fn trusted_proxies_errors_name_the_value() {
    for (text, bad) in [
        ("0.0.0.0/0", "0.0.0.0/0"),
        ("10.0.0.0/8, ::/0", "::/0"),
        ("::ffff:0.0.0.0/96", "::ffff:0.0.0.0/96"),
    ] {
        let err = TrustedProxies::parse_list(text).unwrap_err();
        assert_eq!(err, KeyError::ZeroPrefix { value: bad.into() }, "{text}");
        assert!(err.to_string().contains("/0"), "{err}");
    }
    let err = TrustedProxies::parse_list("10.0.0.0/8, 192.0.2.1/24").unwrap_err();
    assert_eq!(
        err,
        KeyError::HostBitsSet {
            value: "192.0.2.1/24".into(),
            network: "192.0.2.0/24".parse().unwrap()
        }
    );
    assert!(err.to_string().contains("192.0.2.0/24"), "{err}");
    assert!(matches!(
        TrustedProxies::parse_list("2001:db8::1/32"),
        Err(KeyError::HostBitsSet { .. })
    ));
    for bad in [
        "10.0.0.0/33",
        "::/129",
        "10.0.0.0/",
        "10.0.0.0/+8",
        "10.0.0.0/-1",
        "10.0.0.0/0008",
        "10.0.0.0/8/8",
        "/8",
        "010.0.0.0/8",
        "10.0.0",
        "0x7f.1",
        "fe80::1%eth0",
        "fe80::/64%eth0",
        "example.com",
        "10.0.0.0 /8",
        "[::1]",
        "10.0.0.1:80",
    ] {
        let err = TrustedProxies::parse_list(&format!("127.0.0.1, {bad}")).unwrap_err();
        assert_eq!(err, KeyError::BadCidr { value: bad.into() }, "{bad}");
        assert!(
            err.to_string().starts_with("not an IP address or CIDR"),
            "{err}"
        );
    }
}

#[test]
fn trusted_proxies_from_nets() {
    let nets = ["10.0.0.0/8", "::ffff:192.0.2.0/120", "2001:db8::/48"]
        .map(|n| n.parse::<IpNet>().unwrap())
        .to_vec();
    let list = TrustedProxies::from_nets(nets).unwrap();
    assert_eq!(list.to_string(), "10.0.0.0/8, 192.0.2.0/24, 2001:db8::/48");
    assert!(list.contains(ip("::ffff:192.0.2.9")));

    let zero = TrustedProxies::from_nets(vec!["::/0".parse().unwrap()]).unwrap_err();
    assert_eq!(
        zero,
        KeyError::ZeroPrefix {
            value: "::/0".into()
        }
    );
    let mapped_zero = TrustedProxies::from_nets(vec!["::ffff:0:0/96".parse().unwrap()]);
    assert!(matches!(mapped_zero, Err(KeyError::ZeroPrefix { .. })));
    let host = TrustedProxies::from_nets(vec!["10.1.2.3/8".parse().unwrap()]).unwrap_err();
    assert!(
        matches!(&host, KeyError::HostBitsSet { value, .. } if value == "10.1.2.3/8"),
        "{host:?}"
    );
    assert_eq!(
        TrustedProxies::from_nets(Vec::new()),
        Ok(TrustedProxies::default())
    );
}

#[test]
fn canonical_unmaps_only_mapped() {
    assert_eq!(canonical(ip("::ffff:192.0.2.7")), ip("192.0.2.7"));
    assert_eq!(canonical(ip("192.0.2.7")), ip("192.0.2.7"));
    assert_eq!(canonical(ip("64:ff9b::c000:207")), ip("64:ff9b::c000:207"));
    assert_eq!(canonical(ip("::c000:207")), ip("::c000:207"));
    assert_eq!(canonical(ip("2001:db8::1")), ip("2001:db8::1"));
}

/// Entries in the long chains.
const N: usize = 10_000;

// ----- Bounded work ----------------------------------------------------------------------------

fn counted(
    peer: &str,
    list: &TrustedProxies,
    map: &HeaderMap,
    source: ForwardedSource,
) -> (KeyDecision, usize) {
    let mut parsed = 0;
    let decision = client_key_counting(ip(peer), map, list, source, &mut parsed);
    (decision, parsed)
}

fn trusted_hop(i: usize) -> String {
    format!("10.{}.{}.{}", (i >> 16) & 0xff, (i >> 8) & 0xff, i & 0xff)
}

#[test]
fn long_chains_cost_one_parse_per_walked_entry() {
    let list = trusted(T);

    // Client leftmost, 9,999 trusted hops: every entry is walked once.
    let mut entries = vec!["198.51.100.1".to_owned()];
    entries.extend((1..N).map(trusted_hop));
    let line = entries.join(", ");
    let map = headers(&[line.as_bytes()], &[]);
    let (got, parsed) = counted("10.0.0.1", &list, &map, XFF);
    assert_eq!(got.client, ip("198.51.100.1"));
    assert_eq!(got.rule, first(XFF, N));
    assert_eq!(parsed, N);

    // The same chain as 10,000 header lines.
    let lines: Vec<&[u8]> = entries.iter().map(String::as_bytes).collect();
    let map = headers(&lines, &[]);
    let (got, parsed) = counted("10.0.0.1", &list, &map, XFF);
    assert_eq!(
        (got.client, got.rule, parsed),
        (ip("198.51.100.1"), first(XFF, N), N)
    );

    // All trusted: the leftmost hop.
    let line = (1..=N).map(trusted_hop).collect::<Vec<_>>().join(",");
    let map = headers(&[line.as_bytes()], &[]);
    let (got, parsed) = counted("10.0.0.1", &list, &map, XFF);
    assert_eq!(
        (got.client, got.rule, parsed),
        (ip(&trusted_hop(1)), all(XFF, N), N)
    );

    // 9,999 garbage entries left of the client are never parsed.
    let mut entries: Vec<String> = (1..N).map(|i| format!("junk{i}")).collect();
    entries.push("203.0.113.7".to_owned());
    let line = entries.join(", ");
    let map = headers(&[line.as_bytes()], &[]);
    let (got, parsed) = counted("10.0.0.1", &list, &map, XFF);
    assert_eq!((got.client, got.rule, parsed), (ip("203.0.113.7"), f1(), 1));

    // A megabyte of empty elements: nothing to parse.
    let line = ", \t".repeat(350_000);
    let map = headers(&[line.as_bytes()], &[]);
    let (got, parsed) = counted("10.0.0.1", &list, &map, XFF);
    assert_eq!(
        (got.client, got.rule, parsed),
        (ip("10.0.0.1"), Rule::PeerNoHeader, 0)
    );

    // One megabyte-long entry: one parse, malformed, no blow-up.
    let line = format!("203.0.113.7, {}", "1".repeat(1 << 20));
    let map = headers(&[line.as_bytes()], &[]);
    let (got, parsed) = counted("10.0.0.1", &list, &map, XFF);
    assert_eq!(
        (got.client, got.rule, parsed),
        (ip("10.0.0.1"), malformed(XFF, 1), 1)
    );
}

#[test]
fn long_forwarded_chains_cost_one_parse_per_walked_element() {
    let list = trusted(T);
    let mut elements = vec!["for=198.51.100.1;proto=https".to_owned()];
    elements.extend((1..N).map(|i| format!("for=\"{}:443\";by=x", trusted_hop(i))));
    let line = elements.join(", ");
    let map = headers(&[], &[line.as_bytes()]);
    let (got, parsed) = counted("10.0.0.1", &list, &map, FWD);
    assert_eq!(
        (got.client, got.rule, parsed),
        (ip("198.51.100.1"), first(FWD, N), N)
    );

    // Unbalanced quotes and junk to the left cost nothing.
    let line = format!("{}, for=203.0.113.7", "for=\"x, ".repeat(N));
    let map = headers(&[], &[line.as_bytes()]);
    let (got, parsed) = counted("10.0.0.1", &list, &map, FWD);
    assert_eq!(
        (got.client, got.rule, parsed),
        (ip("203.0.113.7"), first(FWD, 1), 1)
    );
}

// ----- Properties --------------------------------------------------------------------------------

/// How an address is written in a chain.
#[derive(Debug, Clone, Copy)]
enum Style {
    Plain,
    Port(u16),
    Bracketed,
    BracketedPort(u16),
    Mapped,
    Zoned,
}

/// One generated chain entry and what the walk must make of it.
#[derive(Debug, Clone)]
enum Gen {
    Trusted(IpAddr, Style),
    Untrusted(IpAddr, Style),
    Garbage(String),
}

/// The list the properties use.
const PT: &str = "10.0.0.0/8, 2001:db8:ffff::/48";

fn render(ip: IpAddr, style: Style) -> String {
    match (ip, style) {
        (IpAddr::V4(v4), Style::Port(p)) => format!("{v4}:{p}"),
        (IpAddr::V4(v4), Style::Mapped) => format!("::ffff:{v4}"),
        (IpAddr::V4(v4), Style::Bracketed) => format!("[::ffff:{v4}]"),
        (IpAddr::V4(v4), Style::BracketedPort(p)) => format!("[::ffff:{v4}]:{p}"),
        (IpAddr::V6(v6), Style::Port(p) | Style::BracketedPort(p)) => format!("[{v6}]:{p}"),
        (IpAddr::V6(v6), Style::Bracketed | Style::Mapped) => format!("[{v6}]"),
        (IpAddr::V6(v6), Style::Zoned) => format!("{v6}%eth0"),
        (ip, Style::Plain | Style::Zoned) => ip.to_string(),
    }
}

impl Gen {
    fn text(&self) -> String {
        match self {
            Self::Trusted(ip, style) | Self::Untrusted(ip, style) => render(*ip, *style),
            Self::Garbage(text) => text.clone(),
        }
    }

    fn forwarded(&self) -> String {
        let text = self.text();
        if text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_')
        {
            format!("for={text};proto=https")
        } else {
            format!("by=x;For=\"{text}\"")
        }
    }
}

fn style() -> impl Strategy<Value = Style> {
    prop_oneof![
        Just(Style::Plain),
        any::<u16>().prop_map(Style::Port),
        Just(Style::Bracketed),
        any::<u16>().prop_map(Style::BracketedPort),
        Just(Style::Mapped),
        Just(Style::Zoned),
    ]
}

fn trusted_ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<[u8; 3]>().prop_map(|[a, b, c]| IpAddr::from([10, a, b, c])),
        any::<u64>().prop_map(|low| {
            IpAddr::V6(core::net::Ipv6Addr::from_bits(
                (0x2001_0db8_ffff_u128 << 80) | u128::from(low),
            ))
        }),
    ]
}

fn untrusted_ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<[u8; 4]>()
            .prop_filter("not 10/8", |o| o[0] != 10)
            .prop_map(IpAddr::from),
        (any::<u16>(), any::<u64>()).prop_map(|(net, low)| {
            IpAddr::V6(core::net::Ipv6Addr::from_bits(
                (0x2001_0db8_0001_u128 << 80) | (u128::from(net) << 64) | u128::from(low),
            ))
        }),
    ]
}

fn garbage() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "unknown",
            "_hidden",
            "0127.0.0.1",
            "1.2.3",
            "0x7f.1",
            "1.2.3.4.5",
            "[10.0.0.1]",
            "example.com",
            "fe80::1%",
            "10.0.0.1:99999",
            "::ffff:1.2.3",
        ])
        .prop_map(str::to_owned),
        "[g-z_]{1,12}",
    ]
}

fn entry() -> impl Strategy<Value = Gen> {
    prop_oneof![
        3 => (trusted_ip(), style()).prop_map(|(ip, s)| Gen::Trusted(ip, s)),
        2 => (untrusted_ip(), style()).prop_map(|(ip, s)| Gen::Untrusted(ip, s)),
        1 => garbage().prop_map(Gen::Garbage),
    ]
}

/// A chain and where its lines break, with separators.
fn chain() -> impl Strategy<Value = (Vec<Gen>, Vec<bool>, Vec<&'static str>)> {
    prop::collection::vec(entry(), 0..12).prop_flat_map(|entries| {
        let n = entries.len();
        (
            Just(entries),
            prop::collection::vec(any::<bool>(), n),
            prop::collection::vec(
                prop::sample::select(vec![", ", ",", " ,\t", ", ,", "\t,  "]),
                n,
            ),
        )
    })
}

/// Renders the entries as header lines: `breaks[i]` ends a line after entry `i`.
fn lines(texts: &[String], breaks: &[bool], separators: &[&str]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut line = String::new();
    for (i, text) in texts.iter().enumerate() {
        if !line.is_empty() {
            line.push_str(separators[i]);
        }
        line.push_str(text);
        if breaks[i] {
            out.push(std::mem::take(&mut line).into_bytes());
        }
    }
    if !line.is_empty() {
        out.push(line.into_bytes());
    }
    out
}

/// The rules, written out independently of the implementation: (client, rule).
fn model(peer: IpAddr, entries: &[Gen], header: ForwardedSource) -> (IpAddr, Rule) {
    let mut last_trusted = peer;
    for (i, entry) in entries.iter().rev().enumerate() {
        let position_from_right = i + 1;
        match entry {
            Gen::Garbage(_) => {
                let rule = Rule::MalformedEntry {
                    header,
                    position_from_right,
                };
                return (last_trusted, rule);
            }
            Gen::Trusted(ip, _) => last_trusted = canonical(*ip),
            Gen::Untrusted(ip, _) => {
                let rule = Rule::FirstUntrustedEntry {
                    header,
                    position_from_right,
                };
                return (canonical(*ip), rule);
            }
        }
    }
    if entries.is_empty() {
        (peer, Rule::PeerNoHeader)
    } else {
        let rule = Rule::AllTrusted {
            header,
            entries: entries.len(),
        };
        (last_trusted, rule)
    }
}

fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![
        4 => prop::sample::select(b",;\"[]:%=\\ \t_.0123456789abcdef:forFOR".to_vec()),
        2 => 0x20u8..0x7f,
        1 => 0x80u8..=0xff,
    ];
    prop::collection::vec(byte, 0..48)
}

fn header_map(xff: &[Vec<u8>], forwarded: &[Vec<u8>]) -> HeaderMap {
    let xff: Vec<&[u8]> = xff.iter().map(Vec::as_slice).collect();
    let forwarded: Vec<&[u8]> = forwarded.iter().map(Vec::as_slice).collect();
    headers(&xff, &forwarded)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The key is the peer's, or an entry's at or right of the first untrusted one; and exactly
    /// the one the rules (the model) give.
    #[test]
    fn key_is_the_peer_or_at_or_right_of_the_first_untrusted(
        peer in prop_oneof![trusted_ip(), untrusted_ip()],
        (entries, breaks, separators) in chain(),
        use_forwarded in any::<bool>(),
    ) {
        let list = trusted(PT);
        let texts: Vec<String> = if use_forwarded {
            entries.iter().map(Gen::forwarded).collect()
        } else {
            entries.iter().map(Gen::text).collect()
        };
        let rendered = lines(&texts, &breaks, &separators);
        let (map, header) = if use_forwarded {
            (header_map(&[], &rendered), FWD)
        } else {
            (header_map(&rendered, &[]), XFF)
        };
        let got = client_key(peer, &map, &list, XFF);

        // Allowed keys: the peer, and entries from the first untrusted one (walking from the
        // right) rightwards.
        let first_untrusted = entries.iter().rposition(|e| matches!(e, Gen::Untrusted(..)));
        let mut allowed = vec![PrefixKey::from_ip(peer)];
        for entry in &entries[first_untrusted.unwrap_or(0)..] {
            if let Gen::Trusted(ip, _) | Gen::Untrusted(ip, _) = entry {
                allowed.push(PrefixKey::from_ip(*ip));
            }
        }
        prop_assert!(allowed.contains(&got.key), "{got} not in {allowed:?}");

        let want = if list.contains(peer) {
            model(peer, &entries, header)
        } else {
            (peer, Rule::PeerUntrusted)
        };
        prop_assert_eq!((got.client, got.rule), want);
        prop_assert_eq!(got.key, PrefixKey::from_ip(got.client));
    }

    /// Arbitrary header bytes never panic, and the decision keeps its invariants.
    #[test]
    fn arbitrary_headers_never_panic(
        peer in prop_oneof![trusted_ip(), untrusted_ip(), any::<IpAddr>()],
        xff in prop::collection::vec(header_bytes(), 0..4),
        forwarded in prop::collection::vec(header_bytes(), 0..4),
        source in prop_oneof![Just(XFF), Just(FWD)],
    ) {
        let list = trusted(PT);
        let map = header_map(&xff, &forwarded);
        let mut parsed = 0;
        let got = client_key_counting(peer, &map, &list, source, &mut parsed);
        prop_assert_eq!(got.key, PrefixKey::from_ip(got.client));
        let total_bytes: usize = xff.iter().chain(&forwarded).map(Vec::len).sum();
        prop_assert!(parsed <= total_bytes);
        match got.rule {
            Rule::PeerUntrusted => {
                prop_assert!(!list.contains(peer));
                prop_assert_eq!(got.client, canonical(peer));
            }
            Rule::FirstUntrustedEntry { .. } => prop_assert!(!list.contains(got.client)),
            Rule::PeerNoHeader => prop_assert_eq!(got.client, canonical(peer)),
            Rule::MalformedEntry { .. } | Rule::AllTrusted { .. } => {
                prop_assert!(list.contains(got.client));
            }
        }
        let _ = got.to_string();
    }

    /// A client behind trusted proxies cannot change its key by prepending anything: extra
    /// lines before the chain, or extra elements before its own entry on the same line.
    #[test]
    fn prepending_cannot_change_the_key(
        client in untrusted_ip(),
        client_style in style(),
        hops in prop::collection::vec((trusted_ip(), style()), 0..5),
        prefix_lines in prop::collection::vec(header_bytes(), 0..3),
        same_line_prefix in header_bytes(),
        use_forwarded in any::<bool>(),
    ) {
        let list = trusted(PT);
        let mut entries = vec![Gen::Untrusted(client, client_style)];
        entries.extend(hops.iter().map(|(ip, s)| Gen::Trusted(*ip, *s)));
        let texts: Vec<String> = if use_forwarded {
            entries.iter().map(Gen::forwarded).collect()
        } else {
            entries.iter().map(Gen::text).collect()
        };
        let honest = vec![texts.join(", ").into_bytes()];
        let mut lying = prefix_lines.clone();
        let mut first_line = same_line_prefix.clone();
        first_line.push(b',');
        first_line.extend_from_slice(&honest[0]);
        lying.push(first_line);

        let (honest_map, lying_map) = if use_forwarded {
            (header_map(&[], &honest), header_map(&[], &lying))
        } else {
            (header_map(&honest, &[]), header_map(&lying, &[]))
        };
        let peer = IpAddr::from([10, 0, 0, 1]);
        let want = client_key(peer, &honest_map, &list, XFF);
        let got = client_key(peer, &lying_map, &list, XFF);
        prop_assert_eq!(want.key, PrefixKey::from_ip(client));
        prop_assert_eq!(got, want);
    }
}
