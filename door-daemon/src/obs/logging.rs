//! Logging through `tracing` (docs/design.md, "Observability": journald-friendly).
//!
//! [`init`] picks the format once, at start-up:
//!
//! - **journald** (stderr is the stream named by `JOURNAL_STREAM`, as under systemd): one line per
//!   event, `<P>target: message key=value…`, where `<P>` is the syslog priority that journald strips
//!   and stores as the entry's `PRIORITY` (`<3>` error, `<4>` warning, `<6>` info, `<7>` debug and
//!   trace; sd-daemon(3)). No timestamp (journald has its own) and no ANSI colours.
//! - **plain text** otherwise: the `tracing_subscriber` default with a timestamp, coloured only
//!   when stderr is a terminal.
//!
//! Filtering is `RUST_LOG` syntax (`RUST_LOG=door_daemon=debug,info`), [`DEFAULT_FILTER`] by
//! default.
//!
//! Conditions that can repeat once per request (an upstream that refuses connections, a proxy
//! missing from `trusted_proxies`) must not log once per request: [`WarnOnce`] and
//! [`RateLimitedWarn`] decide when such a warning is due, and the counters (metrics) carry the
//! rate.

use std::{
    fmt,
    io::IsTerminal as _,
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::{
    EnvFilter,
    fmt::{FmtContext, FormatEvent, FormatFields, format::Writer},
    registry::LookupSpan,
};

/// The filter used when `RUST_LOG` is unset or invalid: `info`, and the [`QUIET`] targets at
/// `error`.
pub const DEFAULT_FILTER: &str = "info,aya::bpf=error,rustls=error,h2=error";

/// Targets held at `error` whatever `RUST_LOG` says, unless it names them itself:
///
/// - `aya::bpf`: the kernel refuses the XDP object's BTF (bpf-linker 0.10 leaves a type named
///   `MaybeUninit<u8>`, from aya-log's level global, which the kernel's BTF check takes for an
///   invalid name), and aya then loads the program without it, which door does not need, after a
///   warning that dumps the whole BTF, some 160 lines at every start (`RUST_LOG=info,aya::bpf=warn`
///   shows it).
/// - `rustls`: the TLS library warns once per failed handshake (a record out of order, an invalid
///   SNI name, with the client's text in it), so any client could write a line per connection;
///   door logs its handshake failures itself, at `debug`.
/// - `h2`: the HTTP/2 library warns once per frame of some kinds a client sends (a PING
///   acknowledgement door never asked for, a stream reset before door accepted it), so one
///   connection could write a hundred thousand lines in a second (a hostile-input pass did: 14.6
///   MB of log from 1.7 MB sent), and push door's own lines out of journald's rate limit; the
///   protocol errors it reports end the stream or the connection, which door counts.
pub const QUIET: [&str; 3] = ["aya::bpf", "rustls", "h2"];

/// The filter of `rust_log` (the `RUST_LOG` value; [`DEFAULT_FILTER`] when unset or invalid):
/// its directives, then each [`QUIET`] target it does not name at `error`.
pub fn filter(rust_log: Option<&str>) -> EnvFilter {
    let Some(Ok(mut filter)) = rust_log.map(EnvFilter::try_new) else {
        return EnvFilter::new(DEFAULT_FILTER);
    };
    for target in QUIET {
        let named = rust_log.is_some_and(|spec| {
            spec.split(',')
                .any(|d| d.trim().split(['=', '[']).next() == Some(target))
        });
        if let (false, Ok(directive)) = (named, format!("{target}=error").parse()) {
            filter = filter.add_directive(directive);
        }
    }
    filter
}

/// Installs the global subscriber: [`JournaldFormat`] when stderr is connected to the journal,
/// plain text otherwise; `RUST_LOG` filtering ([`filter`]). Call once, first thing in `main`;
/// later calls (and a subscriber already set, as in tests) are ignored.
pub fn init() {
    let filter = filter(std::env::var(EnvFilter::DEFAULT_ENV).ok().as_deref());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // `try_init` fails only if a global subscriber is already set: keep that one.
    let _ = if stderr_is_journal() {
        builder
            .with_ansi(false)
            .event_format(JournaldFormat)
            .try_init()
    } else {
        builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init()
    };
}

/// Whether stderr is the journal stream systemd connected (sd-daemon(3): `JOURNAL_STREAM` is
/// `DEVICE:INODE` of that stream, and matches stderr's only if it was not redirected since).
pub fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let Some(value) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    journal_stream_matches(&value.to_string_lossy(), meta.dev(), meta.ino())
}

/// Whether a `JOURNAL_STREAM` value (`DEVICE:INODE`, decimal) names the file `dev`/`ino`.
pub fn journal_stream_matches(value: &str, dev: u64, ino: u64) -> bool {
    let Some((d, i)) = value.trim().split_once(':') else {
        return false;
    };
    d.parse() == Ok(dev) && i.parse() == Ok(ino)
}

