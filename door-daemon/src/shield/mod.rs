//! The daemon's side of the flood shield (docs/design.md, "Flood shield"): loads the XDP
//! program that `build.rs` embedded, attaches it in the configured mode, reads its per-CPU
//! counters and its per-prefix SYN map, and detaches it on drop (fail-open).

pub mod blocklist;
mod deadlines;
pub mod escalate;
mod lists;
pub mod metrics;

pub use blocklist::BlocklistWriter;
pub use metrics::{ShieldInstruments, XdpReadings, observe, observe_readings};

use std::{
    fmt,
    os::fd::{AsRawFd, RawFd},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use aya::{
    Ebpf, EbpfError,
    maps::{
        Array, HashMap, MapError, PerCpuArray,
        lpm_trie::{Key, LpmTrie},
    },
    programs::{ProgramError, TestRun, TestRunOptions, Xdp, XdpMode as AyaXdpMode, xdp::XdpLinkId},
};
use aya_log::EbpfLogger;
use door_common::{
    COUNTER_COUNT, CookieState, Counter, EXEMPT_CAPACITY, ExemptKey, GuardState, MAP_BLOCKED,
    MAP_CONFIG, MAP_COOKIE, MAP_COUNTERS, MAP_EXEMPT, MAP_GUARD, MAP_LIST_FILTER, MAP_PREFIXES,
    PROGRAM_NAME, PrefixKey, PrefixState, ShieldConfig, gcra,
    list_filter::LIST_FILTER_WORDS,
    shield::{
        CONFIG_ALL_PORTS, CONFIG_COOKIES, CONFIG_HAS_BLOCKLIST, CONFIG_HAS_EXEMPT,
        CONFIG_LIST_FILTER, cookie_quiet,
    },
};
use ipnet::IpNet;
use thiserror::Error;

use self::lists::ListFilter;
use crate::{
    config::{SynCookies, XdpConfig, XdpMode},
    obs::logging::RateLimitedWarn,
};

/// How long cookie mode lasts once the SYN rate is back under 80% of the threshold.
const COOKIE_HOLD: Duration = Duration::from_secs(1);

/// How a block's deadline meets the one its prefix may have already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deadline {
    /// The new deadline replaces the old one, earlier or later.
    Replace,
    /// The later of the two stays.
    KeepLater,
}

/// The cookie-mode state of every CPU, summed (see [`Shield::cookies`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CookieSummary {
    /// CPUs in cookie mode now.
    pub active_cpus: u32,
    /// Times any CPU entered cookie mode.
    pub entered: u64,
    /// Times any CPU left cookie mode.
    pub left: u64,
}

/// `net.ipv4.tcp_syncookies` of door's network namespace, and what it means for cookie mode
/// (docs/decisions.md, "SYN cookies"): the XDP program answers a SYN only when both door's
/// threshold and the kernel agree; otherwise the SYN passes to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelCookies {
    /// 0: the kernel neither sends nor validates SYN cookies; cookie mode cannot work.
    Disabled,
    /// 1 (the kernel's default): `bpf_tcp_gen_syncookie` makes cookies only while the
    /// listener's SYN queue is full, so in cookie mode the first SYNs of a flood fill the queue as
    /// usual and the program answers the rest.
    OnOverflow,
    /// 2: cookies on demand; cookie mode answers every SYN it judges. The kernel also answers
    /// every SYN that reaches it with a cookie (no SYN queue), below the threshold too.
    Always,
    /// The file could not be read or held another value.
    Unknown,
}

impl KernelCookies {
    /// Reads `/proc/sys/net/ipv4/tcp_syncookies` (of the calling thread's network namespace).
    pub fn read() -> Self {
        match std::fs::read_to_string("/proc/sys/net/ipv4/tcp_syncookies")
            .ok()
            .as_deref()
            .map(str::trim)
        {
            Some("0") => Self::Disabled,
            Some("1") => Self::OnOverflow,
            Some("2") => Self::Always,
            _ => Self::Unknown,
        }
    }

    /// Whether the kernel makes and validates the cookies cookie mode asks for (at once with 2,
    /// once the listener's SYN queue is full with 1).
    pub fn works(self) -> bool {
        matches!(self, Self::Always | Self::OnOverflow)
    }

    /// One sentence for the log: what was found and what it means.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Disabled => {
                "net.ipv4.tcp_syncookies = 0: the kernel neither makes nor validates SYN cookies; in cookie mode SYNs pass to the kernel (counted as pass/cookie_declined); set it to 1 or 2"
            }
            Self::OnOverflow => {
                "net.ipv4.tcp_syncookies = 1: while the SYN rate is over xdp.cookie_threshold, XDP answers SYNs with the kernel's cookies once the listener's SYN queue is full (before that they pass, counted as pass/cookie_declined)"
            }
            Self::Always => {
                "net.ipv4.tcp_syncookies = 2: while the SYN rate is over xdp.cookie_threshold, XDP answers every SYN with the kernel's cookie; below it the kernel answers SYNs with cookies itself"
            }
            Self::Unknown => {
                "net.ipv4.tcp_syncookies could not be read: in cookie mode SYNs may pass to the kernel instead of being answered"
            }
        }
    }
}

