//! BPF_PROG_TEST_RUN suite of cookie mode's answer (docs/design.md, "Flood shield", SYN
//! cookies): a SYN in cookie mode comes back as the SYN-ACK carrying the kernel's SYN cookie
//! (`XDP_TX`), for IPv4 and IPv6, without and with VLAN tags, for each shape of TCP options; the
//! output frame is parsed with etherparse and its fields and checksums checked.
//!
//! The kernel side is real, not faked: BPF_PROG_TEST_RUN runs an XDP program as if the packet had
//! arrived on the loopback device of the calling thread's network namespace, so
//! `bpf_skc_lookup_tcp` finds the listening sockets of that namespace. Each test moves its own
//! thread (only that thread: `unshare(CLONE_NEWNET)`) into a new network namespace, sets
//! `net.ipv4.tcp_syncookies` there (2: `bpf_tcp_gen_syncookie` makes a cookie whenever asked,
//! without waiting for a full SYN queue) and listens on `[::]` (dual-stack) on an ephemeral port.
//! The cookie's value depends on the kernel's secret and clock, so the tests check where it goes
//! (the sequence number) and the MSS it encodes; the netns flood suite shows clients completing
//! handshakes with it.
//!
//! Needs root; `cargo xtask test` runs it with `--test-threads=1`. Budgets and the cookie-mode
//! threshold use rates so slow (one token per 1000 s) that the program's clock makes no difference.
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test helpers: a failed step fails the test; offsets into frames built here"
)]

use std::{net::TcpListener, time::Duration};

use door_common::Counter;
use door_daemon::{
    config::{SynCookies, XdpConfig, XdpMode},
    shield::Shield,
};
use door_tests::{
    netns,
    packets::{
        Ext, ipv4_fragment, syn4_with_options, syn6_with_options, with_ipv4_options,
        with_ipv6_extensions, with_vlans,
    },
    pin_to_one_cpu, privileged_or_skip,
};
use etherparse::{LinkExtHeader, LinkHeader, NetHeaders, PacketHeaders, TransportHeader};

const XDP_PASS: u32 = 2;
const ETH_HLEN: usize = 14;
const XDP_TX: u32 = 3;
const CLIENT4: [u8; 4] = [198, 51, 100, 7];
const SERVER4: [u8; 4] = [203, 0, 113, 1];
const CLIENT6: [u8; 16] = [
    0x20, 0x01, 0x0d, 0xb8, 0, 0xc1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2,
];
const SERVER6: [u8; 16] = [
    0x20, 0x01, 0x0d, 0xb8, 0, 0xd0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
];
const CLIENT_PORT: u16 = 40_123;
const CLIENT_SEQ: u32 = 0xfedc_ba98;
/// One token per 1000 s: nothing refills during a test.
const FROZEN_RATE: f64 = 0.001;

/// The shapes of TCP options a SYN can carry, with the MSS the kernel's cookie then encodes for
/// IPv4 and for IPv6 (`bpf_tcp_gen_syncookie` rounds down to its tables: 536, 1300, 1440, 1460
/// for IPv4; 1220, 1420, 1440, 8940 for IPv6; without a usable MSS option, 536 and 1220).
struct Shape {
    name: &'static str,
    options: &'static [u8],
    mss4: u16,
    mss6: u16,
}

const SHAPES: [Shape; 5] = [
    Shape {
        name: "no options",
        options: &[],
        mss4: 536,
        mss6: 1220,
    },
    Shape {
        name: "MSS only",
        options: &[2, 4, 0x05, 0xb4],
        mss4: 1460,
        mss6: 1440,
    },
    Shape {
        // Linux's own SYN: MSS 1460, SACK permitted, timestamps, NOP, window scale 7 (20 bytes).
        name: "Linux-style options",
        options: &[
            2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0x12, 0x34, 0x56, 0x78, 0, 0, 0, 0, 1, 3, 3, 7,
        ],
        mss4: 1460,
        mss6: 1440,
    },
    Shape {
        // A "silly" option of length 1 before the MSS: the kernel stops parsing there.
        name: "malformed: silly option length",
        options: &[8, 1, 2, 4, 0x05, 0xb4, 0, 0],
        mss4: 536,
        mss6: 1220,
    },
    Shape {
        // MSS 1300, then an option running past the header's end: the MSS found so far counts.
        name: "malformed: option past the end",
        options: &[2, 4, 0x05, 0x14, 3, 9, 1, 1],
        mss4: 1300,
        mss6: 1220,
    },
];

