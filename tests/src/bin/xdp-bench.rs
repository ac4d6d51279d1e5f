//! `cargo xtask bench xdp`: nanoseconds per packet of door's XDP program, measured by the kernel
//! with BPF_PROG_TEST_RUN and a large repeat count, against two references measured in the same
//! run: the empty program (the floor) and a minimal program that parses Ethernet/IPv4/TCP and
//! does one LRU-hash update keyed by the source prefix (the irreducible work of per-prefix
//! state). Needs root. Numbers are medians of several rounds; ratios are what to compare.

use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use door_daemon::{
    config::{XdpConfig, XdpMode},
    xdp::{REFERENCE_EMPTY, REFERENCE_MINIMAL, Shield},
};
use door_tests::packets::{Flags, tcp4};

/// BPF_PROG_TEST_RUN benchmark of door's XDP program.
#[derive(Debug, Parser)]
struct Args {
    /// Runs per measurement (the kernel reports the mean).
    #[arg(long, default_value_t = 1_000_000)]
    repeat: u32,
    /// Measurements per case; the median is reported.
    #[arg(long, default_value_t = 7)]
    rounds: usize,
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
        allow: Vec::new(),
        escalate_after: 0,
        escalate_window: Duration::from_secs(10),
        block_for: Duration::from_mins(1),
    }
}

fn median_ns(shield: &Shield, packet: &[u8], args: &Args) -> anyhow::Result<f64> {
    let mut samples = Vec::with_capacity(args.rounds);
    for _ in 0..args.rounds {
        let (_, mean) = shield.test_run(packet, args.repeat)?;
        samples.push(mean.as_secs_f64() * 1e9);
    }
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().context("no rounds")
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = [198, 51, 100, 7];
    let server = [203, 0, 113, 1];
    let syn = tcp4(client, server, 443, Flags::SYN);
    let ack = tcp4(client, server, 443, Flags::ACK);

    eprintln!(
        "xdp bench: BPF_PROG_TEST_RUN, {} runs x {} rounds per case (median of the kernel's mean)",
        args.repeat, args.rounds
    );
    let floor = Shield::load_object(REFERENCE_EMPTY).context("loading the empty reference")?;
    let minimal =
        Shield::load_object(REFERENCE_MINIMAL).context("loading the minimal reference")?;
    // SYN-counted path: a budget that never runs out (1e9 tokens/s, burst 2^32 - 1).
    let mut counting = Shield::load().context("loading door's program")?;
    counting.configure(&settings(1e9, u32::MAX), &[])?;
    // Drop path: one token per 1000 s, burst 1, spent by a first SYN.
    let mut dropping = Shield::load()?;
    dropping.configure(&settings(0.001, 1), &[])?;
    dropping.test_run(&syn, 1)?;

    let cases = [
        ("reference: empty program (floor)", &floor, &syn),
        ("reference: parse + one LRU update", &minimal, &syn),
        ("door: pass path (TCP ACK)", &counting, &ack),
        ("door: SYN counted, within budget", &counting, &syn),
        ("door: SYN dropped, over budget", &dropping, &syn),
    ];
    let mut results = Vec::new();
    for (name, shield, packet) in cases {
        let ns = median_ns(shield, packet, &args).with_context(|| name.to_owned())?;
        eprintln!("  measured {name}");
        results.push((name, ns));
    }
    let floor_ns = results.first().map_or(1.0, |r| r.1).max(0.1);
    let minimal_ns = results.get(1).map_or(1.0, |r| r.1).max(0.1);
    println!(
        "{:<38} {:>9} {:>11} {:>13}",
        "case", "ns/pkt", "x floor", "x minimal"
    );
    for (name, ns) in &results {
        println!(
            "{name:<38} {ns:>9.1} {:>11.2} {:>13.2}",
            ns / floor_ns,
            ns / minimal_ns
        );
    }
    Ok(())
}
