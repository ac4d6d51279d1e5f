//! The operator's `allow` and `deny` lists at both layers, end to end in network namespaces
//! (root): door with XDP attached in driver mode on its veth end, curl in the client namespace
//! (192.0.2.0/24). A denied client's SYNs are dropped at the NIC (its connection never opens); an
//! allowed client is never shed at XDP nor limited at layer 7, even far past the budgets.

use door_tests::{
    netns::{self, CLIENT_ADDR, CLIENT2_ADDR, DOOR_ADDR, TempDir, Topology},
    privileged_or_skip,
};
use serde_json::Value;

/// One request per connection for the allowed client: the link burst and the SYN burst are both
/// far below it.
const ALLOWED_REQUESTS: usize = 12;

fn config(topo: &Topology) -> String {
    format!(
        r#"
listen = ["{DOOR_ADDR}:8443"]
upstream = "http://127.0.0.1:3000"
admin_listen = "127.0.0.1:9901"
allow = ["{CLIENT2_ADDR}/32"]
deny = ["{CLIENT_ADDR}/32"]

[[route]]
group = "link"
methods = ["GET"]
path = "/l/session/{{id}}"

[group.link]
rate = 0.001
burst = 2

[xdp]
interface = "{}"
mode = "driver"
ports = [8443]
syn_rate = 0.001
syn_burst = 3
"#,
        topo.door_if
    )
}

fn counter(st: &Value, name: &str) -> u64 {
    st.pointer("/xdp/counters")
        .and_then(|c| c.get(name))
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

#[test]
fn denied_clients_never_connect_and_allowed_ones_are_never_limited() {
    if !privileged_or_skip("netns_access") {
        return;
    }
    let dir = TempDir::new("netns-access").unwrap();
    let mut topo = Topology::new().unwrap();
    topo.start_door(&dir.0, &config(&topo)).unwrap();
    let st = netns::status(&topo.door_ns).unwrap();
    assert_eq!(st["xdp"]["mode"], "driver", "{st:#}");
    let url = format!("http://{DOOR_ADDR}:8443/l/session/demo");
    let client = topo.client_ns.clone();

    // Denied: every SYN is dropped at XDP, so curl never connects (bounded by its timeout).
    let (code, _) = netns::curl(&client, CLIENT_ADDR, &["--connect-timeout", "1", &url]).unwrap();
    assert_eq!(code, 0, "a denied client gets no connection");
    let st = netns::status(&topo.door_ns).unwrap();
    assert!(counter(&st, "drop/denied") >= 1, "{st:#}");

    // Allowed: past the SYN burst (3) and the link burst (2), every request is answered.
    for i in 0..ALLOWED_REQUESTS {
        let (code, head) = netns::curl(&client, CLIENT2_ADDR, &[&url]).unwrap();
        assert_eq!(code, 200, "allowed request {}: {head}", i + 1);
    }
    let st = netns::status(&topo.door_ns).unwrap();
    assert!(
        counter(&st, "pass/exempt") >= ALLOWED_REQUESTS as u64,
        "the allowed client's SYNs were exempt: {st:#}"
    );
    assert_eq!(counter(&st, "drop/syn_budget"), 0, "{st:#}");
}