/// The XDP object built by `build.rs` from `door-ebpf` (empty when built with `AYA_BUILD_SKIP=1`).
/// The only eBPF object door carries: the benchmark's reference programs live in the tests crate
/// (`door_tests::reference`) and are loaded with [`Shield::load_object`].
pub static PROGRAM: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/door-xdp"));

/// Why the shield could not be loaded, attached or read.
#[derive(Debug, Error)]
pub enum ShieldError {
    /// This binary was built with `AYA_BUILD_SKIP=1` and carries no XDP program.
    #[error("this door binary was built without its XDP program (AYA_BUILD_SKIP=1)")]
    NoProgram,
    /// The object could not be parsed or its maps created (missing CAP_BPF, old kernel, …).
    #[error("loading the XDP object: {0}")]
    Load(#[from] EbpfError),
    /// The program is missing from the object or the verifier refused it (the message carries
    /// the verifier's log).
    #[error("loading the XDP program: {0}")]
    Program(#[from] ProgramError),
    /// A map is missing, has an unexpected type, or could not be read or written.
    #[error("the map {name}: {source}")]
    Map {
        /// The map's name.
        name: &'static str,
        /// aya's error.
        source: MapError,
    },
    /// The lists (`allow`, `deny`, `trusted_proxies`, `xdp.allow`, `xdp.deny`) take more
    /// entries of the lists trie than it holds ([`door_common::EXEMPT_CAPACITY`]); nothing was
    /// written. The configuration's checks refuse such lists first.
    #[error(
        "the allow, deny and trusted-proxy lists take {entries} entries of the XDP lists map, which holds {}",
        EXEMPT_CAPACITY
    )]
    ListsTooLong {
        /// The entries the lists take.
        entries: usize,
    },
    /// Attaching failed in every mode that was tried.
    #[error("attaching to {interface} failed: {attempts}")]
    Attach {
        /// The interface.
        interface: String,
        /// What each attempted mode answered.
        attempts: String,
    },
}

/// How the program ended up attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachedMode {
    /// Native, in the driver.
    Driver,
    /// Generic, in the kernel's stack.
    Skb,
}

impl AttachedMode {
    /// `driver` or `skb`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Driver => "driver",
            Self::Skb => "skb",
        }
    }
}

impl fmt::Display for AttachedMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One counter's total over all CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterValue {
    /// The counter (verdict and reason).
    pub counter: Counter,
    /// Packets, summed over CPUs.
    pub packets: u64,
}

/// The XDP program's log (aya-log records from its `AYA_LOGS` ring buffer: cookie mode entered
/// and left, the churn guard closing, the prefix map full), taken from the [`Shield`] with
/// [`Shield::take_log`]. It is readable (as a file descriptor) when records wait; [`XdpLog::drain`]
/// forwards them to door's log (`tracing`, target `door::xdp`).
pub struct XdpLog {
    reader: EbpfLogger<Collector>,
    lines: Arc<Mutex<Vec<XdpLogLine>>>,
}

/// One record of the XDP program's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdpLogLine {
    /// Its level (the program logs at info and warn).
    pub level: log::Level,
    /// The message, formatted.
    pub message: String,
}

/// The `log::Log` that aya-log's reader hands the records to: kept until [`XdpLog::drain`].
struct Collector(Arc<Mutex<Vec<XdpLogLine>>>);

impl log::Log for Collector {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(XdpLogLine {
                level: record.level(),
                message: record.args().to_string(),
            });
    }

    fn flush(&self) {}
}

impl XdpLog {
    /// Reads every waiting record, logs each through `tracing` (target `door::xdp`, at its
    /// level), and returns them.
    pub fn drain(&mut self) -> Vec<XdpLogLine> {
        self.reader.flush();
        let lines = std::mem::take(&mut *self.lines.lock().unwrap_or_else(PoisonError::into_inner));
        for line in &lines {
            let message = &line.message;
            match line.level {
                log::Level::Error => tracing::error!(target: "door::xdp", "{message}"),
                log::Level::Warn => tracing::warn!(target: "door::xdp", "{message}"),
                log::Level::Info => tracing::info!(target: "door::xdp", "{message}"),
                log::Level::Debug => tracing::debug!(target: "door::xdp", "{message}"),
                log::Level::Trace => tracing::trace!(target: "door::xdp", "{message}"),
            }
        }
        lines
    }
}

impl AsRawFd for XdpLog {
    fn as_raw_fd(&self) -> RawFd {
        self.reader.as_raw_fd()
    }
}

impl fmt::Debug for XdpLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XdpLog").finish_non_exhaustive()
    }
}

