//! End to end in network namespaces (root): a client namespace and a door namespace joined by a
//! veth pair (192.0.2.0/24, 2001:db8::/32), XDP attached to door's end in driver mode, door and
//! the demo upstream in door's namespace, curl in the client's. Namespaces are removed on drop,
//! also when an assertion fails.
#![expect(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    reason = "test helpers: a failed step fails the test"
)]

use std::time::Duration;

use door_tests::{
    netns::{CLIENT_ADDR, CLIENT2_ADDR, DOOR_ADDR, Topology, door_bin, upstream_bin},
    privileged_or_skip,
};
use serde_json::Value;

/// Link budget for the run: burst 20 and a refill so slow (one token per 1000 s) that no token
/// comes back during the test, whatever the machine's speed.
const LINK_BURST: usize = 20;

fn config(topo: &Topology, dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("door.toml");
    let text = format!(
        r#"
listen = ["{DOOR_ADDR}:8443", "[2001:db8:d00::1]:8443"]
upstream = "http://127.0.0.1:3000"
admin_listen = "127.0.0.1:9901"

[[route]]
group = "webhook"
methods = ["POST"]
path = "/webhooks/github"
[[route]]
group = "link"
methods = ["GET"]
path = "/l/session/{{id}}"

[group.link]
rate = 0.001
burst = {LINK_BURST}

[xdp]
interface = "{}"
mode = "driver"
ports = [8443]
"#,
        topo.door_if
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// One request on a fresh connection from `ns`, bound to `source`: (status, headers+body).
fn curl(ns: &str, source: &str, args: &[&str]) -> (u16, String) {
    let mut all = vec![
        "-s",
        "-i",
        "--max-time",
        "10",
        "--interface",
        source,
        "-w",
        "\n%{http_code}",
    ];
    all.extend_from_slice(args);
    let out = Topology::run(ns, "curl", &all).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

fn status(topo: &Topology) -> Value {
    let out = Topology::run(
        &topo.door_ns,
        "curl",
        &["-s", "--max-time", "10", "http://127.0.0.1:9901/status"],
    )
    .unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}

fn syns_of(status: &Value, prefix: &str) -> Option<u64> {
    status["xdp"]["top_prefixes"]
        .as_array()?
        .iter()
        .find(|p| p["prefix"] == prefix)
        .and_then(|p| p["syns"].as_u64())
}

#[test]
fn link_burst_then_429_per_client_with_xdp_counting_syns() {
    if !privileged_or_skip("netns_e2e") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("door-netns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut topo = Topology::new().unwrap();
    let upstream = upstream_bin(env!("CARGO_BIN_EXE_demo-upstream"));
    let deadline = Duration::from_secs(30);
    topo.spawn_until(
        &topo.door_ns.clone(),
        &upstream,
        &["--listen", "127.0.0.1:3000"],
        "listening",
        deadline,
    )
    .unwrap();
    let cfg = config(&topo, &dir);
    topo.spawn_until(
        &topo.door_ns.clone(),
        &door_bin().unwrap(),
        &["--config", cfg.to_str().unwrap()],
        "admin status",
        deadline,
    )
    .unwrap();

    let st = status(&topo);
    assert_eq!(st["xdp"]["attached"], true, "{st:#}");
    assert_eq!(st["xdp"]["mode"], "driver", "{st:#}");

    let url = format!("http://{DOOR_ADDR}:8443/l/session/demo");
    let client = topo.client_ns.clone();
    for i in 0..LINK_BURST {
        let (code, _) = curl(&client, CLIENT_ADDR, &[&url]);
        assert_eq!(code, 200, "request {} of the burst", i + 1);
    }
    let (code, head) = curl(&client, CLIENT_ADDR, &[&url]);
    assert_eq!(code, 429, "{head}");
    let lower = head.to_ascii_lowercase();
    let retry_after: u64 = lower
        .lines()
        .find_map(|l| l.strip_prefix("retry-after:"))
        .map(|v| v.trim().parse().unwrap())
        .expect("429 carries Retry-After");
    assert!(retry_after >= 1, "{head}");
    assert!(head.contains(r#""code":"rate-limited""#), "{head}");
    assert!(head.contains(r#""group":"link""#), "{head}");

    // Another client address has its own bucket.
    let (code, _) = curl(&client, CLIENT2_ADDR, &[&url]);
    assert_eq!(code, 200, "a second client is not limited by the first");

    // A webhook POST from the limited client passes: groups are independent.
    let hook = format!("http://{DOOR_ADDR}:8443/webhooks/github");
    let (code, body) = curl(
        &client,
        CLIENT_ADDR,
        &["-X", "POST", "--data", "{\"zen\":\"hi\"}", &hook],
    );
    assert_eq!(code, 200, "{body}");

    // Every curl above opened one connection: one SYN each, counted at XDP per /32.
    let st = status(&topo);
    let client1_connections = (LINK_BURST + 1 + 1) as u64;
    assert_eq!(
        syns_of(&st, &format!("{CLIENT_ADDR}/32")),
        Some(client1_connections),
        "{st:#}"
    );
    assert_eq!(
        syns_of(&st, &format!("{CLIENT2_ADDR}/32")),
        Some(1),
        "{st:#}"
    );
    assert!(st["xdp"]["counters"]["pass/syn"].as_u64().unwrap() > client1_connections);
    assert_eq!(
        st["requests"]["link"]["ok"],
        (LINK_BURST + 1) as u64,
        "{st:#}"
    );
    assert_eq!(st["requests"]["link"]["rate_limited"], 1, "{st:#}");

    drop(topo);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ipv6_client_is_keyed_and_counted_on_its_slash_64() {
    if !privileged_or_skip("netns_e2e") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("door-netns6-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut topo = Topology::new().unwrap();
    let upstream = upstream_bin(env!("CARGO_BIN_EXE_demo-upstream"));
    let deadline = Duration::from_secs(30);
    topo.spawn_until(
        &topo.door_ns.clone(),
        &upstream,
        &["--listen", "127.0.0.1:3000"],
        "listening",
        deadline,
    )
    .unwrap();
    let cfg = config(&topo, &dir);
    topo.spawn_until(
        &topo.door_ns.clone(),
        &door_bin().unwrap(),
        &["--config", cfg.to_str().unwrap()],
        "admin status",
        deadline,
    )
    .unwrap();
    let client = topo.client_ns.clone();
    let url = "http://[2001:db8:d00::1]:8443/l/session/six";
    for _ in 0..LINK_BURST {
        assert_eq!(curl(&client, "2001:db8:c1::2", &["-g", url]).0, 200);
    }
    let (code, body) = curl(&client, "2001:db8:c1::2", &["-g", url]);
    assert_eq!(code, 429, "{body}");
    let st = status(&topo);
    assert_eq!(
        syns_of(&st, "2001:db8:c1::/64"),
        Some((LINK_BURST + 1) as u64),
        "{st:#}"
    );
    drop(topo);
    let _ = std::fs::remove_dir_all(&dir);
}
