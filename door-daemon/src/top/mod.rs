//! `door top`: a live terminal view of a running door, read only from its admin API
//! (`GET /status` and `GET /clients`), refreshed every second (docs/operations.md, "door top").
//!
//! Per group: the keys with the most rejections and spend (tokens left, spent, in flight,
//! rejections), outcome rates per second (the difference of the counts between two refreshes),
//! requests and streams in flight; the XDP shield's verdict rates and top prefixes. Keys: tab or
//! the arrows switch groups, `s` changes the sort, `q` (or Esc, Ctrl-C) quits. `--once` prints
//! one plain-text table of the same data (counts instead of rates) and exits, for scripts.
//!
//! [`client`] talks to the admin listener, [`model`] turns its JSON into the view's data and
//! keeps the previous sample for the rates, [`view`] draws it (ratatui) or prints it.

pub mod client;
pub mod model;
pub mod view;

use std::time::Duration;

use thiserror::Error;

pub use client::AdminAddr;
pub use model::{Snapshot, Sort, View};

use crate::time::{Clock as _, MonotonicClock};

/// How often the view refreshes.
pub const REFRESH: Duration = Duration::from_secs(1);

/// How often the live view looks whether a fetch under way has finished (while it waits for
/// keys).
const FETCH_POLL: Duration = Duration::from_millis(50);

/// How many keys per group `door top` asks for (`GET /clients?top=N`).
pub const TOP_KEYS: usize = 50;

/// Why `door top` could not show anything.
#[derive(Debug, Error)]
pub enum TopError {
    /// `--admin` is neither `host:port` nor `unix:/path`.
    #[error("--admin {0:?}: expected host:port (127.0.0.1:9901), http://host:port or unix:/path")]
    Address(String),
    /// Nothing accepts connections there.
    #[error("connecting to door's admin listener at {0}: {1}")]
    Connect(String, std::io::Error),
    /// The exchange broke off or timed out.
    #[error("GET {0}: {1}")]
    Http(String, String),
    /// The answer's body is larger than `door top` reads (the limit, bytes:
    /// [`client::MAX_BODY`]).
    #[error("GET {0}: the answer is over {mib} MiB, more than door top reads", mib = .1 >> 20)]
    TooLarge(String, usize),
    /// The admin listener answered something else than 200: the path, the status, and the start
    /// of the body ([`client::ERROR_BODY_CHARS`] characters, control characters escaped).
    #[error("GET {0}: status {1}: {2}")]
    Status(String, u16, String),
    /// The answer is not JSON.
    #[error("GET {0}: not JSON: {1}")]
    Json(String, serde_json::Error),
    /// The answer is JSON but not door's: no `groups` list (another server, or door's front
    /// passing the path to its application).
    #[error(
        "GET {0}: the answer has no \"groups\" list: {1} is not door's admin listener (admin_listen)"
    )]
    NotDoor(String, String),
    /// The terminal could not be set up, drawn on or read.
    #[error("terminal: {0}")]
    Terminal(#[from] std::io::Error),
}

/// Fetches one [`Snapshot`]: `/status`, then `/clients?top=`[`TOP_KEYS`].
///
/// # Errors
/// As [`client::get_json`]; [`TopError::NotDoor`] when an answer has no `groups` list, as every
/// answer of door's admin listener to these paths has.
pub async fn fetch(addr: &AdminAddr) -> Result<Snapshot, TopError> {
    let door_json = |path: &str, v: serde_json::Value| {
        if v.get("groups").is_some_and(serde_json::Value::is_array) {
            Ok(v)
        } else {
            Err(TopError::NotDoor(path.to_owned(), addr.to_string()))
        }
    };
    let status = door_json("/status", client::get_json(addr, "/status").await?)?;
    let path = format!("/clients?top={TOP_KEYS}");
    let clients = door_json(&path, client::get_json(addr, &path).await?)?;
    Ok(Snapshot::from_json(&status, &clients))
}

/// `door top --once`: one plain-text table of what `addr` shows now.
///
/// # Errors
/// As [`fetch`].
pub async fn once(addr: &AdminAddr) -> Result<String, TopError> {
    let mut view = View::new(addr.to_string());
    view.update(fetch(addr).await?, 0);
    Ok(view::plain(&view))
}

/// `door top`: the live view on this terminal until `q`. Blocking: call it outside async code
/// (it runs its own runtime, one worker thread, for the admin requests, which run beside the
/// terminal's loop: keys are read while a slow admin listener is being waited on).
///
/// # Errors
/// [`TopError::Terminal`] when the terminal cannot be used; a failing admin listener is shown
/// in the view, not returned.
pub fn live(addr: &AdminAddr) -> Result<(), TopError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let mut terminal = ratatui::try_init()?;
    let result = run_loop(&runtime, addr, &mut terminal);
    ratatui::restore();
    result
}

fn run_loop(
    runtime: &tokio::runtime::Runtime,
    addr: &AdminAddr,
    terminal: &mut ratatui::DefaultTerminal,
) -> Result<(), TopError> {
    use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

    let clock = MonotonicClock::new();
    let refresh_ns = u64::try_from(REFRESH.as_nanos()).unwrap_or(u64::MAX);
    let mut view = View::new(addr.to_string());
    let mut next = 0;
    // The fetch under way, on the runtime's worker: at most one at a time.
    let mut pending: Option<tokio::task::JoinHandle<Result<Snapshot, TopError>>> = None;
    loop {
        if pending.is_none() && clock.now_ns() >= next {
            let addr = addr.clone();
            pending = Some(runtime.spawn(async move { fetch(&addr).await }));
        }
        if let Some(done) = pending.take_if(|h| h.is_finished()) {
            let now = clock.now_ns();
            match runtime.block_on(done) {
                Ok(Ok(snapshot)) => view.update(snapshot, now),
                Ok(Err(e)) => view.failed(&e.to_string()),
                Err(e) => view.failed(&e.to_string()),
            }
            // A second after this answer: a slow admin listener is not asked back to back.
            next = now.saturating_add(refresh_ns);
        }
        terminal.draw(|frame| view::draw(frame, &view))?;
        let wait = if pending.is_some() {
            FETCH_POLL
        } else {
            Duration::from_nanos(next.saturating_sub(clock.now_ns()))
        };
        if !event::poll(wait)? {
            continue;
        }
        match event::read()? {
            Event::Key(key) if key.kind == KeyEventKind::Press => match key.code {
                KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => {
                    return Ok(());
                }
                KeyCode::Tab | KeyCode::Right | KeyCode::Down => view.next_group(),
                KeyCode::BackTab | KeyCode::Left | KeyCode::Up => view.previous_group(),
                KeyCode::Char('s') => view.next_sort(),
                _ => {}
            },
            // A resize or another event: redraw at once.
            _ => {}
        }
    }
}
