//! The shared XDP blocklist end to end in network namespaces (root): two doors, each in its own
//! namespace with XDP attached in driver mode on its veth end, both veths bridged in the client
//! namespace (192.0.2.0/24), and Debian's `redis-server` on 192.0.2.5 there (no persistence). A
//! client that door A escalates to its blocklist (429s past `escalate_after`) has its SYNs dropped
//! at door B's shield within a few sync intervals, while another client still reaches door B.
//! Without root it fails, unless `DOOR_SKIP_PRIVILEGED=1`: then it prints `door-test: skipped
//! (needs root): …` and passes. As root, a missing `redis-server` (which `cargo xtask setup`
//! installs) fails it.
#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers: a failed step fails the test"
)]

use std::time::{Duration, Instant};

use door_tests::{
    netns::{self, CLIENT_ADDR, CLIENT2_ADDR, DOOR_ADDR, TempDir, Topology, ip},
    privileged_or_skip, tools_or_skip,
};
use serde_json::Value;

/// Door B's address on the bridged link.
const DOOR_B_ADDR: &str = "192.0.2.4";
/// The store's address in the client namespace.
const REDIS_ADDR: &str = "192.0.2.5";
const REDIS_PORT: u16 = 6390;
/// 429s that escalate a client.
const ESCALATE_AFTER: u32 = 3;

fn config(addr: &str, interface: &str) -> String {
    format!(
        r#"
listen = ["{addr}:8443"]
upstream = "http://127.0.0.1:3000"
admin_listen = "127.0.0.1:9901"

[[route]]
group = "link"
methods = ["GET"]
path = "/l/session/{{id}}"

[group.link]
rate = 0.001
burst = 2

[xdp]
interface = "{interface}"
mode = "driver"
ports = [8443]
escalate_after = {ESCALATE_AFTER}
escalate_window = "60s"
block_for = "60s"

[cluster]
redis = "redis://{REDIS_ADDR}:{REDIS_PORT}/0"
sync_interval = "100ms"
timeout = "500ms"
"#
    )
}

fn counter(st: &Value, name: &str) -> u64 {
    st.pointer("/xdp/counters")
        .and_then(|c| c.get(name))
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// The seconds `/status` says `prefix` stays blocked, if it is on the blocklist.
fn blocked_for(st: &Value, prefix: &str) -> Option<u64> {
    st.pointer("/xdp/blocked")?
        .as_array()?
        .iter()
        .find(|b| b.get("prefix").and_then(Value::as_str) == Some(prefix))?
        .get("seconds_left")?
        .as_u64()
}

/// A second door namespace joined to the client namespace, removed on drop.
struct SecondDoor {
    ns: String,
}

impl SecondDoor {
    /// Door B's namespace, its veth (`veth-door` inside, `veth-clib` in the client namespace),
    /// and a bridge in the client namespace over both client ends, which takes over the client
    /// addresses, plus [`REDIS_ADDR`].
    fn new(topo: &Topology) -> Self {
        let door = Self {
            ns: format!("{}b", topo.door_ns),
        };
        ip(&["netns", "add", &door.ns]).unwrap();
        let (c, b) = (topo.client_ns.as_str(), door.ns.as_str());
        ip(&[
            "link",
            "add",
            "veth-door",
            "netns",
            b,
            "type",
            "veth",
            "peer",
            "name",
            "veth-clib",
            "netns",
            c,
        ])
        .unwrap();
        for (ns, cmd) in [
            (b, vec!["addr", "add", "192.0.2.4/24", "dev", "veth-door"]),
            (b, vec!["link", "set", "veth-door", "up"]),
            (b, vec!["link", "set", "lo", "up"]),
            (c, vec!["link", "add", "br-door", "type", "bridge"]),
            (c, vec!["addr", "flush", "dev", "veth-client"]),
            (c, vec!["link", "set", "veth-client", "master", "br-door"]),
            (c, vec!["link", "set", "veth-clib", "master", "br-door"]),
            (c, vec!["link", "set", "veth-clib", "up"]),
            (c, vec!["addr", "add", "192.0.2.2/24", "dev", "br-door"]),
            (c, vec!["addr", "add", "192.0.2.3/24", "dev", "br-door"]),
            (c, vec!["addr", "add", "192.0.2.5/24", "dev", "br-door"]),
            (c, vec!["link", "set", "br-door", "up"]),
        ] {
            let mut args = vec!["-n", ns];
            args.extend(cmd);
            ip(&args).unwrap();
        }
        door
    }
}

impl Drop for SecondDoor {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.ns]);
    }
}

