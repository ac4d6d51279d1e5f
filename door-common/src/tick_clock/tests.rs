//! The kept reading against a model of the kernel's tick: `jiffies` advances first, the coarse
//! clock at the timekeeper's update a few microseconds later (the gap), and between ticks the
//! clock can be nudged (an NTP adjustment, a clock step forward).

use proptest::prelude::*;

use super::*;

/// One CPU's view of the kernel, and the reading it keeps.
#[derive(Debug)]
struct Cpu {
    /// Nanoseconds per tick.
    tick_ns: u64,
    jiffies: u64,
    /// `CLOCK_MONOTONIC_COARSE`, what `bpf_ktime_get_coarse_ns` returns now.
    clock: u64,
    /// Ticks `jiffies` has taken since the timekeeper's last update: non-zero inside the gap.
    pending: u64,
    /// Ticks a short update left to the next one.
    carry: u64,
    /// The clock when `jiffies` last advanced: a value served is never older.
    floor: u64,
    kept: TickClock,
    /// The last value served.
    served: u64,
    /// Readings that asked the kernel.
    asked: u32,
}

impl Cpu {
    fn new(tick_ns: u64) -> Self {
        Self {
            tick_ns,
            jiffies: 4_294_892_296,
            clock: 1_000_000_000,
            pending: 0,
            carry: 0,
            floor: 1_000_000_000,
            kept: TickClock::default(),
            served: 0,
            asked: 0,
        }
    }

    /// A CPU that read at two consecutive ticks: its reading is settled.
    fn settled(tick_ns: u64) -> Self {
        let mut cpu = Self::new(tick_ns);
        for _ in 0..2 {
            cpu.tick(1);
            cpu.read();
        }
        assert_eq!(cpu.kept.at(cpu.jiffies), Some(cpu.clock));
        cpu
    }

    /// A timer tick advances `jiffies` by `n` (more than 1 after idle ticks); the gap opens.
    fn jiffies_advance(&mut self, n: u64) {
        self.jiffies += n;
        self.pending += n;
        self.floor = self.clock;
    }

    /// The timekeeper's update, once per advance of `jiffies`: the clock takes the pending
    /// ticks and those a short update left, less `short` of them, which the next update takes
    /// (its accumulation grid just missed); the gap closes.
    fn clock_update(&mut self, short: u64) {
        if self.pending == 0 {
            return;
        }
        let owed = self.pending + self.carry;
        let short = short.min(owed);
        self.clock += (owed - short) * self.tick_ns;
        self.carry = short;
        self.pending = 0;
    }

    /// The whole tick: both steps, with no reading in between.
    fn tick(&mut self, n: u64) {
        self.jiffies_advance(n);
        self.clock_update(0);
    }

    /// A reading: the program's `now_ns`. `across` ticks happen between its `jiffies` load and
    /// its helper call (only when it asks the kernel).
    fn read_across(&mut self, across: u64) -> u64 {
        let tick = self.jiffies;
        let value = if let Some(ns) = self.kept.at(tick) {
            ns
        } else {
            if across > 0 {
                self.tick(across);
            }
            self.asked += 1;
            let now = self.clock;
            if let Some(next) = self.kept.after(tick, now) {
                self.kept = next;
            }
            now
        };
        assert!(
            value <= self.clock,
            "{value} is ahead of the kernel's {}: {self:?}",
            self.clock
        );
        assert!(
            value >= self.floor,
            "{value} is more than one update behind: {self:?}"
        );
        assert!(
            value >= self.served,
            "{value} went back from {}: {self:?}",
            self.served
        );
        self.served = value;
        value
    }

    fn read(&mut self) -> u64 {
        self.read_across(0)
    }
}

const TICK_NS: u64 = 4_000_000;