/// Forwards the XDP program's log to door's log for as long as the task runs: waits until the
/// ring buffer is readable, then drains it.
pub async fn forward_log(log: XdpLog) {
    #[expect(
        deprecated,
        reason = "the safe constructor; XdpLog owns the ring buffer's fd for as long as the AsyncFd holds it, the I/O safety its unsafe successor asks the caller to promise"
    )]
    let registered = tokio::io::unix::AsyncFd::with_interest(log, tokio::io::Interest::READABLE);
    let mut fd = match registered {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(error = %e, "the XDP program's log cannot be read; its events are not logged");
            return;
        }
    };
    loop {
        let Ok(mut guard) = fd.readable_mut().await else {
            return;
        };
        guard.get_inner_mut().drain();
        guard.clear_ready();
    }
}

/// The aya-log level the program logs at (`AYA_LOG_LEVEL`: 0 off, 2 warn, 3 info), from what
/// door's log lets through for target `door::xdp`.
fn xdp_log_level() -> u8 {
    if tracing::enabled!(target: "door::xdp", tracing::Level::INFO) {
        3
    } else if tracing::enabled!(target: "door::xdp", tracing::Level::WARN) {
        2
    } else {
        0
    }
}

/// The loaded XDP program and its maps.
pub struct Shield {
    ebpf: Ebpf,
    /// The program's log, until [`Shield::take_log`].
    log: Option<XdpLog>,
    /// The configuration last written to the config map (`None` until [`Shield::configure`]).
    config: Option<Box<ShieldConfig>>,
    /// Whether anything was ever put on the blocklist (its flag then stays set).
    blocklist_used: bool,
    /// The words of the lists filter as last written ([`door_common::MAP_LIST_FILTER`], zeros
    /// when loaded).
    list_filter: Box<[u64]>,
    /// The deadlines of the blocklist entries written, to delete expired ones without a walk.
    deadlines: deadlines::Deadlines,
    attached: Option<(String, AttachedMode, XdpLinkId)>,
}

impl fmt::Debug for Shield {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shield")
            .field("attached", &self.attached())
            .finish_non_exhaustive()
    }
}

impl Shield {
    /// Loads the embedded program into the kernel (creating its maps) without attaching it.
    ///
    /// # Errors
    /// [`ShieldError::NoProgram`] for a binary built without it; [`ShieldError::Load`] or
    /// [`ShieldError::Program`] when the kernel refuses (privileges, verifier).
    pub fn load() -> Result<Self, ShieldError> {
        Self::load_object(PROGRAM)
    }

    /// Loads the embedded program with a per-prefix LRU map of `max_prefixes` entries
    /// (`[xdp] max_prefixes`) instead of [`door_common::PREFIX_MAP_CAPACITY`].
    ///
    /// # Errors
    /// As [`Shield::load`].
    pub fn load_with_capacity(max_prefixes: u32) -> Result<Self, ShieldError> {
        Self::load_inner(PROGRAM, Some(max_prefixes), xdp_log_level())
    }

    /// Loads `object` (an eBPF ELF with door's program and maps), for tests and benchmarks.
    ///
    /// # Errors
    /// As [`Shield::load`].
    pub fn load_object(object: &[u8]) -> Result<Self, ShieldError> {
        // Tests and benchmarks: every record the program makes (info and warn).
        Self::load_inner(object, None, 3)
    }

    fn load_inner(
        object: &[u8],
        max_prefixes: Option<u32>,
        log_level: u8,
    ) -> Result<Self, ShieldError> {
        if object.is_empty() {
            return Err(ShieldError::NoProgram);
        }
        let mut loader = aya::EbpfLoader::new();
        if let Some(n) = max_prefixes {
            loader.map_max_entries(MAP_PREFIXES, n);
        }
        loader.override_global(aya_log::LEVEL, &log_level, false);
        let mut ebpf = loader.load(object)?;
        program_mut(&mut ebpf)?.load()?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        // An object without aya-log records has no ring buffer: no log, nothing lost.
        let log = EbpfLogger::init_with_logger(&mut ebpf, Collector(Arc::clone(&lines)))
            .ok()
            .map(|reader| XdpLog { reader, lines });
        Ok(Self {
            ebpf,
            log,
            config: None,
            blocklist_used: false,
            list_filter: vec![0; LIST_FILTER_WORDS as usize].into_boxed_slice(),
            deadlines: deadlines::Deadlines::default(),
            attached: None,
        })
    }

    /// Attaches to `interface` in `mode` (`Auto` tries driver, then skb). Detaches a previous
    /// attachment first.
    ///
    /// # Errors
    /// [`ShieldError::Attach`] listing what each attempted mode answered; `mode` `Off` attaches
    /// nothing and returns that error too.
    pub fn attach(&mut self, interface: &str, mode: XdpMode) -> Result<AttachedMode, ShieldError> {
        self.detach();
        let attempts: &[AttachedMode] = match mode {
            XdpMode::Auto => &[AttachedMode::Driver, AttachedMode::Skb],
            XdpMode::Driver => &[AttachedMode::Driver],
            XdpMode::Skb => &[AttachedMode::Skb],
            XdpMode::Off => &[],
        };
        let mut failures = Vec::new();
        let program = program_mut(&mut self.ebpf)?;
        for &attempt in attempts {
            let aya_mode = match attempt {
                AttachedMode::Driver => AyaXdpMode::Driver,
                AttachedMode::Skb => AyaXdpMode::Skb,
            };
            match program.attach(interface, aya_mode) {
                Ok(link) => {
                    self.attached = Some((interface.to_owned(), attempt, link));
                    return Ok(attempt);
                }
                Err(e) => failures.push(format!("{attempt} mode: {e}")),
            }
        }
        if failures.is_empty() {
            failures.push("mode is off".to_owned());
        }
        Err(ShieldError::Attach {
            interface: interface.to_owned(),
            attempts: failures.join("; "),
        })
    }

