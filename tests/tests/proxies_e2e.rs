//! door behind real proxies from Debian's packages (root): nginx appending `X-Forwarded-For` and
//! HAProxy sending the PROXY protocol (v2 and v1) in TCP mode. A client namespace (two addresses,
//! 192.0.2.2 and 192.0.2.3) and a door namespace (192.0.2.1) joined by a veth pair; the proxy,
//! door and the demo upstream run in door's namespace, curl in the client's. The proxies are
//! children started with generated configurations in a temporary directory; everything (processes,
//! namespaces, directory) is removed on drop, also when an assertion fails.
//!
//! The point (docs/design.md, "Client key"; docs/troubleshooting.md): behind a proxy, a limiter
//! keyed on the TCP peer is one bucket for everyone, and a limiter that believes client-sent
//! headers lets a client pick (or drain) someone else's bucket.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step fails the test"
)]

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use door_tests::{
    netns::{CLIENT_ADDR, CLIENT2_ADDR, DOOR_ADDR, Topology, door_bin},
    privileged_or_skip,
};

/// Link budget for the run: burst 20 and a refill so slow (one token per 1000 s) that no token
/// comes back during the test, whatever the machine's speed.
const LINK_BURST: usize = 20;

/// How long a started process gets to say it is ready.
const READY: Duration = Duration::from_secs(30);

/// The proxies' public port in door's namespace.
const PROXY_PORT: u16 = 8080;
/// HAProxy's second frontend, sending PROXY protocol v1.
const PROXY_V1_PORT: u16 = 8081;

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("door-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// door's routes and link budget; `listen` is the TOML value of `listen`, `extra` more top-level
/// keys.
fn door_config(listen: &str, extra: &str) -> String {
    format!(
        r#"
listen = {listen}
upstream = "http://127.0.0.1:3000"
admin_listen = "127.0.0.1:9901"
{extra}

[[route]]
group = "link"
methods = ["GET"]
path = "/l/session/{{id}}"

[group.link]
rate = 0.001
burst = {LINK_BURST}
"#
    )
}

/// Starts the demo upstream and door (with `args`) in door's namespace.
fn start_door(topo: &mut Topology, dir: &TempDir, config: &str, args: &[&str]) {
    let ns = topo.door_ns.clone();
    let upstream = PathBuf::from(env!("CARGO_BIN_EXE_demo-upstream"));
    topo.spawn_until(
        &ns,
        &upstream,
        &["--listen", "127.0.0.1:3000"],
        "listening",
        READY,
    )
    .unwrap();
    let cfg = dir.write("door.toml", config);
    let mut all = vec!["--config", cfg.to_str().unwrap()];
    all.extend_from_slice(args);
    topo.spawn_until(&ns, &door_bin().unwrap(), &all, "admin status", READY)
        .unwrap();
}

/// Starts nginx in door's namespace on `DOOR_ADDR:PROXY_PORT`, forwarding to door on
/// 127.0.0.1:8443 and appending the client to `X-Forwarded-For`.
fn start_nginx(topo: &mut Topology, dir: &TempDir) {
    let d = dir.0.display();
    let conf = dir.write(
        "nginx.conf",
        &format!(
            r"
worker_processes 1;
pid {d}/nginx.pid;
error_log stderr notice;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    server {{
        listen {DOOR_ADDR}:{PROXY_PORT};
        location / {{
            proxy_pass http://127.0.0.1:8443;
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        }}
    }}
}}
"
        ),
    );
    let ns = topo.door_ns.clone();
    topo.spawn_until(
        &ns,
        Path::new("nginx"),
        &[
            "-p",
            dir.0.to_str().unwrap(),
            "-e",
            "stderr",
            "-c",
            conf.to_str().unwrap(),
            "-g",
            "daemon off;",
        ],
        "start worker process",
        READY,
    )
    .unwrap();
}

