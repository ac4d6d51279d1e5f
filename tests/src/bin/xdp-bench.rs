//! `cargo xtask bench xdp`: nanoseconds per packet of door's XDP program, measured by the kernel
//! with BPF_PROG_TEST_RUN and a large repeat count, against two references measured in the same
//! run: the empty program (the floor) and a minimal program that parses Ethernet/IPv4/TCP and
//! does one LRU-hash update keyed by the source prefix (the irreducible work of per-prefix
//! state). Needs root. Numbers are medians of several interleaved rounds (each round runs every
//! case once, in a rotated order), and beside them the fastest round's, the least disturbed by
//! the machine's other work; ratios are what to compare.
//!
//! Then the LRU table: two reference programs that differ only in their prefix map's kind of LRU
//! list, one for all CPUs (the kernel's default, door's) or one per CPU (`BPF_F_NO_COMMON_LRU`),
//! each inserting a new prefix every packet into a full map of door's capacity (so every
//! insertion evicts), timed on one CPU and on two at once, and how many of twice the capacity in
//! new prefixes from one CPU each map holds afterwards.
//!
//! With `--veth`, it also floods door's namespace over a veth pair (one /64, spoofed, from
//! `syn-flood`) three ways — XDP dropping over budget, an equivalent nftables rule (a per-/64
//! meter, `limit rate over … drop`), and nothing — and reports the SYN rate the sender achieved
//! (on a veth the receive path runs in the sender's context, so a cheaper drop means a faster
//! flood: the rate the door namespace absorbs) and a legitimate client's request latency meanwhile.
//! Then a spoofed flood, rotated over 50,000 /64s (every source new and under its budget), two
//! ways: XDP answering it with SYN cookies (`syn_cookies = "auto"`, skb mode, as in the netns
//! cookie suite) and the kernel's own syncookies (`tcp_syncookies = 1`, no XDP), with the same
//! two measures.
//!
//! The cookie path (a SYN in cookie mode answered in place with a SYN-ACK and `XDP_TX`) cannot be
//! timed with a repeat count: the program rewrites the packet, so a second run in the same call
//! would see the SYN-ACK. It is timed one run per call instead (repeat 1, the kernel's measured
//! time of that run, median of `--single` calls), next to the drop path and both references timed
//! the same way, in a network namespace of the benchmark's own with `net.ipv4.tcp_syncookies = 2`
//! and a listener, so `bpf_tcp_gen_syncookie` makes a real cookie. One-run times include the
//! kernel's clock reads around the run: compare them with each other, not with the repeat table.

use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use door_daemon::{
    config::{SynCookies, XdpConfig, XdpMode},
    shield::Shield,
};
use door_tests::{
    packets::{Flags, tcp4},
    reference,
};

/// BPF_PROG_TEST_RUN benchmark of door's XDP program.
#[derive(Debug, Parser)]
struct Args {
    /// Runs per measurement (the kernel reports the mean).
    #[arg(long, default_value_t = 1_000_000)]
    repeat: u32,
    /// Measurements per case, each over a fresh load of the programs; the median and the fastest
    /// are reported.
    #[arg(long, default_value_t = 41)]
    rounds: usize,
    /// Also run the veth flood comparisons (XDP, nftables, nothing; XDP cookies, kernel cookies).
    #[arg(long)]
    veth: bool,
    /// SYNs per veth flood.
    #[arg(long, default_value_t = 300_000)]
    flood: u64,
    /// One-run calls per case of the cookie-path table; the median is reported.
    #[arg(long, default_value_t = 20_001)]
    single: usize,
}