    /// The program's log, once (`None` afterwards, or for an object that logs nothing).
    pub fn take_log(&mut self) -> Option<XdpLog> {
        self.log.take()
    }

    /// Detaches the program if attached (packets then pass untouched: fail-open).
    pub fn detach(&mut self) {
        if let Some((interface, mode, link)) = self.attached.take() {
            match program_mut(&mut self.ebpf).map(|p| p.detach(link)) {
                Ok(Ok(())) => tracing::info!(%interface, %mode, "XDP program detached"),
                Ok(Err(e)) => {
                    tracing::warn!(%interface, error = %e, "detaching the XDP program failed");
                }
                Err(e) => {
                    tracing::warn!(%interface, error = %e, "detaching the XDP program failed");
                }
            }
        }
    }

    /// The interface and mode the program is attached with, if it is.
    pub fn attached(&self) -> Option<(&str, AttachedMode)> {
        self.attached.as_ref().map(|(i, m, _)| (i.as_str(), *m))
    }

    /// Every counter, summed over CPUs, in [`Counter::ALL`] order.
    ///
    /// # Errors
    /// [`ShieldError::Map`] if the counter map cannot be read.
    pub fn counters(&self) -> Result<Vec<CounterValue>, ShieldError> {
        let map_err = map_error(MAP_COUNTERS);
        let array =
            PerCpuArray::<_, u64>::try_from(map_ref(&self.ebpf, MAP_COUNTERS)?).map_err(map_err)?;
        let mut out = Vec::with_capacity(COUNTER_COUNT as usize);
        for counter in Counter::ALL {
            let per_cpu = array.get(&counter.index(), 0).map_err(map_err)?;
            out.push(CounterValue {
                counter,
                packets: per_cpu.iter().sum(),
            });
        }
        Ok(out)
    }