#[test]
fn a_cpu_that_never_reads_in_the_gap_asks_once_a_tick_from_its_second_tick() {
    let mut cpu = Cpu::new(TICK_NS);
    cpu.tick(1);
    for _ in 0..10 {
        assert_eq!(cpu.read(), cpu.clock);
    }
    // The first tick after no reading: nothing to compare with, so every reading asks.
    assert_eq!(cpu.asked, 10);
    for _ in 0..5 {
        cpu.tick(1);
        let asked = cpu.asked;
        for _ in 0..10 {
            assert_eq!(cpu.read(), cpu.clock);
        }
        assert_eq!(cpu.asked, asked + 1, "one question a tick");
    }
}

#[test]
fn a_reading_in_the_gap_is_not_kept_for_the_new_tick() {
    let mut cpu = Cpu::settled(TICK_NS);
    let before = cpu.clock;
    cpu.jiffies_advance(1);
    // Inside the gap the kernel still says the previous tick's time, and so does the program,
    // asking each time.
    let asked = cpu.asked;
    for _ in 0..3 {
        assert_eq!(cpu.read(), before);
    }
    assert_eq!(cpu.asked, asked + 3);
    cpu.clock_update(0);
    assert_eq!(cpu.read(), before + TICK_NS);
    let asked = cpu.asked;
    assert_eq!(cpu.read(), before + TICK_NS);
    assert_eq!(cpu.asked, asked, "settled after the update");
}

/// A CPU idle for ticks, whose first reading falls in the gap, must not keep the previous tick's
/// time for the rest of the new tick.
#[test]
fn an_idle_cpu_waking_in_the_gap_does_not_keep_the_old_time() {
    for idle in [2, 5, 250] {
        let mut cpu = Cpu::settled(TICK_NS);
        // Idle: other CPUs' ticks, then one advancing `jiffies` by several at once (NO_HZ).
        cpu.tick(idle - 1);
        cpu.jiffies_advance(1);
        let stale = cpu.clock;
        assert_eq!(cpu.read(), stale, "in the gap the kernel's own value");
        cpu.clock_update(0);
        assert_eq!(
            cpu.read(),
            stale + TICK_NS,
            "idle {idle}: the update is seen"
        );
        assert_eq!(cpu.read(), cpu.clock, "idle {idle}");
    }
}

/// On kernels where an NTP frequency change moves the coarse clock between ticks, the gap's
/// reading differs from the kept one by nanoseconds: still not the new tick's value.
#[test]
fn a_nudge_between_ticks_is_not_taken_for_a_tick() {
    let mut cpu = Cpu::settled(TICK_NS);
    cpu.clock += 1_500;
    cpu.jiffies_advance(1);
    let gap = cpu.read();
    assert_eq!(gap, cpu.clock);
    cpu.clock_update(0);
    assert_eq!(cpu.read(), gap + TICK_NS);
    let asked = cpu.asked;
    assert_eq!(cpu.read(), gap + TICK_NS);
    assert_eq!(cpu.asked, asked);
}

/// A tick whose update takes no time (the accumulation grid just missed it) is asked about on
/// every reading; the next update, two ticks' worth, is two ticks from the kept reading, so that
/// tick is asked about too, and the one after it settles at its first reading.
#[test]
fn a_tick_the_clock_skips_is_asked_about_until_the_next_settles() {
    let mut cpu = Cpu::settled(TICK_NS);
    let before = cpu.clock;
    cpu.jiffies_advance(1);
    cpu.clock_update(1);
    let asked = cpu.asked;
    assert_eq!(cpu.read(), before);
    assert_eq!(cpu.read(), before);
    assert_eq!(cpu.asked, asked + 2);
    cpu.tick(1);
    assert_eq!(cpu.read(), before + 2 * TICK_NS);
    assert_eq!(cpu.read(), before + 2 * TICK_NS);
    assert_eq!(cpu.asked, asked + 4);
    cpu.tick(1);
    assert_eq!(cpu.read(), before + 3 * TICK_NS);
    assert_eq!(cpu.read(), before + 3 * TICK_NS);
    assert_eq!(cpu.asked, asked + 5, "settled at the tick's first reading");
}