fn settings(syn_rate: f64, syn_burst: u32) -> XdpConfig {
    XdpConfig {
        interface: None,
        mode: XdpMode::Off,
        syn_rate,
        syn_burst,
        ports: vec![443],
        new_prefix_rate: 0.0,
        new_prefix_burst: 1,
        overflow_syn_rate: syn_rate,
        overflow_syn_burst: syn_burst,
        max_prefixes: door_common::PREFIX_MAP_CAPACITY,
        allow: Vec::new(),
        deny: Vec::new(),
        escalate_after: 0,
        escalate_window: Duration::from_secs(10),
        block_for: Duration::from_mins(1),
        syn_cookies: SynCookies::Off,
        cookie_threshold: 20_000.0,
    }
}

/// The repeat table's cases, in the order printed.
const CASES: [&str; 7] = [
    "reference: empty program (floor)",
    "reference: parse + one LRU update",
    "door: pass path (TCP ACK)",
    "door: SYN counted, within budget",
    "door: SYN dropped, over budget",
    "door: SYN counted, lists set",
    "door: SYN counted, cookies standing by",
];

/// The `cookies standing by` case's threshold, SYNs per second: cookie mode configured (door's
/// default, `syn_cookies = "auto"`) and never entered, so that every SYN pays for the cookie
/// rate's bookkeeping (the clock, the CPU's cookie state, its bucket) and is then counted.
const STANDBY_THRESHOLD: f64 = 1e12;

/// The lists of the `lists set` case: a trusted proxy and an allowed network (exempt), and a
/// denied network, none of them the benchmark's client, so that every SYN tests the lists
/// filter's bit (clear for this client: the trie is not walked) and is then counted as in `SYN
/// counted`.
const EXEMPT: [&str; 2] = ["192.0.2.10/32", "2001:db8:ffff::/48"];
/// See [`EXEMPT`].
const DENY: [&str; 1] = ["203.0.113.128/25"];

/// The programs of the repeat table. Loaded afresh for every round, so that the median spans
/// loads: with one load per process, the same build measured door's counted SYN at about 90 ns
/// in some processes and about 110 in others, steadily through each process's rounds.
struct Programs {
    floor: Shield,
    minimal: Shield,
    /// door's program with a SYN budget that never runs out (1e9 tokens/s, burst 2^32 - 1). It
    /// runs both the pass path and the counted SYN, in either order: an ACK touches no
    /// per-prefix state.
    counting: Shield,
    /// door's program with one token per 1000 s, burst 1, spent by a first SYN.
    dropping: Shield,
    /// `counting` with [`EXEMPT`] and [`DENY`] in its lists trie.
    listed: Shield,
    /// `counting` with cookie mode configured, its threshold out of reach
    /// ([`STANDBY_THRESHOLD`]).
    standby: Shield,
}

impl Programs {
    fn load(syn: &[u8]) -> anyhow::Result<Self> {
        let floor = Shield::load_object(reference::EMPTY).context("loading the empty reference")?;
        let minimal =
            Shield::load_object(reference::MINIMAL).context("loading the minimal reference")?;
        let mut counting = Shield::load().context("loading door's program")?;
        counting.configure(&settings(1e9, u32::MAX), &[], &[])?;
        let mut dropping = Shield::load().context("loading door's program")?;
        dropping.configure(&settings(0.001, 1), &[], &[])?;
        dropping.test_run(syn, 1)?;
        let nets = |list: &[&str]| -> anyhow::Result<Vec<ipnet::IpNet>> {
            list.iter()
                .map(|n| n.parse().with_context(|| format!("network {n}")))
                .collect()
        };
        let mut listed = Shield::load().context("loading door's program")?;
        listed.configure(&settings(1e9, u32::MAX), &nets(&EXEMPT)?, &nets(&DENY)?)?;
        let mut standby = Shield::load().context("loading door's program")?;
        let mut cookies = settings(1e9, u32::MAX);
        cookies.syn_cookies = SynCookies::Auto;
        cookies.cookie_threshold = STANDBY_THRESHOLD;
        standby.configure(&cookies, &[], &[])?;
        Ok(Self {
            floor,
            minimal,
            counting,
            dropping,
            listed,
            standby,
        })
    }
}