    /// The state of one source prefix, if the program has an entry for it.
    ///
    /// # Errors
    /// [`ShieldError::Map`] if the prefix map cannot be read.
    pub fn prefix(&self, key: &PrefixKey) -> Result<Option<PrefixState>, ShieldError> {
        let map = self.prefixes()?;
        match map.get(key, 0) {
            Ok(state) => Ok(Some(state)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(source) => Err(map_error(MAP_PREFIXES)(source)),
        }
    }

    /// The `n` prefixes with the most SYNs, most first (reads the whole map: up to
    /// [`door_common::PREFIX_MAP_CAPACITY`] entries).
    ///
    /// # Errors
    /// [`ShieldError::Map`] if the prefix map cannot be read.
    pub fn top_prefixes(&self, n: usize) -> Result<Vec<(PrefixKey, PrefixState)>, ShieldError> {
        let map = self.prefixes()?;
        // Entries that vanish mid-walk (LRU eviction) are skipped, not errors.
        let mut all: Vec<(PrefixKey, PrefixState)> = map.iter().filter_map(Result::ok).collect();
        all.sort_unstable_by(|a, b| b.1.syns.cmp(&a.1.syns).then(a.0.cmp(&b.0)));
        all.truncate(n);
        Ok(all)
    }

    /// Runs the loaded program once per `repeat` on `packet` with `BPF_PROG_TEST_RUN`, returning
    /// the XDP action (`XDP_DROP` = 1, `XDP_PASS` = 2, `XDP_TX` = 3) and the kernel's mean time per run.
    ///
    /// # Errors
    /// [`ShieldError::Program`] if the kernel refuses the test run.
    pub fn test_run(&self, packet: &[u8], repeat: u32) -> Result<(u32, Duration), ShieldError> {
        let program: &Xdp = self
            .ebpf
            .program(PROGRAM_NAME)
            .ok_or(ProgramError::InvalidName {
                name: PROGRAM_NAME.to_owned(),
            })?
            .try_into()?;
        let result = program.test_run(TestRunOptions {
            data_in: Some(packet),
            repeat,
            ..TestRunOptions::default()
        })?;
        Ok((result.return_value, result.duration))
    }

    /// Runs the program once on `packet` (`BPF_PROG_TEST_RUN`, as [`Shield::test_run`]) and
    /// returns the XDP action and the frame as the program left it (rewritten in place, and cut
    /// by `bpf_xdp_adjust_tail`), for tests of the SYN cookie answer. The lookups the program
    /// makes see the network namespace of the calling thread (its loopback device stands in for
    /// the interface).
    ///
    /// # Errors
    /// [`ShieldError::Program`] if the kernel refuses the test run.
    pub fn test_run_frame(&self, packet: &[u8]) -> Result<(u32, Vec<u8>), ShieldError> {
        let program: &Xdp = self
            .ebpf
            .program(PROGRAM_NAME)
            .ok_or(ProgramError::InvalidName {
                name: PROGRAM_NAME.to_owned(),
            })?
            .try_into()?;
        // Room for the frame as given: the program only ever shortens it.
        let mut out = vec![0; packet.len().max(64)];
        let result = program.test_run(TestRunOptions {
            data_in: Some(packet),
            data_out: Some(&mut out),
            repeat: 1,
            ..TestRunOptions::default()
        })?;
        out.truncate(usize::try_from(result.data_size_out).unwrap_or(usize::MAX));
        Ok((result.return_value, out))
    }

    /// Writes the shield's settings (SYN budget, churn guard, protected ports) into the config map
    /// and replaces the lists trie's contents with `exempt` (never shed) and `deny` (every SYN
    /// dropped; a prefix in both is denied), and the lists filter in front of it
    /// ([`door_common::list_filter`]: the program walks the trie for every source while it
    /// changes). Takes effect for the next packet; the program is not reattached. Until this is
    /// called the program only observes.
    ///
    /// # Errors
    /// [`ShieldError::Map`] when a map cannot be written (the exempt trie holds
    /// [`door_common::EXEMPT_CAPACITY`] entries; an IPv4 network takes two, an IPv6 one one).
    pub fn configure(
        &mut self,
        xdp: &XdpConfig,
        exempt: &[IpNet],
        deny: &[IpNet],
    ) -> Result<(), ShieldError> {
        // The program's clock moves a timer tick at a time (CLOCK_MONOTONIC_COARSE): within a
        // tick it stands still, so each bucket may also spend the tokens one tick buys, or a
        // bucket whose burst is less than a tick's worth would pass fewer SYNs than its rate
        // (docs/decisions.md, "XDP: the coarse clock").
        let step = crate::time::kernel_coarse_step_ns();
        let tolerance =
            |interval: u64, burst: u32| gcra::tolerance_ns(interval, burst).saturating_add(step);
        let syn_interval = gcra::interval_ns(xdp.syn_rate);
        let mut cfg = Box::new(ShieldConfig::new(
            syn_interval,
            tolerance(syn_interval, xdp.syn_burst),
        ));
        cfg.overflow_interval_ns = gcra::interval_ns(xdp.overflow_syn_rate);
        cfg.overflow_tolerance_ns = tolerance(cfg.overflow_interval_ns, xdp.overflow_syn_burst);
        if xdp.new_prefix_rate > 0.0 {
            cfg.new_prefix_interval_ns = gcra::interval_ns(xdp.new_prefix_rate);
            cfg.new_prefix_tolerance_ns =
                tolerance(cfg.new_prefix_interval_ns, xdp.new_prefix_burst);
        }
        if xdp.ports.is_empty() {
            cfg.flags |= CONFIG_ALL_PORTS;
        }
        if !exempt.is_empty() || !deny.is_empty() {
            cfg.flags |= CONFIG_HAS_EXEMPT;
        }
        // Once blocklisting has started it stays on: entries outlive reconfigurations.
        if self.blocklist_used {
            cfg.flags |= CONFIG_HAS_BLOCKLIST;
        }
        for &port in &xdp.ports {
            cfg.protect(port);
        }
        if xdp.syn_cookies == SynCookies::Auto {
            cfg.flags |= CONFIG_COOKIES;
            let cpus = aya::util::nr_cpus().map_or(1, |n| n.max(1));
            #[expect(clippy::cast_precision_loss, reason = "a CPU count is far below 2^52")]
            let share = xdp.cookie_threshold / cpus as f64;
            let second = u64::try_from(Duration::from_secs(1).as_nanos()).unwrap_or(u64::MAX);
            cfg.cookie_interval_ns = gcra::interval_ns(share);
            cfg.cookie_tolerance_ns = cfg.cookie_interval_ns.max(second);
            cfg.cookie_leave_interval_ns = gcra::interval_ns(share * 0.8);
            cfg.cookie_leave_tolerance_ns = cfg.cookie_leave_interval_ns.max(second);
            cfg.cookie_hold_ns = u64::try_from(COOKIE_HOLD.as_nanos()).unwrap_or(u64::MAX);
        }
        // The trie is filled before the flag that makes the program read it is written.
        let map_err = map_error(MAP_EXEMPT);
        let wanted = lists::list_entries(exempt, deny);
        // Checked before the trie is touched, so that a list too long leaves the old one whole.
        if wanted.len() > EXEMPT_CAPACITY as usize {
            return Err(ShieldError::ListsTooLong {
                entries: wanted.len(),
            });
        }
        // While the trie changes, the program walks it for every source: the filter of the old
        // lists may not have the new entries' bits.
        if let Some(old) = self.config.as_deref()
            && old.flags & CONFIG_LIST_FILTER != 0
        {
            let mut off = Box::new(*old);
            off.flags &= !CONFIG_LIST_FILTER;
            self.write_config(off)?;
        }
        let mut trie: LpmTrie<_, ExemptKey, u32> =
            LpmTrie::try_from(map_mut(&mut self.ebpf, MAP_EXEMPT)?).map_err(map_err)?;
        let stale: Vec<Key<ExemptKey>> = trie
            .keys()
            .filter_map(Result::ok)
            .filter(|k| !wanted.iter().any(|(w, _)| lists::same_key(w, k)))
            .collect();
        for key in &stale {
            trie.remove(key).map_err(map_err)?;
        }
        for (key, value) in &wanted {
            trie.insert(key, value, 0).map_err(map_err)?;
        }
        if cfg.flags & CONFIG_HAS_EXEMPT != 0 {
            let filter = ListFilter::of(&wanted);
            self.write_list_filter(&filter.words)?;
            cfg.lead_mask_v4 = filter.mask_v4;
            cfg.lead_mask_v6 = filter.mask_v6;
            // The masks land with the flag still clear, and the flag alone after them: a map
            // update is a copy, and a SYN judged during it must not pair the new flag with the
            // old masks.
            self.write_config(cfg.clone())?;
            cfg.flags |= CONFIG_LIST_FILTER;
        }
        self.write_config(cfg)
    }

    /// Writes the words of the lists filter that differ from those written last.
    fn write_list_filter(&mut self, words: &[u64]) -> Result<(), ShieldError> {
        let map_err = map_error(MAP_LIST_FILTER);
        let mut array: Array<_, u64> =
            Array::try_from(map_mut(&mut self.ebpf, MAP_LIST_FILTER)?).map_err(map_err)?;
        for ((i, new), old) in (0u32..).zip(words).zip(self.list_filter.iter_mut()) {
            if new != old {
                array.set(i, new, 0).map_err(map_err)?;
                *old = *new;
            }
        }
        Ok(())
    }

    fn write_config(&mut self, config: Box<ShieldConfig>) -> Result<(), ShieldError> {
        let map_err = map_error(MAP_CONFIG);
        let mut array: Array<_, ShieldConfig> =
            Array::try_from(map_mut(&mut self.ebpf, MAP_CONFIG)?).map_err(map_err)?;
        array.set(0, *config, 0).map_err(map_err)?;
        self.config = Some(config);
        Ok(())
    }

    /// Puts `key` on the blocklist for `duration` from now, replacing any deadline it had (the
    /// admin API's `POST /blocks`, whose operator means this duration): the program drops its
    /// SYNs until then and ignores the entry after. Expired entries are deleted by the next block.
    /// The blocklist is an LRU map of [`door_common::BLOCKED_CAPACITY`] entries: when it is full,
    /// the kernel frees a batch of the entries whose prefixes sent a SYN least recently (up to
    /// 128 at once, its per-CPU free target) to make room, and door warns at most once a minute
    /// (docs/decisions.md, "The daemon owns the blocklist's entries; the map is an LRU").
    ///
    /// # Errors
    /// [`ShieldError::Map`] when the blocklist cannot be written.
    pub fn block(&mut self, key: PrefixKey, duration: Duration) -> Result<(), ShieldError> {
        self.write_block(key, Self::deadline_in(duration), Deadline::Replace)
    }

    /// Puts `key` on the blocklist for `duration` from now, unless it is blocked longer already,
    /// which it then stays (an escalation, a block fetched from the cluster): a shorter block
    /// never cuts a longer one short, whoever made it. Otherwise as [`Shield::block`].
    ///
    /// # Errors
    /// As [`Shield::block`].
    pub fn extend(&mut self, key: PrefixKey, duration: Duration) -> Result<(), ShieldError> {
        self.write_block(key, Self::deadline_in(duration), Deadline::KeepLater)
    }

    /// Puts `key` on the blocklist until `deadline_ns` on the `bpf_ktime_get_coarse_ns` clock
    /// (CLOCK_MONOTONIC_COARSE), replacing any deadline it had. A deadline in the past is
    /// accepted: SYNs pass, and the next block deletes it. The program only enforces the
    /// blocklist once [`Shield::configure`] has run (before that it only observes).
    ///
    /// # Errors
    /// As [`Shield::block`].
    pub fn block_until(&mut self, key: PrefixKey, deadline_ns: u64) -> Result<(), ShieldError> {
        self.write_block(key, deadline_ns, Deadline::Replace)
    }

    fn deadline_in(duration: Duration) -> u64 {
        let ns = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        crate::time::kernel_monotonic_ns().saturating_add(ns)
    }

    fn write_block(
        &mut self,
        key: PrefixKey,
        deadline_ns: u64,
        how: Deadline,
    ) -> Result<(), ShieldError> {
        let map_err = map_error(MAP_BLOCKED);
        let mut map: HashMap<_, PrefixKey, u64> =
            HashMap::try_from(map_mut(&mut self.ebpf, MAP_BLOCKED)?).map_err(map_err)?;
        // The daemon is the only one that deletes entries (the program ignores expired ones), so a
        // re-block can never be lost to a concurrent delete.
        let now = crate::time::kernel_monotonic_ns();
        for k in self.deadlines.take_due(now, &key) {
            // Already gone (evicted by the LRU) is fine.
            let _ = map.remove(&k);
        }
        let deadline_ns = match how {
            Deadline::Replace => deadline_ns,
            // A missing entry (never blocked, evicted) reads as no deadline.
            Deadline::KeepLater => map.get(&key, 0).map_or(deadline_ns, |d| d.max(deadline_ns)),
        };
        map.insert(key, deadline_ns, 0).map_err(map_err)?;
        self.deadlines.set(key, deadline_ns);
        // The index holds the live blocks this daemon wrote (expired ones were just taken out).
        // The kernel's LRU keeps up to 128 free entries per CPU that wrote to the map, so it may
        // begin to free blocks that much below the map's capacity.
        let margin = 128 * aya::util::nr_cpus().map_or(1, |n| n.max(1));
        if self.deadlines.len() + margin >= door_common::BLOCKED_CAPACITY as usize {
            static FULL: RateLimitedWarn = RateLimitedWarn::new(Duration::from_mins(1));
            if let Some(suppressed) = FULL.due() {
                tracing::warn!(
                    capacity = door_common::BLOCKED_CAPACITY,
                    suppressed,
                    "the XDP blocklist is full or nearly: the kernel frees the blocks whose \
                     prefixes sent a SYN least recently, up to 128 at a time, to make room for \
                     new ones; those prefixes are no longer blocked (GET /blocks lists what is; at \
                     most one line a minute)"
                );
            }
        }
        // The entry is in place before the flag that makes the program look it up.
        self.blocklist_used = true;
        if let Some(config) = &self.config
            && config.flags & CONFIG_HAS_BLOCKLIST == 0
        {
            let mut config = config.clone();
            config.flags |= CONFIG_HAS_BLOCKLIST;
            self.write_config(config)?;
        }
        Ok(())
    }

    /// Takes `key` off the blocklist (the admin API's `DELETE /blocks/{prefix}`): its SYNs pass
    /// again at once. Returns whether it was on it (an expired entry not yet deleted counts).
    ///
    /// # Errors
    /// [`ShieldError::Map`] if the blocklist cannot be written.
    pub fn unblock(&mut self, key: &PrefixKey) -> Result<bool, ShieldError> {
        let map_err = map_error(MAP_BLOCKED);
        let mut map: HashMap<_, PrefixKey, u64> =
            HashMap::try_from(map_mut(&mut self.ebpf, MAP_BLOCKED)?).map_err(map_err)?;
        self.deadlines.remove(key);
        match map.remove(key) {
            Ok(()) => Ok(true),
            Err(MapError::KeyNotFound) => Ok(false),
            // aya reports a missing key on delete as the syscall's ENOENT.
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(false)
            }
            Err(source) => Err(map_err(source)),
        }
    }