/// Starts HAProxy in TCP mode in door's namespace: `DOOR_ADDR:PROXY_PORT` sends PROXY protocol
/// v2 to door on `DOOR_ADDR:8444`, `DOOR_ADDR:PROXY_V1_PORT` sends v1.
fn start_haproxy(topo: &mut Topology, dir: &TempDir) {
    let conf = dir.write(
        "haproxy.cfg",
        &format!(
            r"
global
    log stderr format raw local0 notice
defaults
    mode tcp
    log global
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend v2
    bind {DOOR_ADDR}:{PROXY_PORT}
    default_backend door_v2
frontend v1
    bind {DOOR_ADDR}:{PROXY_V1_PORT}
    default_backend door_v1
backend door_v2
    server door {DOOR_ADDR}:8444 send-proxy-v2
backend door_v1
    server door {DOOR_ADDR}:8444 send-proxy
"
        ),
    );
    let ns = topo.door_ns.clone();
    topo.spawn_until(
        &ns,
        Path::new("haproxy"),
        &["-W", "-db", "-f", conf.to_str().unwrap()],
        "Loading success",
        READY,
    )
    .unwrap();
}

/// One request on a fresh connection from the client namespace, bound to `source`:
/// (HTTP status or 0 when there was none, headers and body).
fn curl(topo: &Topology, source: &str, args: &[&str]) -> (u16, String) {
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
    let out = Topology::run(&topo.client_ns, "curl", &all).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

fn link_url(port: u16) -> String {
    format!("http://{DOOR_ADDR}:{port}/l/session/demo")
}

/// Spends `source`'s whole link burst (every request 200), then checks the next one is 429.
fn drain(topo: &Topology, source: &str, port: u16, extra: &[&str]) {
    let url = link_url(port);
    let mut args = extra.to_vec();
    args.push(&url);
    for i in 0..LINK_BURST {
        let (code, head) = curl(topo, source, &args);
        assert_eq!(code, 200, "request {} of {source}'s burst: {head}", i + 1);
    }
    let (code, head) = curl(topo, source, &args);
    assert_eq!(code, 429, "{source} after its burst: {head}");
    assert!(head.contains(r#""group":"link""#), "{head}");
}

/// The body of the demo upstream's echo (`/echo` is in no group) as JSON.
fn echo(topo: &Topology, source: &str, port: u16, extra: &[&str]) -> serde_json::Value {
    let url = format!("http://{DOOR_ADDR}:{port}/echo");
    let mut args = extra.to_vec();
    args.push(&url);
    let (code, text) = curl(topo, source, &args);
    assert_eq!(code, 200, "{text}");
    let body = text.split("\r\n\r\n").last().unwrap_or_default();
    serde_json::from_str(body).unwrap()
}

#[test]
fn nginx_xff_two_clients_behind_it_get_separate_buckets() {
    if !privileged_or_skip("proxies_e2e") {
        return;
    }
    let dir = TempDir::new("nginx-sep");
    let mut topo = Topology::new().unwrap();
    let config = door_config(r#"["127.0.0.1:8443"]"#, "");
    start_door(&mut topo, &dir, &config, &["--trusted-proxy", "127.0.0.1"]);
    start_nginx(&mut topo, &dir);

    drain(&topo, CLIENT_ADDR, PROXY_PORT, &[]);
    let (code, head) = curl(&topo, CLIENT2_ADDR, &[&link_url(PROXY_PORT)]);
    assert_eq!(code, 200, "the second client has its own bucket: {head}");

    // door keeps the trusted chain and appends nginx: the application sees the client first.
    let e = echo(&topo, CLIENT2_ADDR, PROXY_PORT, &[]);
    assert_eq!(
        e["x_forwarded_for"],
        format!("{CLIENT2_ADDR}, 127.0.0.1"),
        "{e}"
    );
}

#[test]
fn nginx_forged_leftmost_xff_cannot_pick_or_drain_a_victims_bucket() {
    if !privileged_or_skip("proxies_e2e") {
        return;
    }
    let dir = TempDir::new("nginx-forged");
    let mut topo = Topology::new().unwrap();
    let config = door_config(r#"["127.0.0.1:8443"]"#, "");
    start_door(&mut topo, &dir, &config, &["--trusted-proxy", "127.0.0.1"]);
    start_nginx(&mut topo, &dir);

    // The attacker (CLIENT2) names the victim (CLIENT) as its client: nginx appends the real
    // address, door walks from the right and stops at it. The attacker drains its own bucket...
    let forged = format!("X-Forwarded-For: {CLIENT_ADDR}");
    drain(&topo, CLIENT2_ADDR, PROXY_PORT, &["-H", &forged]);
    // ...and a fresh forged address does not buy a new one.
    let (code, head) = curl(
        &topo,
        CLIENT2_ADDR,
        &[
            "-H",
            "X-Forwarded-For: 198.51.100.77",
            &link_url(PROXY_PORT),
        ],
    );
    assert_eq!(code, 429, "a forged XFF picks no bucket: {head}");
    // The victim's bucket is untouched.
    let (code, head) = curl(&topo, CLIENT_ADDR, &[&link_url(PROXY_PORT)]);
    assert_eq!(code, 200, "the victim was not drained: {head}");
}

#[test]
fn nginx_without_trusted_proxy_everyone_shares_the_proxys_bucket() {
    if !privileged_or_skip("proxies_e2e") {
        return;
    }
    let dir = TempDir::new("nginx-untrusted");
    let mut topo = Topology::new().unwrap();
    let config = door_config(r#"["127.0.0.1:8443"]"#, "");
    start_door(&mut topo, &dir, &config, &[]);
    start_nginx(&mut topo, &dir);

    // As documented (README, docs/design.md "Client key"): without --trusted-proxy the key is the
    // TCP peer, nginx, so the first client's burst is everyone's.
    drain(&topo, CLIENT_ADDR, PROXY_PORT, &[]);
    let (code, head) = curl(&topo, CLIENT2_ADDR, &[&link_url(PROXY_PORT)]);
    assert_eq!(
        code, 429,
        "one bucket for everyone behind an untrusted proxy: {head}"
    );
    // door replaced nginx's chain by the peer it saw.
    let e = echo(&topo, CLIENT2_ADDR, PROXY_PORT, &[]);
    assert_eq!(e["x_forwarded_for"], "127.0.0.1", "{e}");
}

#[test]
fn haproxy_proxy_protocol_clients_get_separate_buckets_and_untrusted_peers_are_refused() {
    if !privileged_or_skip("proxies_e2e") {
        return;
    }
    let dir = TempDir::new("haproxy");
    let mut topo = Topology::new().unwrap();
    let config = door_config(
        &format!(r#"[{{ addr = "{DOOR_ADDR}:8444", proxy_protocol = true }}]"#),
        &format!(r#"trusted_proxies = ["{DOOR_ADDR}"]"#),
    );
    start_door(&mut topo, &dir, &config, &[]);
    start_haproxy(&mut topo, &dir);

    // v2: the first client drains its bucket, keyed on its real address...
    drain(&topo, CLIENT_ADDR, PROXY_PORT, &[]);
    // ...the second still has its own (through the v1 frontend as well).
    let (code, head) = curl(&topo, CLIENT2_ADDR, &[&link_url(PROXY_PORT)]);
    assert_eq!(
        code, 200,
        "v2: the second client has its own bucket: {head}"
    );
    let (code, head) = curl(&topo, CLIENT2_ADDR, &[&link_url(PROXY_V1_PORT)]);
    assert_eq!(
        code, 200,
        "v1: the second client has its own bucket: {head}"
    );
    let (code, head) = curl(&topo, CLIENT_ADDR, &[&link_url(PROXY_V1_PORT)]);
    assert_eq!(code, 429, "v1: the first client is still limited: {head}");

    // The header's address is the peer for the forwarding headers too; a client's own XFF is
    // dropped (it is not a trusted proxy).
    let e = echo(
        &topo,
        CLIENT2_ADDR,
        PROXY_PORT,
        &["-H", "X-Forwarded-For: 198.51.100.77"],
    );
    assert_eq!(e["x_forwarded_for"], CLIENT2_ADDR, "{e}");

    // A direct connection from an untrusted peer to the PROXY protocol listener is refused,
    // whether it sends plain HTTP or a forged header.
    let direct = format!("http://{DOOR_ADDR}:8444/l/session/demo");
    let (code, head) = curl(&topo, CLIENT2_ADDR, &[&direct]);
    assert_eq!(code, 0, "no HTTP answer to an untrusted peer: {head}");
    let (code, head) = curl(&topo, CLIENT2_ADDR, &["--haproxy-protocol", &direct]);
    assert_eq!(code, 0, "a forged header from an untrusted peer: {head}");
    // The second client's bucket was not touched by either.
    let (code, head) = curl(&topo, CLIENT2_ADDR, &[&link_url(PROXY_PORT)]);
    assert_eq!(code, 200, "{head}");
}
