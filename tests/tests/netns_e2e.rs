//! End to end in network namespaces (root): a client namespace and a door namespace joined by a
//! veth pair (192.0.2.0/24, 2001:db8::/32), XDP attached to door's end in driver mode, door and
//! the demo upstream in door's namespace, curl in the client's. Namespaces are removed on drop,
//! also when an assertion fails.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step fails the test"
)]

use door_tests::{
    netns::{self, CLIENT_ADDR, CLIENT2_ADDR, DOOR_ADDR, TempDir, Topology, syns_of},
    privileged_or_skip,
};
use serde_json::Value;

/// Link budget for the run: burst 20 and a refill so slow (one token per 1000 s) that no token
/// comes back during the test, whatever the machine's speed.
const LINK_BURST: usize = 20;
/// Webhook budget for the run (charge on failure), as slow as the link's.
const WEBHOOK_BURST: usize = 5;

fn config(topo: &Topology) -> String {
    format!(
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

[group.webhook]
rate = 0.001
burst = {WEBHOOK_BURST}
per_client = 4

[xdp]
interface = "{}"
mode = "driver"
ports = [8443]
"#,
        topo.door_if
    )
}

fn curl(ns: &str, source: &str, args: &[&str]) -> (u16, String) {
    netns::curl(ns, source, args).unwrap()
}

fn status(topo: &Topology) -> Value {
    netns::status(&topo.door_ns).unwrap()
}

#[test]
fn link_burst_then_429_per_client_with_xdp_counting_syns() {
    if !privileged_or_skip("netns_e2e") {
        return;
    }
    let dir = TempDir::new("netns").unwrap();
    let mut topo = Topology::new().unwrap();
    topo.start_door(&dir.0, &config(&topo)).unwrap();

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
}

#[test]
fn ipv6_client_is_keyed_and_counted_on_its_slash_64() {
    if !privileged_or_skip("netns_e2e") {
        return;
    }
    let dir = TempDir::new("netns6").unwrap();
    let mut topo = Topology::new().unwrap();
    topo.start_door(&dir.0, &config(&topo)).unwrap();
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
}

#[test]
fn webhook_4xx_answers_drain_the_bucket_2xx_do_not() {
    if !privileged_or_skip("netns_e2e") {
        return;
    }
    let dir = TempDir::new("webhook").unwrap();
    let mut topo = Topology::new().unwrap();
    topo.start_door(&dir.0, &config(&topo)).unwrap();
    let client = topo.client_ns.clone();
    let hook = format!("http://{DOOR_ADDR}:8443/webhooks/github");
    let post = |source: &str, status: &str| {
        let header = format!("x-demo-status: {status}");
        curl(
            &client,
            source,
            &["-X", "POST", "-H", &header, "--data", "{}", &hook],
        )
    };
    // Signed deliveries the application accepts never spend a token: far more than the burst pass.
    for i in 0..3 * WEBHOOK_BURST {
        assert_eq!(
            post(CLIENT2_ADDR, "200").0,
            200,
            "accepted delivery {}",
            i + 1
        );
    }
    // Garbage the application rejects spends one token per 4xx answer...
    for i in 0..WEBHOOK_BURST {
        assert_eq!(
            post(CLIENT_ADDR, "400").0,
            400,
            "rejected delivery {}",
            i + 1
        );
    }
    // ...so the next request from that client is refused by door, whatever it carries.
    let (code, head) = post(CLIENT_ADDR, "200");
    assert_eq!(code, 429, "{head}");
    assert!(head.contains(r#""group":"webhook""#), "{head}");
    // The other client is unaffected.
    assert_eq!(post(CLIENT2_ADDR, "200").0, 200);
    let st = status(&topo);
    assert_eq!(
        st["requests"]["webhook"]["ok"],
        (3 * WEBHOOK_BURST + 1) as u64,
        "{st:#}"
    );
    assert_eq!(
        st["requests"]["webhook"]["client_error"], WEBHOOK_BURST as u64,
        "{st:#}"
    );
    assert_eq!(st["requests"]["webhook"]["rate_limited"], 1, "{st:#}");
}