    /// Whether the program never sheds `key`'s SYNs: the prefix's first and last addresses (one
    /// address for an IPv4 /32) are both on an exempt list (`allow`, `xdp.allow`,
    /// `trusted_proxies`) as the lists trie's longest match says, which the program checks
    /// before the blocklist. An exempt network inside an IPv6 /64 leaves the rest of it
    /// blockable: not exempt.
    ///
    /// # Errors
    /// [`ShieldError::Map`] if the lists trie cannot be read.
    pub fn exempt(&self, key: &PrefixKey) -> Result<bool, ShieldError> {
        let map_err = map_error(MAP_EXEMPT);
        let trie: LpmTrie<_, ExemptKey, u32> =
            LpmTrie::try_from(map_ref(&self.ebpf, MAP_EXEMPT)?).map_err(map_err)?;
        let mut last = key.addr;
        if key.network().is_ipv6()
            && let Some(host) = last.last_chunk_mut::<8>()
        {
            *host = [0xff; 8];
        }
        for addr in [key.addr, last] {
            match trie.get(&Key::new(128, addr), 0) {
                Ok(value) if value == door_common::EXEMPT => {}
                Ok(_) | Err(MapError::KeyNotFound) => return Ok(false),
                Err(MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::ENOENT) =>
                {
                    return Ok(false);
                }
                Err(source) => return Err(map_err(source)),
            }
        }
        Ok(true)
    }

