//! Flood tests in network namespaces (root): door's XDP program on the door end of a veth pair,
//! SYN floods written onto the client end by `synflood` (AF_PACKET, spoofed documentation-range
//! sources, bounded in count and time), and a legitimate client completing HTTP requests through
//! door meanwhile. Counters read from door's `/status` prove where the SYNs were dropped.
#![expect(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "test helpers: a failed step fails the test"
)]

use door_tests::{
    netns::{self, CLIENT_ADDR, DOOR_ADDR, TempDir, Topology, sibling_bin, syns_of},
    privileged_or_skip,
};
use serde_json::Value;

const SYN_RATE: u32 = 10;
const SYN_BURST: u64 = 50;
const NEW_PREFIX_RATE: u32 = 10;
const NEW_PREFIX_BURST: u64 = 100;
const FLOOD: u64 = 3_000;
const ROTATION: u64 = 5_000;

fn config(topo: &Topology, mode: &str) -> String {
    format!(
        r#"
listen = ["{DOOR_ADDR}:8443", "[2001:db8:d00::1]:8443"]
upstream = "http://127.0.0.1:3000"
admin_listen = "127.0.0.1:9901"

[[route]]
group = "link"
methods = ["GET"]
path = "/l/session/{{id}}"

[xdp]
interface = "{}"
mode = "{mode}"
ports = [8443]
syn_rate = {SYN_RATE}.0
syn_burst = {SYN_BURST}
new_prefix_rate = {NEW_PREFIX_RATE}.0
new_prefix_burst = {NEW_PREFIX_BURST}
"#,
        topo.door_if
    )
}

fn counter(st: &Value, name: &str) -> u64 {
    st["xdp"]["counters"][name].as_u64().unwrap_or(0)
}

/// Floods `count` SYNs from `prefixes` /64s starting at `src_prefix`, while the legitimate client
/// makes `requests` link requests; returns the flood's report and the legitimate status codes.
fn flood_while_serving(
    topo: &Topology,
    src_prefix: &'static str,
    prefixes: u64,
    count: u64,
    requests: usize,
) -> (String, Vec<u16>) {
    let mac = Topology::run(&topo.door_ns, "cat", &["/sys/class/net/veth-door/address"]).unwrap();
    let mac = String::from_utf8(mac.stdout).unwrap().trim().to_owned();
    let synflood = sibling_bin("synflood").unwrap();
    let (count_s, prefixes_s) = (count.to_string(), prefixes.to_string());
    let client_ns = topo.client_ns.clone();
    let flood = std::thread::spawn(move || {
        let args = [
            "--iface",
            "veth-client",
            "--dst-mac",
            &mac,
            "--dst",
            "2001:db8:d00::1",
            "--port",
            "8443",
            "--src-prefix",
            src_prefix,
            "--prefixes",
            &prefixes_s,
            "--count",
            &count_s,
            "--max-seconds",
            "20",
        ];
        let out = Topology::run(&client_ns, synflood.to_str().unwrap(), &args).unwrap();
        assert!(
            out.status.success(),
            "synflood: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    });
    let url = format!("http://{DOOR_ADDR}:8443/l/session/legit");
    let codes = (0..requests)
        .map(|_| {
            netns::curl(&topo.client_ns, CLIENT_ADDR, &[&url])
                .unwrap()
                .0
        })
        .collect();
    (flood.join().unwrap(), codes)
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

    let (report, codes) = flood_while_serving(&topo, "2001:db8:bad::", 1, FLOOD, 5);
    assert!(report.contains(&format!("sent {FLOOD}")), "{report}");
    assert_eq!(
        codes,
        vec![200; 5],
        "the legitimate client is served during the flood"
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
    // but the burst and what refilled during the flood (10/s, well under 20 s) were dropped there.
    assert!(syns > FLOOD * 9 / 10, "syns {syns} of {FLOOD}: {st:#}");
    assert!(
        drops >= syns - SYN_BURST - 200,
        "drops {drops} of {syns}: {st:#}"
    );
    assert!(counter(&st, "drop/syn_budget") >= drops, "{st:#}");
    // The legitimate client's /32 was judged on its own bucket, untouched by the flood.
    assert_eq!(
        syns_of(&st, &format!("{CLIENT_ADDR}/32")),
        Some(5),
        "{st:#}"
    );
}

fn rotation_flood_leaves_tracked_prefixes_in_place(mode: &str) {
    if !privileged_or_skip("netns_flood") {
        return;
    }
    let dir = TempDir::new("rotation").unwrap();
    let mut topo = Topology::new().unwrap();
    topo.start_door(&dir.0, &config(&topo, mode)).unwrap();
    // The legitimate client is tracked before the flood.
    let url = format!("http://{DOOR_ADDR}:8443/l/session/before");
    for _ in 0..3 {
        assert_eq!(
            netns::curl(&topo.client_ns, CLIENT_ADDR, &[&url])
                .unwrap()
                .0,
            200
        );
    }
    let (report, codes) = flood_while_serving(&topo, "2001:db8:f000::", ROTATION, ROTATION, 2);
    assert!(report.contains(&format!("sent {ROTATION}")), "{report}");
    assert_eq!(codes, vec![200; 2]);

    let st = netns::status(&topo.door_ns).unwrap();
    // Its entry survived thousands of new /64s, and still counts its own SYNs.
    assert_eq!(
        syns_of(&st, &format!("{CLIENT_ADDR}/32")),
        Some(5),
        "{st:#}"
    );
    // New prefixes got entries only as fast as the churn guard allows (burst + 10/s for at most
    // 20 s); the rest shared the overflow bucket.
    let tracked = st["xdp"]["tracked_prefixes"].as_u64().unwrap();
    assert!(
        tracked <= 1 + NEW_PREFIX_BURST + 200,
        "tracked {tracked}: {st:#}"
    );
    let overflow = st["xdp"]["churn_guard"]["overflow_syns"].as_u64().unwrap();
    assert!(
        overflow >= ROTATION * 9 / 10 - NEW_PREFIX_BURST - 200,
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
fn driver_mode_rotation_flood() {
    rotation_flood_leaves_tracked_prefixes_in_place("driver");
}

#[test]
fn skb_mode_rotation_flood() {
    rotation_flood_leaves_tracked_prefixes_in_place("skb");
}