/// Waits (at most `within`) until `check` holds for door `ns`'s `/status`; the last document.
fn wait_status(ns: &str, within: Duration, check: impl Fn(&Value) -> bool) -> (bool, Value) {
    let start = Instant::now();
    loop {
        let st = netns::status(ns).unwrap();
        if check(&st) {
            return (true, st);
        }
        if start.elapsed() > within {
            return (false, st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts the store in the client namespace, then door A (with its upstream, in the topology's
/// door namespace, configuration in `dir`) and door B (in its own, configuration in `dir_b`).
fn start_all(
    topo: &mut Topology,
    door_b: &SecondDoor,
    dir: &std::path::Path,
    dir_b: &std::path::Path,
) {
    let client_ns = topo.client_ns.clone();
    let redis = which("redis-server");
    let port = REDIS_PORT.to_string();
    topo.spawn_until(
        &client_ns,
        &redis,
        &[
            "--bind",
            REDIS_ADDR,
            "--port",
            &port,
            "--protected-mode",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        "Ready to accept connections",
        Duration::from_secs(10),
    )
    .unwrap();

    topo.start_door(dir, &config(DOOR_ADDR, &topo.door_if))
        .unwrap();
    let path_b = dir_b.join("door.toml");
    std::fs::write(&path_b, config(DOOR_B_ADDR, "veth-door")).unwrap();
    topo.spawn_until(
        &door_b.ns,
        &netns::sibling_bin("demo-upstream").unwrap(),
        &["--listen", "127.0.0.1:3000"],
        "listening",
        Duration::from_secs(30),
    )
    .unwrap();
    topo.spawn_until(
        &door_b.ns,
        &netns::door_bin().unwrap(),
        &["--config", path_b.to_str().unwrap()],
        "admin status",
        Duration::from_secs(30),
    )
    .unwrap();
}

#[test]
fn an_escalation_on_one_door_drops_the_prefix_at_the_other_doors_shield() {
    if !privileged_or_skip("netns_cluster") || !tools_or_skip("netns_cluster", &["redis-server"]) {
        return;
    }
    let dir = TempDir::new("netns-cluster").unwrap();
    let mut topo = Topology::new().unwrap();
    let door_b = SecondDoor::new(&topo);
    let dir_b = TempDir::new("netns-cluster-b").unwrap();
    start_all(&mut topo, &door_b, &dir.0, &dir_b.0);
    let client_ns = topo.client_ns.clone();
    for ns in [&topo.door_ns, &door_b.ns] {
        let (ok, st) = wait_status(ns, Duration::from_secs(10), |st| {
            st["cluster"]["state"] == "synced" && st["cluster"]["doors"] == 2
        });
        assert!(ok, "door in {ns} did not sync with both doors: {st:#}");
        assert_eq!(st["xdp"]["mode"], "driver", "{st:#}");
    }
    // Both clients reach door B to begin with.
    let url_b = format!("http://{DOOR_B_ADDR}:8443/healthz");
    for source in [CLIENT_ADDR, CLIENT2_ADDR] {
        let (code, _) =
            netns::curl(&client_ns, source, &["--connect-timeout", "2", &url_b]).unwrap();
        assert_ne!(code, 0, "{source} could not reach door B before any block");
    }

    // The client spends its link burst on door A, then collects 429s until door A escalates it.
    let url_a = format!("http://{DOOR_ADDR}:8443/l/session/x");
    let mut codes = Vec::new();
    for _ in 0..2 + ESCALATE_AFTER {
        codes.push(
            netns::curl(&client_ns, CLIENT_ADDR, &["--connect-timeout", "2", &url_a])
                .unwrap()
                .0,
        );
    }
    assert_eq!(codes, [200, 200, 429, 429, 429], "door A's answers");
    let escalated = Instant::now();
    let prefix = format!("{CLIENT_ADDR}/32");
    let st_a = netns::status(&topo.door_ns).unwrap();
    assert!(
        blocked_for(&st_a, &prefix).is_some(),
        "door A did not block the client: {st_a:#}"
    );

    // Door B's shield has it within a few sync intervals, with what is left of the 60 s.
    let (ok, st_b) = wait_status(&door_b.ns, Duration::from_secs(3), |st| {
        blocked_for(st, &prefix).is_some()
    });
    let took = escalated.elapsed();
    assert!(ok, "door B never blocked {prefix}: {st_b:#}");
    let left = blocked_for(&st_b, &prefix).unwrap();
    eprintln!("door B blocked {prefix} {took:?} after door A escalated it, {left} s left");
    assert!((57..=60).contains(&left), "{left} s left: {st_b:#}");

    // At door B's XDP: the blocked client's SYNs are dropped (its connection never opens) while
    // the other client is served.
    let before = counter(&st_b, "drop/blocked");
    let (code, _) =
        netns::curl(&client_ns, CLIENT_ADDR, &["--connect-timeout", "1", &url_b]).unwrap();
    assert_eq!(code, 0, "the blocked client reached door B");
    let (code, _) = netns::curl(
        &client_ns,
        CLIENT2_ADDR,
        &["--connect-timeout", "2", &url_b],
    )
    .unwrap();
    assert_eq!(code, 200, "the other client did not reach door B");
    let st_b = netns::status(&door_b.ns).unwrap();
    assert!(
        counter(&st_b, "drop/blocked") > before,
        "door B's shield did not drop the blocked client's SYNs: {st_b:#}"
    );
    drop(topo);
    drop(door_b);
}

/// `program`'s path on `PATH` (the namespace's `ip netns exec` needs a path or a name it finds).
fn which(program: &str) -> std::path::PathBuf {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(program))
                .find(|c| c.exists())
        })
        .unwrap_or_else(|| panic!("{program} is not on PATH"))
}