/// The syslog priority journald gives a line prefixed with `<P>`: error 3, warning 4, info 6,
/// debug and trace 7.
pub fn syslog_priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// The journald line format: `<P>target: span: message key=value…` (no timestamp, no colour); a
/// value with line breaks continues on lines of the same priority, indented.
#[derive(Debug, Clone, Copy, Default)]
pub struct JournaldFormat;

impl<S, N> FormatEvent<S, N> for JournaldFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let priority = syslog_priority(*meta.level());
        let mut line = String::new();
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                line.push_str(span.name());
                line.push_str(": ");
            }
        }
        ctx.field_format()
            .format_fields(Writer::new(&mut line), event)?;
        // journald makes each line of a stream its own entry, and a line without a prefix gets
        // the default priority: a multi-line message (a verifier log in an error) keeps its
        // priority on every line, the continuation lines indented.
        let mut lines = line.lines();
        writeln!(
            writer,
            "<{priority}>{}: {}",
            meta.target(),
            lines.next().unwrap_or_default()
        )?;
        for more in lines {
            writeln!(writer, "<{priority}>  {more}")?;
        }
        Ok(())
    }
}

/// A warning that is due once per process: the first [`WarnOnce::first`] is `true`, every later
/// one `false`. For conditions that say something about the set-up (a proxy missing from
/// `trusted_proxies`), which a metric then counts.
///
/// ```
/// use door_daemon::obs::logging::WarnOnce;
/// static UNTRUSTED_XFF: WarnOnce = WarnOnce::new();
/// if UNTRUSTED_XFF.first() {
///     tracing::warn!("… (counted in door.untrusted_xff; warned once)");
/// }
/// ```
#[derive(Debug, Default)]
pub struct WarnOnce(AtomicBool);

impl WarnOnce {
    /// Not warned yet.
    pub const fn new() -> Self {
        Self(AtomicBool::new(false))
    }

    /// `true` exactly once: the caller logs then.
    pub fn first(&self) -> bool {
        !self.0.swap(true, Ordering::Relaxed)
    }
}

/// A warning that is due at most once per `interval`, saying how many occurrences were not
/// logged since the last line. For conditions that come and go and can repeat once per request
/// (an upstream that fails): the first occurrence logs at once, then at most one line per
/// interval while it lasts.
///
/// ```
/// use std::time::Duration;
/// use door_daemon::obs::logging::RateLimitedWarn;
/// static UPSTREAM_FAILED: RateLimitedWarn = RateLimitedWarn::new(Duration::from_mins(1));
/// if let Some(suppressed) = UPSTREAM_FAILED.due() {
///     tracing::warn!(suppressed, "upstream request failed (at most one line a minute)");
/// }
/// ```
#[derive(Debug)]
pub struct RateLimitedWarn {
    interval: Duration,
    state: Mutex<WarnState>,
}

#[derive(Debug)]
struct WarnState {
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimitedWarn {
    /// At most one line per `interval`.
    pub const fn new(interval: Duration) -> Self {
        Self {
            interval,
            state: Mutex::new(WarnState {
                last: None,
                suppressed: 0,
            }),
        }
    }

    /// The interval between two lines.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// One occurrence, now: `Some(n)` if a line is due (`n` occurrences were not logged since the
    /// previous line), `None` if this one is only counted.
    pub fn due(&self) -> Option<u64> {
        self.due_at(crate::time::now())
    }

    /// One occurrence at `now` (tests inject time; `now` should not go backwards, and a time
    /// before the last line counts as within the interval).
    pub fn due_at(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let due = s
            .last
            .is_none_or(|last| now.saturating_duration_since(last) >= self.interval);
        if due {
            s.last = Some(now);
            Some(std::mem::take(&mut s.suppressed))
        } else {
            s.suppressed = s.suppressed.saturating_add(1);
            None
        }
    }
}

/// A log sink for tests: what a subscriber writes, kept for the test to read. Built for door's
/// own tests and, with the `test-hooks` feature, for the privileged suites of the tests crate.
#[cfg(any(test, feature = "test-hooks"))]
pub mod capture {
    use std::{
        io,
        sync::{Arc, Mutex, PoisonError},
    };

    use tracing_subscriber::fmt::MakeWriter;

    /// The lines a subscriber wrote ([`Capture::text`]); clones share them. Give it to
    /// `tracing_subscriber::fmt().with_writer(capture.clone())`.
    #[derive(Clone, Default)]
    pub struct Capture(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Capture {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Capture {
        type Writer = Self;
        fn make_writer(&'a self) -> Self {
            self.clone()
        }
    }

    impl Capture {
        /// What was written so far, as text (invalid UTF-8 replaced).
        pub fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner))
                .into_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{capture::Capture, *};

    /// Runs `f` under a journald-format subscriber at `trace` and returns what it wrote.
    fn journald(f: impl FnOnce()) -> String {
        let out = Capture::default();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::new("trace"))
            .with_ansi(false)
            .event_format(JournaldFormat)
            .with_writer(out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        out.text()
    }

    #[test]
    fn journald_lines_carry_the_syslog_priority_and_no_timestamp_or_colour() {
        let text = journald(|| {
            tracing::error!(target: "door", "e");
            tracing::warn!(target: "door", error = "refused", count = 3, "upstream request failed");
            tracing::info!(target: "door", "i");
            tracing::debug!(target: "door", "d");
            tracing::trace!(target: "door", "t");
        });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "<3>door: e",
                "<4>door: upstream request failed error=\"refused\" count=3",
                "<6>door: i",
                "<7>door: d",
                "<7>door: t",
            ]
        );
        assert!(!text.contains('\x1b'), "no ANSI escapes: {text:?}");
    }

