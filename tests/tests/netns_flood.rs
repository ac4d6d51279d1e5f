//! Flood tests in network namespaces (root): door's XDP program on the door end of a veth pair,
//! SYN floods written onto the client end by `syn-flood` (AF_PACKET, spoofed documentation-range
//! sources, bounded in count and time), and a legitimate client completing HTTP requests through
//! door meanwhile. Counters read from door's `/status` prove where the SYNs were dropped.
#![expect(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "test helpers: a failed step fails the test"
)]

use door_tests::{
    netns::{self, CLIENT_ADDR, DOOR_ADDR, SynFlood, TempDir, Topology, syns_of},
    privileged_or_skip,
};
use serde_json::Value;

const SYN_RATE: u32 = 10;
const SYN_BURST: u64 = 50;
const NEW_PREFIX_RATE: u32 = 10;
const NEW_PREFIX_BURST: u64 = 100;
/// The per-prefix map is made this small so a rotation flood can overrun it.
const MAX_PREFIXES: u64 = 1_024;
/// SYNs of the one-/64 flood: at most this many, for at most `FLOOD_SECONDS`.
const FLOOD: u64 = 2_000_000;
const FLOOD_SECONDS: u64 = 3;
/// The rotation flood's time bound: it must send all its SYNs (its count is what it tests), also
/// in a slow emulated guest on a busy machine.
const ROTATION_SECONDS: u64 = 15;
/// Distinct /64s of the rotation flood: twenty times the map (the kernel's LRU is approximate:
/// an entry referenced several times sits on its active list and outlives a few turnovers).
const ROTATION: u64 = 20 * MAX_PREFIXES;

fn config(topo: &Topology, mode: &str) -> String {
    config_with_guard(topo, mode, NEW_PREFIX_RATE)
}

fn config_with_guard(topo: &Topology, mode: &str, new_prefix_rate: u32) -> String {
    format!(
        r#"
listen = ["{DOOR_ADDR}:8443", "[2001:db8:d00::1]:8443"]
upstream = "http://127.0.0.1:3000"
admin_listen = "127.0.0.1:9901"

[[route]]
group = "link"
methods = ["GET"]
path = "/l/session/{{id}}"

# The legitimate client makes as many requests as the flood lasts: keep layer 7 out of the way.
[group.link]
rate = 1000.0
burst = 1000

[xdp]
interface = "{}"
mode = "{mode}"
ports = [8443]
syn_rate = {SYN_RATE}.0
syn_burst = {SYN_BURST}
new_prefix_rate = {new_prefix_rate}
new_prefix_burst = {NEW_PREFIX_BURST}
overflow_syn_rate = 10.0
overflow_syn_burst = 100
max_prefixes = {MAX_PREFIXES}
"#,
        topo.door_if
    )
}

fn counter(st: &Value, name: &str) -> u64 {
    st["xdp"]["counters"][name].as_u64().unwrap_or(0)
}

/// Floods `count` SYNs (for at most `FLOOD_SECONDS`) from `prefixes` /64s starting at
/// `src_prefix`; when `serve`, the legitimate client makes link requests meanwhile, as long as the
/// flood lasts (at least one, at most 100).
fn flood_while_serving(
    topo: &Topology,
    src_prefix: &'static str,
    prefixes: u64,
    count: u64,
    serve: bool,
) -> Flood {
    // A bounded flood runs its full time unless its count is reached first; only the rotation
    // flood needs all of its count.
    let max_seconds = if count == ROTATION {
        ROTATION_SECONDS
    } else {
        FLOOD_SECONDS
    };
    let flood = topo
        .spawn_flood(SynFlood {
            src_prefix,
            prefixes,
            count,
            max_seconds,
        })
        .unwrap();
    let url = format!("http://{DOOR_ADDR}:8443/l/session/legit");
    let mut codes = Vec::new();
    let mut during = 0;
    while serve && codes.len() < 100 && (codes.is_empty() || !flood.is_finished()) {
        codes.push(
            netns::curl(&topo.client_ns, CLIENT_ADDR, &[&url])
                .unwrap()
                .0,
        );
        if !flood.is_finished() {
            during += 1;
        }
    }
    Flood {
        sent: flood.join().unwrap().unwrap().0,
        codes,
        during,
    }
}

/// What a flood run saw.
struct Flood {
    /// SYNs the flood sent.
    sent: u64,
    /// Status codes of every legitimate request, in order.
    codes: Vec<u16>,
    /// How many of them completed while the flood was still running.
    during: usize,
}