    /// The blocklist: prefixes and their deadlines (ns, CLOCK_MONOTONIC_COARSE), expired entries
    /// included until the next [`Shield::block`] deletes them.
    ///
    /// # Errors
    /// [`ShieldError::Map`] if the blocklist cannot be read.
    pub fn blocked(&self) -> Result<Vec<(PrefixKey, u64)>, ShieldError> {
        let map_err = map_error(MAP_BLOCKED);
        let map: HashMap<_, PrefixKey, u64> =
            HashMap::try_from(map_ref(&self.ebpf, MAP_BLOCKED)?).map_err(map_err)?;
        Ok(map.iter().filter_map(Result::ok).collect())
    }

    /// Cookie mode across CPUs: how many are in it (a CPU quiet for the hold since its flood
    /// is out, though it leaves for the program only at its next SYN: `cookie_quiet`), and the
    /// entered/left events.
    ///
    /// # Errors
    /// [`ShieldError::Map`] if the cookie map cannot be read.
    pub fn cookies(&self) -> Result<CookieSummary, ShieldError> {
        let map_err = map_error(MAP_COOKIE);
        let array: PerCpuArray<_, CookieState> =
            PerCpuArray::try_from(map_ref(&self.ebpf, MAP_COOKIE)?).map_err(map_err)?;
        let per_cpu = array.get(&0, 0).map_err(map_err)?;
        // A CPU the flood has left quiet for the hold leaves at its next SYN: it is out already.
        let hold = self.config.as_ref().map_or(0, |c| c.cookie_hold_ns);
        let now = crate::time::kernel_monotonic_ns();
        Ok(per_cpu
            .iter()
            .fold(CookieSummary::default(), |s, c| CookieSummary {
                active_cpus: s.active_cpus
                    + u32::from(c.active != 0 && !cookie_quiet(c.leave_tat_ns, hold, now)),
                entered: s.entered + c.entered,
                left: s.left + c.left,
            }))
    }