/// One case's times over the rounds, ns per packet.
#[derive(Clone, Copy)]
struct Times {
    /// The median round's.
    median: f64,
    /// The least-disturbed round's: the fastest. On a shared machine a round is only ever
    /// slowed by what else runs, never sped up, so the fastest round is the nearest to the
    /// program's own cost, and far steadier from one run to the next than the median
    /// (docs/performance.md, "The least-disturbed round").
    least: f64,
}

/// The times over `args.rounds` rounds of each of [`CASES`]. Rounds are interleaved: each loads
/// the programs afresh ([`Programs`]) and runs every case once, starting one case later than the
/// round before, so a noisy stretch of the machine falls on every case alike.
fn interleaved_times(args: &Args, syn: &[u8], ack: &[u8]) -> anyhow::Result<Vec<Times>> {
    let n = CASES.len();
    let mut samples = vec![Vec::with_capacity(args.rounds); n];
    for round in 0..args.rounds {
        let p = Programs::load(syn)?;
        let runs = [
            (&p.floor, syn),
            (&p.minimal, syn),
            (&p.counting, ack),
            (&p.counting, syn),
            (&p.dropping, syn),
            (&p.listed, syn),
            (&p.standby, syn),
        ];
        let mut order: Vec<_> = CASES.iter().zip(runs).zip(&mut samples).collect();
        order.rotate_left(round % n);
        for ((name, (shield, packet)), out) in order {
            let (_, mean) = shield.test_run(packet, args.repeat).context(*name)?;
            out.push(mean.as_secs_f64() * 1e9);
        }
        eprintln!("  round {}/{} measured", round + 1, args.rounds);
    }
    samples
        .into_iter()
        .map(|mut s| {
            s.sort_by(f64::total_cmp);
            Ok(Times {
                median: s.get(s.len() / 2).copied().context("no rounds")?,
                least: s.first().copied().context("no rounds")?,
            })
        })
        .collect()
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = [198, 51, 100, 7];
    let server = [203, 0, 113, 1];
    let syn = tcp4(client, server, 443, Flags::SYN);
    let ack = tcp4(client, server, 443, Flags::ACK);

    eprintln!(
        "xdp bench: BPF_PROG_TEST_RUN, {} runs x {} interleaved rounds per case, the programs \
         loaded afresh each round (the median and the fastest of the kernel's means)",
        args.repeat, args.rounds
    );
    let times = interleaved_times(&args, &syn, &ack)?;
    let results: Vec<(&str, Times)> = CASES.into_iter().zip(times).collect();
    let floor = results.first().map_or(
        Times {
            median: 1.0,
            least: 1.0,
        },
        |r| r.1,
    );
    let minimal = results.get(1).map_or(floor, |r| r.1);
    println!(
        "{:<38} {:>9} {:>11} {:>13}   {:>9} {:>11} {:>13}",
        "case", "ns/pkt", "x floor", "x minimal", "least ns", "x floor", "x minimal"
    );
    for (name, t) in &results {
        println!(
            "{name:<38} {:>9.1} {:>11.2} {:>13.2}   {:>9.1} {:>11.2} {:>13.2}",
            t.median,
            t.median / floor.median.max(0.1),
            t.median / minimal.median.max(0.1),
            t.least,
            t.least / floor.least.max(0.1),
            t.least / minimal.least.max(0.1),
        );
    }
    println!(
        "(the median round's time, then the least-disturbed round's: the fastest of {} rounds)",
        args.rounds
    );
    let single = args.single;
    let one_run = std::thread::spawn(move || cookie::one_run_table(single))
        .join()
        .map_err(|_| anyhow::anyhow!("the cookie-path measurement panicked"))??;
    println!();
    println!(
        "{:<38} {:>9} {:>11} {:>13}",
        "one run per call (median)", "ns/pkt", "x floor", "x minimal"
    );
    let floor_ns = one_run.first().map_or(1.0, |r| r.1).max(0.1);
    let minimal_ns = one_run.get(1).map_or(1.0, |r| r.1).max(0.1);
    for (name, ns) in &one_run {
        println!(
            "{name:<38} {ns:>9.1} {:>11.2} {:>13.2}",
            ns / floor_ns,
            ns / minimal_ns
        );
    }
    lru::compare(args.repeat, args.rounds, &syn)?;
    if args.veth {
        veth::compare(args.flood)?;
    }
    Ok(())
}

