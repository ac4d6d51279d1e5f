//! Fuzzes `door_daemon::client::key::client_key` with arbitrary bytes as `X-Forwarded-For` and
//! `Forwarded` header lines (docs/design.md, "Client key").
//!
//! Input layout: byte 0 picks the peer (trusted or not, IPv4 or IPv6) and the authoritative
//! source; the rest is split on `\n` into header lines, each line's first byte choosing its
//! header (even: X-Forwarded-For, odd: Forwarded). Lines that are not valid header values are
//! dropped (hyper would have refused them). Checks: no panic, and the decision's invariants.
#![no_main]

use std::net::IpAddr;

use door_common::PrefixKey;
use door_daemon::client::key::{ForwardedSource, Rule, TrustedProxies, canonical, client_key};
use http::{HeaderMap, HeaderValue, header::FORWARDED};
use libfuzzer_sys::fuzz_target;

const PEERS: [&str; 4] = ["10.0.0.1", "2001:db8:ffff::1", "203.0.113.9", "::ffff:10.0.0.2"];

fuzz_target!(|data: &[u8]| {
    let Some((&control, rest)) = data.split_first() else {
        return;
    };
    let Ok(trusted) = TrustedProxies::parse_list("10.0.0.0/8, 2001:db8:ffff::/48, fe80::/64")
    else {
        return;
    };
    let Some(Ok(peer)) = PEERS.get(usize::from(control & 3)).map(|p| p.parse::<IpAddr>()) else {
        return;
    };
    let source = if control & 4 == 0 {
        ForwardedSource::Xff
    } else {
        ForwardedSource::Forwarded
    };
    let mut headers = HeaderMap::new();
    for line in rest.split(|b| *b == b'\n') {
        let Some((&which, value)) = line.split_first() else {
            continue;
        };
        let Ok(value) = HeaderValue::from_bytes(value) else {
            continue;
        };
        if which % 2 == 0 {
            headers.append("x-forwarded-for", value);
        } else {
            headers.append(FORWARDED, value);
        }
    }
    let decision = client_key(peer, &headers, &trusted, source);
    assert_eq!(decision.key, PrefixKey::from_ip(decision.client));
    match decision.rule {
        Rule::PeerUntrusted | Rule::PeerNoHeader => assert_eq!(decision.client, canonical(peer)),
        Rule::FirstUntrustedEntry { .. } => assert!(!trusted.contains(decision.client)),
        Rule::MalformedEntry { .. } | Rule::AllTrusted { .. } => {
            assert!(trusted.contains(decision.client));
        }
    }
    let _ = decision.to_string();
});