    /// Rewrites every CPU's cookie-mode state ([`door_common::MAP_COOKIE`]) with `update`: a
    /// test's stand-in for the kernel's clock moving on, since the program reads
    /// `bpf_ktime_get_coarse_ns`, which a test cannot set (with `leave_tat_ns` moved back, a CPU
    /// in cookie mode reads as quiet for the hold). Only with the `test-hooks` feature.
    ///
    /// # Errors
    /// [`ShieldError::Map`] if the cookie map cannot be read or written.
    #[cfg(feature = "test-hooks")]
    pub fn update_cookie_states(
        &mut self,
        update: impl FnMut(&mut CookieState),
    ) -> Result<(), ShieldError> {
        let map_err = map_error(MAP_COOKIE);
        let mut array: PerCpuArray<_, CookieState> =
            PerCpuArray::try_from(map_mut(&mut self.ebpf, MAP_COOKIE)?).map_err(map_err)?;
        let mut states: Vec<CookieState> = array.get(&0, 0).map_err(map_err)?.to_vec();
        states.iter_mut().for_each(update);
        // Refused only for a count other than the possible CPUs', which is what `get` returned.
        let values = aya::maps::PerCpuValues::try_from(states).map_err(|io_error| {
            map_err(MapError::SyscallError(aya::sys::SyscallError {
                call: "PerCpuValues::try_from (one value per possible CPU)",
                io_error,
            }))
        })?;
        array.set(0, values, 0).map_err(map_err)
    }

    /// The churn guard: its new-prefix bucket and the shared overflow bucket's counts.
    ///
    /// # Errors
    /// [`ShieldError::Map`] if the guard map cannot be read.
    pub fn guard(&self) -> Result<GuardState, ShieldError> {
        let map_err = map_error(MAP_GUARD);
        let array: Array<_, GuardState> =
            Array::try_from(map_ref(&self.ebpf, MAP_GUARD)?).map_err(map_err)?;
        array.get(&0, 0).map_err(map_err)
    }

    /// Number of prefixes the LRU map currently holds (walks the keys).
    ///
    /// # Errors
    /// [`ShieldError::Map`] if the prefix map cannot be read.
    pub fn tracked_prefixes(&self) -> Result<usize, ShieldError> {
        Ok(self.prefixes()?.keys().flatten().count())
    }

    fn prefixes(
        &self,
    ) -> Result<HashMap<&aya::maps::MapData, PrefixKey, PrefixState>, ShieldError> {
        let map_err = map_error(MAP_PREFIXES);
        HashMap::try_from(map_ref(&self.ebpf, MAP_PREFIXES)?).map_err(map_err)
    }
}

impl Drop for Shield {
    fn drop(&mut self) {
        self.detach();
    }
}

/// An error of map `name` as a [`ShieldError::Map`] naming it.
fn map_error(name: &'static str) -> impl Fn(MapError) -> ShieldError + Copy {
    move |source| ShieldError::Map { name, source }
}

/// The program's map `name`.
///
/// # Errors
/// [`ShieldError::Map`] (`InvalidName`) if the object has no such map.
fn map_ref<'a>(ebpf: &'a Ebpf, name: &'static str) -> Result<&'a aya::maps::Map, ShieldError> {
    ebpf.map(name).ok_or_else(|| no_such_map(name))
}

/// The program's map `name`, writable.
///
/// # Errors
/// As [`map_ref`].
fn map_mut<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut aya::maps::Map, ShieldError> {
    ebpf.map_mut(name).ok_or_else(|| no_such_map(name))
}

fn no_such_map(name: &'static str) -> ShieldError {
    map_error(name)(MapError::InvalidName {
        name: name.to_owned(),
    })
}

fn program_mut(ebpf: &mut Ebpf) -> Result<&mut Xdp, ShieldError> {
    Ok(ebpf
        .program_mut(PROGRAM_NAME)
        .ok_or(ProgramError::InvalidName {
            name: PROGRAM_NAME.to_owned(),
        })?
        .try_into()?)
}