    /// What a plain-text subscriber with [`filter`] of `rust_log` writes of a warning of door's,
    /// one of rustls's (the one a ClientHello with an invalid SNI name causes) and one of h2's
    /// (the one an unasked-for PING acknowledgement causes).
    fn filtered(rust_log: Option<&str>) -> String {
        let out = Capture::default();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(filter(rust_log))
            .with_ansi(false)
            .with_writer(out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(target: "door_daemon::http::front", "door's own");
            tracing::warn!(target: "rustls::msgs::handshake", "Illegal SNI hostname received");
            tracing::warn!(target: "h2::proto::ping_pong", "recv PING ack that we never sent");
        });
        out.text()
    }

    #[test]
    fn a_client_cannot_make_rustls_or_h2_write_a_line_unless_rust_log_asks_for_it() {
        for rust_log in [
            None,
            Some("info"),
            Some("warn,door_daemon=debug"),
            Some("not a [filter"),
        ] {
            let text = filtered(rust_log);
            assert!(text.contains("door's own"), "{rust_log:?}: {text}");
            assert!(!text.contains("SNI"), "{rust_log:?}: {text}");
            assert!(!text.contains("PING"), "{rust_log:?}: {text}");
        }
        for rust_log in ["info,rustls=warn", "rustls=debug,info", "rustls"] {
            let text = filtered(Some(rust_log));
            assert!(text.contains("SNI"), "{rust_log:?} names rustls: {text}");
            assert!(!text.contains("PING"), "{rust_log:?}: {text}");
        }
        let text = filtered(Some("info,h2=warn"));
        assert!(text.contains("PING"), "names h2: {text}");
    }

    #[test]
    fn journald_lines_name_the_spans() {
        let text = journald(|| {
            let span = tracing::info_span!("drain");
            let _g = span.enter();
            tracing::info!(target: "door", "waiting");
        });
        assert_eq!(text, "<6>door: drain: waiting\n");
    }

    #[test]
    fn multi_line_values_keep_their_priority_on_every_line() {
        let text = journald(|| {
            tracing::error!(target: "door", log = %"line one\nline two", "verifier refused");
        });
        assert_eq!(
            text,
            "<3>door: verifier refused log=line one\n<3>  line two\n"
        );
    }

    #[test]
    fn priorities_follow_syslog() {
        assert_eq!(syslog_priority(Level::ERROR), 3);
        assert_eq!(syslog_priority(Level::WARN), 4);
        assert_eq!(syslog_priority(Level::INFO), 6);
        assert_eq!(syslog_priority(Level::DEBUG), 7);
        assert_eq!(syslog_priority(Level::TRACE), 7);
    }

    #[test]
    fn journal_stream_is_matched_on_device_and_inode() {
        assert!(journal_stream_matches("8:1234", 8, 1234));
        assert!(journal_stream_matches("8:1234\n", 8, 1234));
        assert!(!journal_stream_matches("8:1235", 8, 1234));
        assert!(!journal_stream_matches("9:1234", 8, 1234));
        assert!(!journal_stream_matches("", 8, 1234));
        assert!(!journal_stream_matches("8", 8, 1234));
        assert!(!journal_stream_matches("x:y", 8, 1234));
    }

    #[test]
    fn warn_once_is_due_once() {
        let w = WarnOnce::new();
        assert!(w.first());
        assert!(!w.first());
        assert!(!w.first());
    }

    #[test]
    fn rate_limited_warn_logs_first_then_once_per_interval_with_the_count() {
        let w = RateLimitedWarn::new(Duration::from_mins(1));
        let t0 = crate::time::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(w.due_at(at(0)), Some(0), "the first occurrence logs");
        assert_eq!(w.due_at(at(1)), None);
        assert_eq!(w.due_at(at(30)), None);
        assert_eq!(w.due_at(at(59)), None);
        assert_eq!(
            w.due_at(at(60)),
            Some(3),
            "one line a minute, with the count"
        );
        assert_eq!(w.due_at(at(61)), None);
        assert_eq!(
            w.due_at(at(500)),
            Some(1),
            "after a quiet spell, at once again"
        );
        assert_eq!(w.due_at(at(499)), None, "time going backwards only counts");
        assert_eq!(w.interval(), Duration::from_mins(1));
    }

    #[test]
    fn rate_limited_warn_is_usable_as_a_static() {
        static W: RateLimitedWarn = RateLimitedWarn::new(Duration::from_hours(1));
        let now = crate::time::now();
        assert!(W.due_at(now).is_some());
        assert!(W.due_at(now).is_none());
    }
}