/// The VLAN stacks tried: none, one 802.1Q tag, an 802.1ad tag over an 802.1Q tag.
const VLANS: [&[u16]; 3] = [&[], &[0x8100], &[0x88a8, 0x8100]];

fn settings(port: u16) -> XdpConfig {
    let cpus = aya::util::nr_cpus().unwrap();
    #[expect(clippy::cast_precision_loss, reason = "a CPU count")]
    let threshold = FROZEN_RATE * cpus as f64;
    XdpConfig {
        interface: None,
        mode: XdpMode::Off,
        syn_rate: FROZEN_RATE,
        syn_burst: 1_000,
        ports: vec![port],
        new_prefix_rate: 0.0,
        new_prefix_burst: 1,
        overflow_syn_rate: FROZEN_RATE,
        overflow_syn_burst: 1_000,
        max_prefixes: door_common::PREFIX_MAP_CAPACITY,
        allow: Vec::new(),
        deny: Vec::new(),
        escalate_after: 0,
        escalate_window: Duration::from_secs(10),
        block_for: Duration::from_mins(1),
        syn_cookies: SynCookies::Auto,
        // This CPU's share is one token per 1000 s: the first SYN fits, every later one is over.
        cookie_threshold: threshold,
    }
}

/// A shield in cookie mode on this thread's CPU, in a network namespace of its own with
/// `tcp_syncookies = syncookies` and a listener there on `[::]` (IPv4 too) on an ephemeral
/// port, which the shield protects; cookie mode entered with one SYN. The listener is closed
/// again unless `listen`; the port is returned either way.
fn cookie_shield(syncookies: u8, listen: bool) -> Option<(Shield, Option<TcpListener>, u16)> {
    if !privileged_or_skip("xdp_syn_cookie") {
        return None;
    }
    netns::enter_new_netns(syncookies).unwrap();
    pin_to_one_cpu().unwrap();
    let listener = TcpListener::bind("[::]:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let listener = listen.then_some(listener);
    let mut shield = Shield::load().expect("door's XDP program loads and passes the verifier");
    shield.configure(&settings(port), &[], &[]).unwrap();
    let warm_up = syn4_with_options([192, 0, 2, 200], SERVER4, 1, port, 1, &[]);
    assert_eq!(run_frame(&shield, &warm_up).0, (XDP_PASS, Counter::PassSyn));
    Some((shield, listener, port))
}

/// The client's SYN to `port` over IPv4 with one option, MSS 1460 (the shape most cases use).
fn mss_syn4(port: u16) -> Vec<u8> {
    mss_syn4_from(CLIENT_PORT, port)
}

/// [`mss_syn4`] from the client's port `from`.
fn mss_syn4_from(from: u16, port: u16) -> Vec<u8> {
    syn4_with_options(CLIENT4, SERVER4, from, port, CLIENT_SEQ, &[2, 4, 5, 0xb4])
}

/// The client's SYN to `port` over IPv6 with one option, MSS 1460.
fn mss_syn6(port: u16) -> Vec<u8> {
    syn6_with_options(
        CLIENT6,
        SERVER6,
        CLIENT_PORT,
        port,
        CLIENT_SEQ,
        &[2, 4, 5, 0xb4],
    )
}

fn run_frame(shield: &Shield, frame: &[u8]) -> ((u32, Counter), Vec<u8>) {
    let before = shield.counters().unwrap();
    let (action, out) = shield.test_run_frame(frame).unwrap();
    let after = shield.counters().unwrap();
    let moved: Vec<Counter> = before
        .iter()
        .zip(&after)
        .filter(|(b, a)| a.packets != b.packets)
        .map(|(_, a)| a.counter)
        .collect();
    assert_eq!(moved.len(), 1, "exactly one counter per packet: {moved:?}");
    ((action, moved[0]), out)
}

/// What the SYN said, read back with etherparse.
struct Syn {
    macs: ([u8; 6], [u8; 6]),
    vlans: Vec<LinkExtHeader>,
    ports: (u16, u16),
    seq: u32,
}

fn read_syn(frame: &[u8]) -> Syn {
    let h = PacketHeaders::from_ethernet_slice(frame).unwrap();
    let Some(LinkHeader::Ethernet2(eth)) = h.link else {
        panic!("not Ethernet II")
    };
    let Some(TransportHeader::Tcp(tcp)) = h.transport else {
        panic!("not TCP")
    };
    Syn {
        macs: (eth.source, eth.destination),
        vlans: h.link_exts.to_vec(),
        ports: (tcp.source_port, tcp.destination_port),
        seq: tcp.sequence_number,
    }
}

/// Checks that `out` is the SYN-ACK answering the SYN `input`, with MSS `mss` (as an option
/// when `with_option`), and returns its sequence number (the cookie).
fn check_syn_ack(input: &[u8], out: &[u8], mss: u16, with_option: bool, what: &str) -> u32 {
    let syn = read_syn(input);
    let h = PacketHeaders::from_ethernet_slice(out)
        .unwrap_or_else(|e| panic!("{what}: the output does not parse: {e}"));
    let Some(LinkHeader::Ethernet2(eth)) = &h.link else {
        panic!("{what}: not Ethernet II")
    };
    assert_eq!(
        (eth.destination, eth.source),
        syn.macs,
        "{what}: MAC addresses swapped"
    );
    assert_eq!(h.link_exts.to_vec(), syn.vlans, "{what}: VLAN tags kept");
    let Some(TransportHeader::Tcp(tcp)) = &h.transport else {
        panic!("{what}: not TCP")
    };
    assert!(
        h.payload.slice().is_empty(),
        "{what}: no payload, no padding"
    );
    let tcp_len = if with_option { 24 } else { 20 };
    match &h.net {
        Some(NetHeaders::Ipv4(ip, ext)) => {
            assert!(ext.is_empty(), "{what}");
            assert_eq!(
                (ip.source, ip.destination),
                (SERVER4, CLIENT4),
                "{what}: addresses"
            );
            assert_eq!(ip.time_to_live, 64, "{what}");
            assert!(ip.dont_fragment && !ip.more_fragments, "{what}: DF");
            assert_eq!(ip.total_len, 20 + tcp_len, "{what}: total length");
            assert_eq!(
                ip.header_checksum,
                ip.calc_header_checksum(),
                "{what}: IPv4 checksum"
            );
            assert_eq!(
                tcp.checksum,
                tcp.calc_checksum_ipv4(ip, &[]).unwrap(),
                "{what}: TCP checksum"
            );
        }
        Some(NetHeaders::Ipv6(ip, ext)) => {
            assert!(ext.is_empty(), "{what}");
            assert_eq!(
                (ip.source, ip.destination),
                (SERVER6, CLIENT6),
                "{what}: addresses"
            );
            assert_eq!(ip.hop_limit, 64, "{what}");
            assert_eq!(ip.payload_length, tcp_len, "{what}: payload length");
            assert_eq!(
                tcp.checksum,
                tcp.calc_checksum_ipv6(ip, &[]).unwrap(),
                "{what}: TCP checksum"
            );
        }
        other => panic!("{what}: not IP: {other:?}"),
    }
    assert_eq!(
        (tcp.source_port, tcp.destination_port),
        (syn.ports.1, syn.ports.0),
        "{what}: ports swapped"
    );
    assert!(tcp.syn && tcp.ack, "{what}: SYN|ACK");
    assert!(
        !(tcp.fin || tcp.rst || tcp.psh || tcp.urg || tcp.ece || tcp.cwr),
        "{what}"
    );
    assert_eq!(
        tcp.acknowledgment_number,
        syn.seq.wrapping_add(1),
        "{what}: ack"
    );
    assert_eq!(tcp.urgent_pointer, 0, "{what}");
    let [hi, lo] = mss.to_be_bytes();
    let expected: &[u8] = if with_option { &[2, 4, hi, lo] } else { &[] };
    assert_eq!(tcp.options.as_slice(), expected, "{what}: options");
    let window = if mss > 1460 {
        (14_600 / u32::from(mss)).max(2) * u32::from(mss)
    } else {
        10 * u32::from(mss)
    };
    assert_eq!(
        u32::from(tcp.window_size),
        window.min(65_535),
        "{what}: window"
    );
    tcp.sequence_number
}

/// The shield's OTLP instruments, collected once: `door.xdp.packets` for `tx/syn_cookie` and
/// `door.xdp.cookie_mode` for `entered`.
fn exported(shield: Shield) -> (u64, u64) {
    use std::sync::{Arc, Mutex};

    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::metrics::{
        InMemoryMetricExporter, PeriodicReader, SdkMeterProvider,
        data::{AggregatedMetrics, MetricData},
    };

    let shield = Arc::new(Mutex::new(shield));
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    let _instruments = door_daemon::shield::observe(&provider.meter("door"), &shield);
    provider.force_flush().unwrap();
    let (mut tx, mut entered) = (0, 0);
    let all = exporter.get_finished_metrics().unwrap();
    for scope in all.last().unwrap().scope_metrics() {
        for metric in scope.metrics() {
            let AggregatedMetrics::U64(MetricData::Sum(sum)) = metric.data() else {
                continue;
            };
            for p in sum.data_points() {
                let mut attrs: Vec<String> =
                    p.attributes().map(|kv| kv.value.to_string()).collect();
                attrs.sort();
                match metric.name() {
                    "door.xdp.packets" if attrs == ["syn_cookie", "tx"] => tx = p.value(),
                    "door.xdp.cookie_mode" if attrs == ["entered"] => entered = p.value(),
                    _ => {}
                }
            }
        }
    }
    (tx, entered)
}

fn answers_every_shape(v6: bool) {
    let Some((shield, _listener, port)) = cookie_shield(2, true) else {
        return;
    };
    let mut sent = 0;
    for vlans in VLANS {
        for shape in &SHAPES {
            let syn = if v6 {
                syn6_with_options(
                    CLIENT6,
                    SERVER6,
                    CLIENT_PORT,
                    port,
                    CLIENT_SEQ,
                    shape.options,
                )
            } else {
                syn4_with_options(
                    CLIENT4,
                    SERVER4,
                    CLIENT_PORT,
                    port,
                    CLIENT_SEQ,
                    shape.options,
                )
            };
            let syn = with_vlans(&syn, vlans);
            let what = format!("{} with VLAN tags {vlans:x?}", shape.name);
            let ((action, counter), out) = run_frame(&shield, &syn);
            assert_eq!((action, counter), (XDP_TX, Counter::TxSynCookie), "{what}");
            let mss = if v6 { shape.mss6 } else { shape.mss4 };
            check_syn_ack(&syn, &out, mss, !shape.options.is_empty(), &what);
            sent += 1;
        }
    }
    let tx = shield
        .counters()
        .unwrap()
        .into_iter()
        .find(|c| c.counter == Counter::TxSynCookie)
        .unwrap();
    assert_eq!(tx.packets, sent);
    let c = shield.cookies().unwrap();
    assert_eq!((c.active_cpus, c.entered, c.left), (1, 1, 0));
    assert_eq!(
        exported(shield),
        (sent, 1),
        "OTLP: tx/syn_cookie and entered"
    );
}

#[test]
fn ipv4_syn_in_cookie_mode_is_answered_with_a_syn_ack_carrying_the_cookie() {
    answers_every_shape(false);
}

#[test]
fn ipv6_syn_in_cookie_mode_is_answered_with_a_syn_ack_carrying_the_cookie() {
    answers_every_shape(true);
}

#[test]
fn without_a_listener_the_syn_passes_unchanged() {
    let Some((shield, _, port)) = cookie_shield(2, false) else {
        return;
    };
    for syn in [mss_syn4(port), mss_syn6(port)] {
        let (verdict, out) = run_frame(&shield, &syn);
        assert_eq!(verdict, (XDP_PASS, Counter::PassNoListener));
        assert_eq!(out, syn, "the SYN is left as it was");
    }
}

/// A CPU whose flood has stopped for the hold leaves cookie mode at its next SYN, however much
/// later it comes, and judges that SYN as out of the mode; `/status` counts the CPU out before
/// that SYN. A flood that comes back enters the mode again.
#[test]
fn a_cpu_quiet_for_the_hold_leaves_cookie_mode_at_its_next_syn() {
    let Some((mut shield, _, port)) = cookie_shield(2, false) else {
        return;
    };
    let syn = mss_syn4(port);
    let in_mode = (XDP_PASS, Counter::PassNoListener);
    // The flood: the first SYN over the threshold enters cookie mode, the next finds it on.
    assert_eq!(run_frame(&shield, &syn).0, in_mode, "entered");
    assert_eq!(run_frame(&shield, &syn).0, in_mode, "still in the flood");
    let c = shield.cookies().unwrap();
    assert_eq!(
        (c.active_cpus, c.entered, c.left),
        (1, 1, 0),
        "in cookie mode"
    );
    // The kernel's clock cannot be moved: the CPU's leave bucket is made to have been full
    // since long before the hold (1 s) instead, as after a flood that stopped.
    shield
        .update_cookie_states(|s| {
            if s.active != 0 {
                s.leave_tat_ns = 1;
                // And no hold under way: only the quiet rule can let the next SYN leave.
                s.below_since_ns = 0;
            }
        })
        .unwrap();
    let c = shield.cookies().unwrap();
    assert_eq!(
        (c.active_cpus, c.left),
        (0, 0),
        "/status counts the quiet CPU out before the program leaves"
    );
    assert_eq!(
        run_frame(&shield, &syn).0,
        (XDP_PASS, Counter::PassSyn),
        "the next SYN leaves cookie mode and is judged out of it"
    );
    let c = shield.cookies().unwrap();
    assert_eq!((c.active_cpus, c.entered, c.left), (0, 1, 1), "left once");
    // The mode left with its bucket full (one token at this threshold): the flood's return
    // spends it, then enters cookie mode again.
    assert_eq!(run_frame(&shield, &syn).0, (XDP_PASS, Counter::PassSyn));
    assert_eq!(run_frame(&shield, &syn).0, in_mode, "entered again");
    let c = shield.cookies().unwrap();
    assert_eq!((c.active_cpus, c.entered, c.left), (1, 2, 1));
}

#[test]
fn when_the_kernel_declines_the_syn_passes_unchanged() {
    // tcp_syncookies = 1 and an empty SYN queue: no flood pressure on the listener, so
    // `bpf_tcp_gen_syncookie` returns -ENOENT and the kernel takes the SYN as usual.
    let Some((shield, _listener, port)) = cookie_shield(1, true) else {
        return;
    };
    for syn in [mss_syn4(port), mss_syn6(port)] {
        let (verdict, out) = run_frame(&shield, &syn);
        assert_eq!(verdict, (XDP_PASS, Counter::PassCookieDeclined));
        assert_eq!(out, syn, "the SYN is left as it was");
    }
}

#[test]
fn ipv4_options_and_ipv6_extension_headers_are_left_to_the_kernel() {
    let Some((shield, _listener, port)) = cookie_shield(2, true) else {
        return;
    };
    let v4 = with_ipv4_options(&mss_syn4(port), 2);
    let v6 = with_ipv6_extensions(&mss_syn6(port), &[Ext::DestOpts { extra: 0 }]);
    for syn in [v4, v6] {
        let (verdict, out) = run_frame(&shield, &syn);
        assert_eq!(verdict, (XDP_PASS, Counter::PassCookieUnavailable));
        assert_eq!(out, syn, "the SYN is left as it was");
    }
}

/// SYNs the kernel would not answer are not answered from XDP either, so that a spoofed SYN
/// cannot make door send a SYN-ACK to a group address or a martian: a group Ethernet address
/// either way, multicast, broadcast, class E, zero or loopback IPv4 addresses, multicast,
/// unspecified, loopback or IPv4-mapped IPv6 sources, a source that is the destination.
#[test]
fn syns_the_kernel_would_not_answer_are_passed_unanswered() {
    let Some((shield, _listener, port)) = cookie_shield(2, true) else {
        return;
    };
    let syn4 = |src: [u8; 4], dst: [u8; 4]| {
        syn4_with_options(src, dst, CLIENT_PORT, port, CLIENT_SEQ, &[2, 4, 5, 0xb4])
    };
    let syn6 = |src: [u8; 16], dst: [u8; 16]| {
        syn6_with_options(src, dst, CLIENT_PORT, port, CLIENT_SEQ, &[2, 4, 5, 0xb4])
    };
    let mut ff02_1 = [0u8; 16];
    ff02_1[0] = 0xff;
    ff02_1[1] = 0x02;
    ff02_1[15] = 1;
    let mut loopback6 = [0u8; 16];
    loopback6[15] = 1;
    let mut mapped = [0u8; 16];
    mapped[10..12].copy_from_slice(&[0xff, 0xff]);
    mapped[12..].copy_from_slice(&CLIENT4);
    let with_mac = |at: usize, mac: [u8; 6]| {
        let mut f = mss_syn4(port);
        f[at..at + 6].copy_from_slice(&mac);
        f
    };
    let unanswered = [
        (
            "to the broadcast address",
            syn4(CLIENT4, [255, 255, 255, 255]),
        ),
        ("to a multicast group", syn4(CLIENT4, [224, 0, 0, 1])),
        ("from a multicast group", syn4([224, 0, 0, 251], SERVER4)),
        ("from 0.0.0.0", syn4([0, 0, 0, 0], SERVER4)),
        ("from class E", syn4([240, 0, 0, 1], SERVER4)),
        ("from loopback", syn4([127, 0, 0, 1], SERVER4)),
        ("from itself", syn4(SERVER4, SERVER4)),
        ("to the Ethernet broadcast", with_mac(0, [0xff; 6])),
        (
            "to an Ethernet multicast",
            with_mac(0, [0x01, 0, 0x5e, 0, 0, 1]),
        ),
        ("from the Ethernet broadcast", with_mac(6, [0xff; 6])),
        ("IPv6 to ff02::1", syn6(CLIENT6, ff02_1)),
        ("IPv6 from ff02::1", syn6(ff02_1, SERVER6)),
        ("IPv6 from ::", syn6([0; 16], SERVER6)),
        ("IPv6 from ::1", syn6(loopback6, SERVER6)),
        ("IPv6 from an IPv4-mapped address", syn6(mapped, SERVER6)),
        ("IPv6 from itself", syn6(SERVER6, SERVER6)),
        ("IPv4 to loopback", syn4(CLIENT4, [127, 0, 0, 1])),
        ("IPv4 to 0.0.0.0", syn4(CLIENT4, [0, 0, 0, 0])),
        ("IPv6 to ::1", syn6(CLIENT6, loopback6)),
        ("IPv6 to ::", syn6(CLIENT6, [0; 16])),
        ("IPv6 to an IPv4-mapped address", syn6(CLIENT6, mapped)),
    ];
    for (what, syn) in unanswered {
        let (verdict, out) = run_frame(&shield, &syn);
        assert_eq!(
            verdict,
            (XDP_PASS, Counter::PassCookieUnavailable),
            "{what}"
        );
        assert_eq!(out, syn, "{what}: the SYN is left as it was");
    }
}

/// Nor are SYNs answered that the kernel discards, or whose datagram it has not seen whole: a
/// bad IPv4 header checksum, a datagram longer than its frame (IPv4 and IPv6), an IPv6 payload
/// length of 0 without a jumbo option, a TCP header whose options go on past the datagram (into
/// the frame's padding), an IPv4 first fragment (the rest of the datagram may change what a
/// cookie promised).
#[test]
fn syns_the_kernel_discards_are_passed_unanswered() {
    let Some((shield, _listener, port)) = cookie_shield(2, true) else {
        return;
    };
    let mut bad_check = mss_syn4(port);
    bad_check[ETH_HLEN + 10] ^= 0xff;
    let mut long4 = mss_syn4(port);
    long4[ETH_HLEN + 2..ETH_HLEN + 4].copy_from_slice(&1000u16.to_be_bytes());
    let mut zero6 = mss_syn6(port);
    zero6[ETH_HLEN + 4..ETH_HLEN + 6].copy_from_slice(&[0, 0]);
    let mut long6 = mss_syn6(port);
    long6[ETH_HLEN + 4..ETH_HLEN + 6].copy_from_slice(&1000u16.to_be_bytes());
    // A SYN without options whose data offset says 24 bytes, the last 4 (an MSS option) in the
    // link layer's padding after the datagram.
    let mut padded = syn4_with_options(CLIENT4, SERVER4, CLIENT_PORT, port, CLIENT_SEQ, &[]);
    padded[ETH_HLEN + 20 + 12] = 6 << 4;
    padded.extend_from_slice(&[2, 4, 5, 0xb4]);
    let malformed = [
        (
            "a bad IPv4 header checksum",
            bad_check,
            Counter::PassMalformed,
        ),
        (
            "an IPv4 datagram longer than its frame",
            long4,
            Counter::PassCookieUnavailable,
        ),
        (
            "an IPv6 payload length of 0 without a jumbo option",
            zero6,
            Counter::PassTruncated,
        ),
        (
            "TCP options in the frame's padding",
            padded,
            Counter::PassCookieUnavailable,
        ),
        (
            "an IPv4 first fragment (more fragments set)",
            ipv4_fragment(&mss_syn4(port), 0, true),
            Counter::PassCookieUnavailable,
        ),
        (
            "an IPv6 datagram longer than its frame",
            long6,
            Counter::PassCookieUnavailable,
        ),
    ];
    for (what, syn, counter) in malformed {
        let (verdict, out) = run_frame(&shield, &syn);
        assert_eq!(verdict, (XDP_PASS, counter), "{what}");
        assert_eq!(out, syn, "{what}: the SYN is left as it was");
    }
}

/// Runs `ip ARGS` in this thread's network namespace (a child inherits the thread's).
fn ip(args: &str) {
    let status = std::process::Command::new("ip")
        .args(args.split(' '))
        .status()
        .unwrap();
    assert!(status.success(), "ip {args}");
}

/// On a host that forwards (a Kubernetes node, a router) with a wildcard listener on a protected
/// port, a SYN for another host's address is routed on by the kernel: cookie mode leaves it to
/// the kernel instead of answering for that host; a SYN for this host's own address is answered.
#[test]
fn on_a_forwarding_host_a_syn_for_another_host_is_left_to_the_kernel() {
    let Some((shield, _listener, port)) = cookie_shield(2, true) else {
        return;
    };
    ip("link set lo up");
    ip("addr add 203.0.113.1/32 dev lo");
    ip("-6 addr add 2001:db8:d0::1/128 dev lo");
    ip("route add 192.0.2.0/24 dev lo");
    ip("-6 route add 2001:db8:99::/64 dev lo");
    for sysctl in ["ipv4/conf/all/forwarding", "ipv6/conf/all/forwarding"] {
        std::fs::write(format!("/proc/sys/net/{sysctl}"), "1\n").unwrap();
    }
    let to4 = |dst: [u8; 4]| {
        syn4_with_options(
            CLIENT4,
            dst,
            CLIENT_PORT,
            port,
            CLIENT_SEQ,
            &[2, 4, 5, 0xb4],
        )
    };
    let to6 = |dst: [u8; 16]| {
        syn6_with_options(
            CLIENT6,
            dst,
            CLIENT_PORT,
            port,
            CLIENT_SEQ,
            &[2, 4, 5, 0xb4],
        )
    };
    let mut elsewhere6 = SERVER6;
    elsewhere6[5] = 0x99;
    elsewhere6[4] = 0;
    for (what, syn) in [
        ("IPv4 routed on", to4([192, 0, 2, 99])),
        ("IPv6 routed on", to6(elsewhere6)),
    ] {
        let (verdict, out) = run_frame(&shield, &syn);
        assert_eq!(
            verdict,
            (XDP_PASS, Counter::PassCookieUnavailable),
            "{what}"
        );
        assert_eq!(out, syn, "{what}: the SYN is left as it was");
    }
    for (what, syn) in [
        ("IPv4 to this host", to4(SERVER4)),
        ("IPv6 to this host", to6(SERVER6)),
    ] {
        let (verdict, _) = run_frame(&shield, &syn);
        assert_eq!(verdict, (XDP_TX, Counter::TxSynCookie), "{what}");
    }
}

#[test]
fn the_cookie_encodes_the_mss_and_changes_with_the_connection() {
    // Same connection twice within the same minute or so: the kernel's cookie depends on the
    // addresses, ports, the client's sequence number and a coarse clock (RFC 4987 §3.6), so two
    // different client ports give different cookies.
    let Some((shield, _listener, port)) = cookie_shield(2, true) else {
        return;
    };
    let a = mss_syn4(port);
    let b = mss_syn4_from(CLIENT_PORT + 1, port);
    let (verdict_a, out_a) = run_frame(&shield, &a);
    let (verdict_b, out_b) = run_frame(&shield, &b);
    assert_eq!(verdict_a, (XDP_TX, Counter::TxSynCookie));
    assert_eq!(verdict_b, (XDP_TX, Counter::TxSynCookie));
    let cookie_a = check_syn_ack(&a, &out_a, 1460, true, "first");
    let cookie_b = check_syn_ack(&b, &out_b, 1460, true, "second");
    assert_ne!(cookie_a, cookie_b);
}