#[derive(Clone, Debug)]
enum Event {
    /// A whole tick (`jiffies` by `n`, then the clock).
    Tick(u64),
    /// `jiffies` by `n`: the gap opens.
    Jiffies(u64),
    /// The timekeeper's update, `short` ticks short.
    Update(u64),
    /// The clock moved between ticks by this many nanoseconds (NTP, a step forward).
    Nudge(u64),
    /// A reading with this many ticks between its `jiffies` load and its helper call.
    Read(u64),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        3 => (1u64..4).prop_map(Event::Tick),
        1 => prop_oneof![1u64..4, Just(250)].prop_map(Event::Tick),
        2 => (1u64..3).prop_map(Event::Jiffies),
        2 => (0u64..2).prop_map(Event::Update),
        1 => (1u64..3_000_000).prop_map(Event::Nudge),
        8 => Just(Event::Read(0)),
        1 => (1u64..3).prop_map(Event::Read),
    ]
}

fn apply(cpu: &mut Cpu, e: &Event) {
    match *e {
        Event::Tick(n) => cpu.tick(n),
        Event::Jiffies(n) => cpu.jiffies_advance(n),
        Event::Update(short) => cpu.clock_update(short),
        Event::Nudge(ns) => cpu.clock += ns,
        Event::Read(across) => {
            cpu.read_across(across);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever the order of ticks, gaps, nudges and readings: never ahead of the kernel, never
    /// back, never more than one update behind (asserted in `Cpu::read_across`).
    #[test]
    fn a_served_time_is_within_one_update_of_the_kernels(
        tick_ns in prop_oneof![Just(1_000_000u64), Just(4_000_000), Just(10_000_000)],
        events in proptest::collection::vec(event(), 1..200),
    ) {
        let mut cpu = Cpu::new(tick_ns);
        for e in &events {
            apply(&mut cpu, e);
        }
    }

    /// With no nudge, and no two consecutive ticks both read inside their gaps, every served
    /// time is exactly the kernel's: one reading in a gap, after any idle time, misleads nothing.
    #[test]
    fn without_gap_readings_at_consecutive_ticks_a_served_time_is_the_kernels(
        tick_ns in prop_oneof![Just(1_000_000u64), Just(4_000_000), Just(10_000_000)],
        events in proptest::collection::vec(event(), 1..200),
    ) {
        let mut cpu = Cpu::new(tick_ns);
        let mut gap_read_at: Option<u64> = None;
        for e in &events {
            match e {
                Event::Nudge(_) => {}
                Event::Read(0) if cpu.pending > 0 => {
                    let tick = cpu.jiffies;
                    if gap_read_at.is_some_and(|t| t + 1 == tick) {
                        // Two consecutive ticks read in their gaps: the documented exception.
                        break;
                    }
                    gap_read_at = Some(tick);
                    let value = cpu.read();
                    prop_assert_eq!(value, cpu.clock);
                }
                Event::Read(across) => {
                    let value = cpu.read_across(*across);
                    prop_assert_eq!(value, cpu.clock);
                }
                _ => apply(&mut cpu, e),
            }
        }
    }

    /// With no reading inside a gap and no nudge, every served time is exactly the kernel's.
    #[test]
    fn without_gap_readings_or_nudges_a_served_time_is_the_kernels(
        tick_ns in prop_oneof![Just(1_000_000u64), Just(4_000_000), Just(10_000_000)],
        events in proptest::collection::vec(event(), 1..200),
    ) {
        let mut cpu = Cpu::new(tick_ns);
        for e in &events {
            match e {
                Event::Nudge(_) => {}
                Event::Read(_) if cpu.pending > 0 => {}
                Event::Read(across) => {
                    let value = cpu.read_across(*across);
                    prop_assert_eq!(value, cpu.clock);
                }
                _ => apply(&mut cpu, e),
            }
        }
    }
}