mod lru {
    //! The LRU table: door's prefix map under address rotation with one LRU list for all CPUs
    //! (the kernel's default, door's choice) against one list per CPU (`BPF_F_NO_COMMON_LRU`),
    //! with the churn references, which insert a new prefix every packet.

    use anyhow::Context as _;
    use door_daemon::shield::Shield;
    use door_tests::{allowed_cpus, pin_to_cpu, reference};

    /// The two kinds of LRU list, as printed, with their reference programs.
    const KINDS: [(&str, &[u8]); 2] = [
        (
            "one LRU list for all CPUs (door's)",
            reference::CHURN_COMMON,
        ),
        (
            "one LRU list per CPU (NO_COMMON_LRU)",
            reference::CHURN_PERCPU,
        ),
    ];

    /// door's prefix map's capacity, as a packet count.
    const CAPACITY: u32 = door_common::PREFIX_MAP_CAPACITY;

    /// Mean ns per packet of `repeat` runs of `shield` on each CPU of `cpus` at once (one thread
    /// pinned to each, started together), averaged over the CPUs.
    fn at_once(shield: &Shield, packet: &[u8], repeat: u32, cpus: &[usize]) -> anyhow::Result<f64> {
        let barrier = std::sync::Barrier::new(cpus.len());
        let means = std::thread::scope(|scope| {
            let runs: Vec<_> = cpus
                .iter()
                .map(|&cpu| {
                    let barrier = &barrier;
                    scope.spawn(move || -> anyhow::Result<f64> {
                        pin_to_cpu(cpu)
                            .with_context(|| format!("pinning a thread to CPU {cpu}"))?;
                        barrier.wait();
                        let (_, mean) = shield.test_run(packet, repeat)?;
                        Ok(mean.as_secs_f64() * 1e9)
                    })
                })
                .collect();
            runs.into_iter()
                .map(|run| {
                    run.join()
                        .map_err(|_| anyhow::anyhow!("a measuring thread panicked"))?
                })
                .collect::<anyhow::Result<Vec<f64>>>()
        })?;
        #[expect(clippy::cast_precision_loss, reason = "a CPU count")]
        let n = means.len().max(1) as f64;
        Ok(means.iter().sum::<f64>() / n)
    }

    /// Prints, per kind: the median over `rounds` of the ns per packet of `repeat` new prefixes on
    /// one CPU and on two at once, the map filled beforehand from both (every insertion evicts),
    /// and how many of twice the map's capacity in new prefixes from one CPU the map holds
    /// afterwards.
    pub(crate) fn compare(repeat: u32, rounds: usize, packet: &[u8]) -> anyhow::Result<()> {
        let cpus = allowed_cpus().context("reading this process's CPUs")?;
        let one = cpus.first().copied().context("no CPU to run on")?;
        let two = cpus.get(..2);
        let mut samples = vec![(Vec::new(), Vec::new()); KINDS.len()];
        for round in 0..rounds {
            let mut order: Vec<_> = KINDS.iter().zip(&mut samples).collect();
            order.rotate_left(round % KINDS.len());
            for ((name, object), (alone, both)) in order {
                let shield =
                    Shield::load_object(object).with_context(|| format!("loading {name}"))?;
                // Filled from every CPU measured, so that each one's insertions evict from the
                // start, whichever kind of list (per-CPU lists each hold their CPU's share).
                at_once(&shield, packet, CAPACITY, two.unwrap_or(&[one]))?;
                alone.push(at_once(&shield, packet, repeat, &[one])?);
                if let Some(two) = two {
                    both.push(at_once(&shield, packet, repeat, two)?);
                }
            }
            eprintln!("  LRU round {}/{rounds} measured", round + 1);
        }
        println!();
        println!(
            "{:<38} {:>9} {:>13} {:>26}",
            "LRU map, a new prefix every packet",
            "1 CPU",
            "2 CPUs at once",
            format!("held of {} from 1 CPU", 2 * CAPACITY)
        );
        for ((name, object), (alone, both)) in KINDS.iter().zip(samples) {
            let shield = Shield::load_object(object)?;
            at_once(&shield, packet, 2 * CAPACITY, &[one])?;
            let held = shield.tracked_prefixes()?;
            let both = median(both).map_or_else(|| "n/a".to_owned(), |ns| format!("{ns:.1}"));
            println!(
                "{name:<38} {:>9.1} {both:>13} {held:>26}",
                median(alone).unwrap_or(f64::NAN),
            );
        }
        println!(
            "(ns per packet, median of {rounds} rounds of {repeat} runs, the map of {CAPACITY} \
             entries full beforehand: every insertion evicts)"
        );
        Ok(())
    }