fn one_prefix_flood_is_dropped_at_xdp_while_a_client_is_served(mode: &str) {
    if !privileged_or_skip("netns_flood") {
        return;
    }
    let dir = TempDir::new("flood").unwrap();
    let mut topo = Topology::new().unwrap();
    topo.start_door(&dir.0, &config(&topo, mode)).unwrap();
    let st = netns::status(&topo.door_ns).unwrap();
    assert_eq!(st["xdp"]["mode"], mode, "{st:#}");

    let flood = flood_while_serving(&topo, "2001:db8:bad::", 1, FLOOD, true);
    assert!(flood.sent > 10_000, "the flood ran: {} SYNs", flood.sent);
    assert!(
        flood.during >= 3,
        "{} requests overlapped the flood",
        flood.during
    );
    assert!(
        flood.codes.iter().all(|c| *c == 200),
        "the legitimate client is served during the flood: {:?}",
        flood.codes
    );

    let st = netns::status(&topo.door_ns).unwrap();
    let flood_prefix = st["xdp"]["top_prefixes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["prefix"] == "2001:db8:bad::/64")
        .cloned()
        .unwrap_or_else(|| panic!("the flooding /64 is tracked: {st:#}"));
    let syns = flood_prefix["syns"].as_u64().unwrap();
    let drops = flood_prefix["drops"].as_u64().unwrap();
    // Every SYN reached XDP (counted; concurrent updates from several CPUs may lose a few), and all
    // but the burst and what refilled during the flood (10/s for a few seconds) were dropped there.
    assert!(
        syns > flood.sent * 9 / 10,
        "syns {syns} of {}: {st:#}",
        flood.sent
    );
    let refill = u64::from(SYN_RATE) * (FLOOD_SECONDS + 2);
    assert!(
        drops >= syns - SYN_BURST - refill,
        "drops {drops} of {syns}: {st:#}"
    );
    assert!(counter(&st, "drop/syn_budget") >= drops, "{st:#}");
    // The legitimate client's /32 was judged on its own bucket, untouched by the flood.
    // One SYN per request, plus the odd retransmission of a SYN the loaded stack dropped before XDP.
    let client = syns_of(&st, &format!("{CLIENT_ADDR}/32")).unwrap();
    let requests = flood.codes.len() as u64;
    assert!(
        (requests..=requests + 5).contains(&client),
        "{client} SYNs for {requests} requests: {st:#}"
    );
}

/// Rotates SYNs over twenty times as many /64s as the map holds, after a legitimate client was
/// tracked. With the churn guard (`new_prefix_rate` > 0) new prefixes get entries only at the
/// guard's rate, so the map stays far below its capacity and nothing it tracks can be evicted; the
/// client's entry is still there. Without it (`new_prefix_rate = 0`, the control run) the same flood
/// fills the map to capacity, evicting as it goes (which entries go is up to the kernel's
/// approximate LRU, which favours recently referenced ones).
fn rotation_flood(mode: &str, guard: bool) {
    if !privileged_or_skip("netns_flood") {
        return;
    }
    let dir = TempDir::new("rotation").unwrap();
    let mut topo = Topology::new().unwrap();
    let rate = if guard { NEW_PREFIX_RATE } else { 0 };
    topo.start_door(&dir.0, &config_with_guard(&topo, mode, rate))
        .unwrap();
    let url = format!("http://{DOOR_ADDR}:8443/l/session/before");
    for _ in 0..3 {
        assert_eq!(
            netns::curl(&topo.client_ns, CLIENT_ADDR, &[&url])
                .unwrap()
                .0,
            200
        );
    }
    // The client stays quiet during the flood, so its entry is only as fresh as its last request.
    let flood = flood_while_serving(&topo, "2001:db8:f000::", ROTATION, ROTATION, false);
    assert_eq!(flood.sent, ROTATION);

    let st = netns::status(&topo.door_ns).unwrap();
    let client = syns_of(&st, &format!("{CLIENT_ADDR}/32"));
    let tracked = st["xdp"]["tracked_prefixes"].as_u64().unwrap();
    if !guard {
        assert!(
            tracked >= MAX_PREFIXES * 3 / 4,
            "without the guard the flood fills the map: tracked {tracked}: {st:#}"
        );
        assert_eq!(st["xdp"]["churn_guard"]["overflow_syns"], 0, "{st:#}");
        return;
    }
    // Its entry survived, and still counts its own SYNs.
    assert_eq!(client, Some(3), "{st:#}");
    // New prefixes got entries only as fast as the churn guard allows; the rest shared the
    // overflow bucket, which ran dry (burst 100, 10/s).
    let allowed = 1 + NEW_PREFIX_BURST + u64::from(NEW_PREFIX_RATE) * (FLOOD_SECONDS + 2);
    assert!(tracked <= allowed, "tracked {tracked}: {st:#}");
    let overflow = st["xdp"]["churn_guard"]["overflow_syns"].as_u64().unwrap();
    assert!(
        overflow * 10 >= (ROTATION - allowed) * 9,
        "overflow {overflow}: {st:#}"
    );
    assert!(counter(&st, "drop/overflow") > 0, "{st:#}");
}

#[test]
fn driver_mode_one_prefix_flood() {
    one_prefix_flood_is_dropped_at_xdp_while_a_client_is_served("driver");
}

#[test]
fn skb_mode_one_prefix_flood() {
    one_prefix_flood_is_dropped_at_xdp_while_a_client_is_served("skb");
}

#[test]
fn driver_mode_rotation_flood_keeps_tracked_prefixes() {
    rotation_flood("driver", true);
}

#[test]
fn skb_mode_rotation_flood_keeps_tracked_prefixes() {
    rotation_flood("skb", true);
}

#[test]
fn without_the_churn_guard_a_rotation_flood_fills_the_map() {
    rotation_flood("driver", false);
}
