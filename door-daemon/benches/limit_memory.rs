//! Memory per tracked client and peak RSS while 1,000,000 distinct IPv6 /64s arrive at one group
//! (results: docs/decisions.md, "Memory: about 100 bytes per tracked client, flat once full").
//! The table is bounded (`max_clients`): once it is full, RSS must stay flat however many new
//! clients arrive.
//!
//! Bytes per client are the RSS growth from an empty limiter to a full one, divided by the
//! table size, measured for the default table (16,384) and a large one (262,144) for resolution.

use std::{sync::Arc, time::Duration};

use door_common::prefix::PrefixKey;
use door_daemon::{
    limit::{Budget, DEFAULT_MAX_CLIENTS, GroupLimiter},
    limit::{Spend, Unobserved},
    time::ManualClock,
};

/// A `/proc/self/status` field in KiB (`VmRSS`, `VmHWM`).
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn v6(i: u64) -> PrefixKey {
    let mut octets = [0u8; 16];
    octets[0] = 0x20;
    octets[1] = 0x01;
    // A /64 key keeps octets 0..8: the index goes in octets 2..8.
    octets[2..8].copy_from_slice(&i.to_be_bytes()[2..]);
    PrefixKey::from_ipv6(octets)
}

fn run(max_clients: usize, arrivals: u64) {
    let clock = Arc::new(ManualClock::at(0));
    let before = status_kib("VmRSS:");
    let lim = Arc::new(GroupLimiter::new(
        "webhook",
        Budget {
            max_clients,
            ..Budget::webhook()
        },
        true,
        clock.clone(),
        Arc::new(Unobserved),
    ));
    let mut full_rss = 0;
    println!("max_clients {max_clients}: RSS before {before} KiB");
    for i in 0..arrivals {
        if let Ok(p) = lim.admit(v6(i)) {
            p.settle(Spend::Nothing);
        }
        // 20 ms between arrivals: entries refill, so new clients replace old ones (evictions)
        // instead of all landing on the shared row.
        clock.advance(Duration::from_millis(20));
        let n = i + 1;
        if usize::try_from(n).ok() == Some(max_clients) {
            full_rss = status_kib("VmRSS:");
        }
        if n.is_power_of_two() && n >= 1 << 14 || n == arrivals {
            println!(
                "  after {n:>9} clients: tracked {:>7}, VmRSS {:>7} KiB, VmHWM {:>7} KiB",
                lim.tracked_clients(),
                status_kib("VmRSS:"),
                status_kib("VmHWM:")
            );
        }
    }
    let grown = full_rss.saturating_sub(before) * 1024;
    #[expect(clippy::cast_precision_loss, reason = "reporting")]
    let per = grown as f64 / max_clients as f64;
    println!(
        "  table full: +{} KiB RSS for {max_clients} clients = {per:.1} bytes per tracked client; \
         after all arrivals +{} KiB",
        full_rss.saturating_sub(before),
        status_kib("VmRSS:").saturating_sub(before)
    );
}

/// 1,000,000 rotating bearer tokens, each verified by a 200 (the worst case: every token an
/// accepted credential), through the session plane's verified-credential table and its limiter:
/// both tables are bounded, so RSS stays flat once they are full.
fn sessions(arrivals: u64) {
    use door_daemon::{client::credential::CredentialHasher, http::plane::Sessions};
    let clock = Arc::new(ManualClock::at(0));
    let before = status_kib("VmRSS:");
    let sessions = Sessions::new(DEFAULT_MAX_CLIENTS);
    let hasher = CredentialHasher::new();
    let plane = Arc::new(GroupLimiter::new(
        "session",
        Budget::plane(2.0, 60, DEFAULT_MAX_CLIENTS),
        true,
        clock.clone(),
        Arc::new(Unobserved),
    ));
    println!("session plane, {arrivals} rotating tokens: RSS before {before} KiB");
    let mut full_rss = 0;
    for i in 0..arrivals {
        let key = hasher.key(format!("token-{i}").as_bytes());
        sessions.learn(key, http::StatusCode::OK);
        if let Ok(p) = plane.admit(key) {
            p.settle(Spend::Nothing);
        }
        clock.advance(Duration::from_secs(1));
        let n = i + 1;
        if usize::try_from(n).ok() == Some(DEFAULT_MAX_CLIENTS) {
            full_rss = status_kib("VmRSS:");
        }
        if n.is_power_of_two() && n >= 1 << 14 || n == arrivals {
            println!(
                "  after {n:>9} tokens: verified {:>6}, tracked {:>6}, VmRSS {:>7} KiB",
                sessions.verified(),
                plane.tracked_clients(),
                status_kib("VmRSS:")
            );
        }
    }
    println!(
        "  tables full: +{} KiB RSS; after all tokens +{} KiB (flat: bounded tables)",
        full_rss.saturating_sub(before),
        status_kib("VmRSS:").saturating_sub(before)
    );
}

fn main() {
    // First, so that its RSS growth is not hidden by memory the others freed.
    sessions(1_000_000);
    run(DEFAULT_MAX_CLIENTS, 1_000_000);
    run(262_144, 1_000_000);
    println!("peak RSS (VmHWM) {} KiB", status_kib("VmHWM:"));
}