    fn median(mut samples: Vec<f64>) -> Option<f64> {
        samples.sort_by(f64::total_cmp);
        samples.get(samples.len() / 2).copied()
    }
}

mod cookie {
    //! The one-run table, cookie path included (see the crate docs).

    use anyhow::{Context as _, bail};
    use door_daemon::{config::SynCookies, shield::Shield};
    use door_tests::{
        netns,
        packets::{Flags, syn4_with_options, tcp4},
        pin_to_one_cpu, reference,
    };

    const XDP_DROP: u32 = 1;
    const XDP_TX: u32 = 3;

    /// Median of `runs` one-run calls, ns; each must return `action` when given.
    fn median(
        shield: &Shield,
        packet: &[u8],
        runs: usize,
        action: Option<u32>,
    ) -> anyhow::Result<f64> {
        let mut samples = Vec::with_capacity(runs);
        for _ in 0..runs {
            let (got, mean) = shield.test_run(packet, 1)?;
            if action.is_some_and(|a| a != got) {
                bail!("the program answered {got}, not {action:?}");
            }
            samples.push(mean.as_secs_f64() * 1e9);
        }
        samples.sort_by(f64::total_cmp);
        samples.get(samples.len() / 2).copied().context("no runs")
    }

    /// Moves this thread (only it) into a network namespace of its own, with
    /// `net.ipv4.tcp_syncookies = 2`, and pins it to its CPU (cookie mode is per CPU).
    fn own_netns() -> anyhow::Result<()> {
        netns::enter_new_netns(2).context("a network namespace for the benchmark")?;
        pin_to_one_cpu().context("pinning the benchmark's thread to its CPU")
    }

    /// Floor, minimal reference, drop path and cookie path, one run per call.
    pub(crate) fn one_run_table(runs: usize) -> anyhow::Result<Vec<(&'static str, f64)>> {
        own_netns()?;
        let listener = std::net::TcpListener::bind("[::]:0")?;
        let port = listener.local_addr()?.port();
        let (client, server) = ([198, 51, 100, 7], [203, 0, 113, 1]);
        let syn = tcp4(client, server, 443, Flags::SYN);
        // A Linux-style SYN (MSS, SACK permitted, timestamps, NOP, window scale) to the listener.
        let options = [
            2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7,
        ];
        let cookie_syn = syn4_with_options(client, server, 40_000, port, 1, &options);
        let floor = Shield::load_object(reference::EMPTY)?;
        let minimal = Shield::load_object(reference::MINIMAL)?;
        let mut dropping = Shield::load()?;
        dropping.configure(&super::settings(0.001, 1), &[], &[])?;
        dropping.test_run(&syn, 1)?;
        let mut cookies = Shield::load()?;
        let mut cfg = super::settings(1e9, u32::MAX);
        cfg.ports = vec![port];
        cfg.syn_cookies = SynCookies::Auto;
        // This CPU's share: one token per 1000 s; the first SYN fits, every later one is over.
        #[expect(clippy::cast_precision_loss, reason = "a CPU count")]
        let cpus = aya::util::nr_cpus().map_or(1, |n| n.max(1)) as f64;
        cfg.cookie_threshold = 0.001 * cpus;
        cookies.configure(&cfg, &[], &[])?;
        cookies.test_run(&cookie_syn, 1)?;
        let out = vec![
            (
                "reference: empty program (floor)",
                median(&floor, &syn, runs, None)?,
            ),
            (
                "reference: parse + one LRU update",
                median(&minimal, &syn, runs, None)?,
            ),
            (
                "door: SYN dropped, over budget",
                median(&dropping, &syn, runs, Some(XDP_DROP))?,
            ),
            (
                "door: SYN answered with a cookie",
                median(&cookies, &cookie_syn, runs, Some(XDP_TX))?,
            ),
        ];
        drop(listener);
        Ok(out)
    }
}

mod veth {
    //! The veth flood comparison (see the crate docs).

    use anyhow::{Context as _, bail};
    use door_tests::netns::{CLIENT_ADDR, CLIENT_ADDR6, DOOR_ADDR, SynFlood, TempDir, Topology};

    /// nftables equivalent of door's SYN budget (100/s, burst 200 per /64) on the protected port.
    const NFT_RULES: &str = "table inet doorbench {
  chain input {
    type filter hook input priority 0; policy accept;
    tcp dport 8443 tcp flags & (syn | ack) == syn meter synflood { ip6 saddr and ffff:ffff:ffff:ffff:: limit rate over 100/second burst 200 packets } drop
  }
}
";

    /// The spoofed flood's sources: `SPOOFED_PREFIXES` /64s of this /48 of documentation space.
    const SPOOFED_SOURCE: &str = "2001:db8:bad::";
    const SPOOFED_ROUTE: &str = "2001:db8:bad::/48";
    const SPOOFED_PREFIXES: u64 = 50_000;

    /// `[xdp]` keys of each run beyond the shared ones: cookie mode for `cookies`.
    fn xdp_extra(mode: &str) -> &'static str {
        if mode == "cookies" {
            "syn_rate = 1000.0\nsyn_burst = 1000\nnew_prefix_rate = 0\nsyn_cookies = \"auto\"\ncookie_threshold = 500.0\n"
        } else {
            "syn_rate = 100.0\nsyn_burst = 200\n"
        }
    }

    fn config(topo: &Topology, xdp_mode: &str, extra: &str) -> String {
        format!(
            r#"
listen = ["{DOOR_ADDR}:8443", "[2001:db8:d00::1]:8443"]
upstream = "http://127.0.0.1:3000"
admin_listen = "127.0.0.1:9901"
[[route]]
group = "link"
path = "/l/session/{{id}}"
[group.link]
rate = 1000.0
burst = 1000
[xdp]
interface = "{}"
mode = "{xdp_mode}"
ports = [8443]
{extra}"#,
            topo.door_if
        )
    }

    struct Outcome {
        mode: &'static str,
        syn_per_s: f64,
        p50_ms: f64,
        max_ms: f64,
        served: usize,
        failed: usize,
    }

    fn run(mode: &'static str, flood: u64) -> anyhow::Result<Outcome> {
        let spoofed = matches!(mode, "cookies" | "kernel");
        let prefixes = if spoofed { SPOOFED_PREFIXES } else { 1 };
        eprintln!("  veth flood: {mode} ({flood} SYNs from {prefixes} /64s)");
        let dir = TempDir::new("bench")?;
        let mut topo = Topology::new()?;
        let xdp_mode = match mode {
            "xdp" => "driver",
            // In driver mode a veth sends XDP_TX frames only to a peer with NAPI.
            "cookies" => "skb",
            _ => "off",
        };
        if spoofed {
            // The kernel queues (and answers) SYNs only from sources it has a route back to.
            let out = Topology::run(
                &topo.door_ns,
                "ip",
                &[
                    "-6",
                    "route",
                    "add",
                    SPOOFED_ROUTE,
                    "via",
                    CLIENT_ADDR6,
                    "dev",
                    &topo.door_if,
                ],
            )?;
            if !out.status.success() {
                bail!("ip route: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
        topo.start_door(&dir.0, &config(&topo, xdp_mode, xdp_extra(mode)))?;
        if mode == "nftables" {
            let rules = dir.0.join("rules.nft");
            std::fs::write(&rules, NFT_RULES)?;
            let out = Topology::run(
                &topo.door_ns,
                "nft",
                &["-f", rules.to_str().context("path")?],
            )?;
            if !out.status.success() {
                bail!("nft: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
        let flooder = topo.spawn_flood(SynFlood {
            src_prefix: SPOOFED_SOURCE,
            prefixes,
            count: flood,
            max_seconds: 20,
        })?;
        let url = format!("http://{DOOR_ADDR}:8443/l/session/bench");
        let mut latencies = Vec::new();
        let mut failed = 0;
        while !flooder.is_finished() && latencies.len() + failed < 200 {
            let args = [
                "-s",
                "-o",
                "/dev/null",
                "--max-time",
                "5",
                "--interface",
                CLIENT_ADDR,
                "-w",
                "%{http_code} %{time_total}",
                &url,
            ];
            let out = Topology::run(&topo.client_ns, "curl", &args)?;
            let text = String::from_utf8_lossy(&out.stdout);
            match text.split_once(' ') {
                Some(("200", t)) => latencies.push(t.trim().parse::<f64>().unwrap_or(0.0) * 1e3),
                _ => failed += 1,
            }
        }
        let (sent, elapsed) = flooder
            .join()
            .map_err(|_| anyhow::anyhow!("flood thread panicked"))??;
        latencies.sort_by(f64::total_cmp);
        let pick = |q: f64| {
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                clippy::cast_precision_loss,
                reason = "an index into a small vector"
            )]
            let i = ((latencies.len().saturating_sub(1)) as f64 * q).round() as usize;
            latencies.get(i).copied().unwrap_or(f64::NAN)
        };
        #[expect(clippy::cast_precision_loss, reason = "a rate for display")]
        let syn_per_s = sent as f64 / elapsed;
        Ok(Outcome {
            mode,
            syn_per_s,
            p50_ms: pick(0.5),
            max_ms: pick(1.0),
            served: latencies.len(),
            failed,
        })
    }

    /// Runs the floods and prints the comparisons: from one /64 (XDP's budget, nftables,
    /// nothing), then spoofed (XDP's cookies, the kernel's).
    pub(crate) fn compare(flood: u64) -> anyhow::Result<()> {
        table("veth", "x xdp", &["xdp", "nftables", "none"], flood)?;
        table("spoofed", "x cookies", &["cookies", "kernel"], flood)
    }

    /// Runs `modes` in order and prints their table, rates relative to the first.
    fn table(
        title: &str,
        relative: &str,
        modes: &[&'static str],
        flood: u64,
    ) -> anyhow::Result<()> {
        let results = modes
            .iter()
            .map(|m| run(m, flood))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let xdp_rate = results.first().map_or(1.0, |r| r.syn_per_s);
        println!();
        println!(
            "{:<10} {:>12} {:>9} {:>14} {:>10} {:>8} {:>8}",
            title, "SYN/s", relative, "legit p50 ms", "max ms", "served", "failed"
        );
        for r in &results {
            println!(
                "{:<10} {:>12.0} {:>9.2} {:>14.2} {:>10.2} {:>8} {:>8}",
                r.mode,
                r.syn_per_s,
                r.syn_per_s / xdp_rate,
                r.p50_ms,
                r.max_ms,
                r.served,
                r.failed
            );
        }
        Ok(())
    }
}
