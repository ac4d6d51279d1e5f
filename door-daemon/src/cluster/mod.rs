//! Budget sharing between doors through Redis or Valkey (`[cluster]`, docs/design.md, "Cluster").
//!
//! The request path never waits for the network: every decision is the local
//! [`GroupLimiter`]'s. A background task ([`spawn`]) wakes every `sync_interval` and, in one Lua
//! script call per batch of at most [`BATCH`] clients (`EVALSHA`, loaded on `NOSCRIPT`):
//!
//! 1. refreshes this door's membership: a sorted set `door:alive` scored by the store's clock
//!    (µs), members older than 3 × `sync_interval` removed; its size is `N`, the doors alive;
//! 2. for each client a limited group or plane charged here since the last sync (drained with
//!    [`GroupLimiter::drain_spent`]), adds the tokens it spent here (less those refunded, which
//!    may make it a subtraction, never below the store's now) to the shared GCRA
//!    theoretical arrival time at `door:{GROUP}:{HEX KEY}`, computed with `redis.call('TIME')`
//!    (the store's clock, never a door's), stored with a `PEXPIRE` of the debt plus 2 × the
//!    bucket's full-refill window, and returns its deficit (`TAT − store now`, ≥ 0, ns);
//! 3. folds each deficit into the local row ([`GroupLimiter::fold_deficit`]): local
//!    `full_at = local now + max(local deficit, remote deficit)`. Only deficits (durations) cross
//!    the wire, so a door whose clock is off by any amount decides exactly as the others.
//!
//! The first call of a sync also carries the shared blocklist ([`blocks`]): the blocks this door
//! put on its shield since the last sync go up as lifetimes, the store prunes the expired ones
//! and answers the blocks changed since this door's cursor with the lifetime they have left,
//! which the door puts on its shield.
//!
//! The shared TAT is not capped at a full bucket: what the doors admitted together past the
//! budget between syncs is a debt that the client repays before any door admits it again, so the
//! cluster's long-run rate is the group's rate. The overshoot (docs/design.md, "Cluster") is at
//! most `(N − 1) × burst + N × rate × sync_interval` tokens over the single-door limit `burst +
//! rate × t`, in the worst case of every door meeting a client with a full local bucket at once.
//! The stored TAT is capped at `(N + 1) × (burst × interval + 3 × sync_interval)` past the
//! store's now before this door's spend is added: beyond any debt the overshoot can make, so a
//! TAT past it is no debt but a store clock that stepped back (an NTP step, a failover to a
//! replica whose clock is behind) or a value door did not write, which would otherwise lock the
//! client out on every door for as long as the step.
//!
//! When a sync fails, or one of its script calls takes longer than `timeout`, the door is
//! [`State::Degraded`]: every group is retuned to `rate / N` (N as seen at the last good sync, 1
//! if there was none), never unlimited and never a wait on the request path; the connection
//! manager reconnects with backoff, and the first good sync restores the configured rates
//! ([`State::Synced`]). Tokens
//! spent during a failed sync are not sent again.
//!
//! This module uses [`crate::limit`], [`crate::http::App`] (its limiters) and the `redis` crate;
//! the limiter knows nothing of it.

pub mod blocks;

use std::{
    fmt::Write as _,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use door_common::prefix::PrefixKey;
use opentelemetry::{
    KeyValue,
    metrics::{Counter, Histogram, Meter},
};
use redis::{
    Script,
    aio::{ConnectionManager, ConnectionManagerConfig},
};
use tokio::{task::JoinHandle, time::Instant};

pub use blocks::SharedBlocklist;

use crate::{config::ClusterConfig, http::App, limit::GroupLimiter, obs::logging::RateLimitedWarn};

/// Clients sent in one script call at most; a sync with more makes several calls.
pub const BATCH: usize = 1_000;

/// The sorted set of the doors alive (member: door id, score: the store's clock in µs).
pub const ALIVE_KEY: &str = "door:alive";

/// The sync script. `KEYS`: [`ALIVE_KEY`], [`blocks::BLOCKS_KEY`], [`blocks::BLOCKS_SEQ_KEY`],
/// [`blocks::BLOCKS_META_KEY`], then one per client. `ARGV[1]`: door id, `ARGV[2]`: membership
/// lifetime (ms), `ARGV[3]`: `1` when this call also handles blocks (the first call of a sync),
/// `ARGV[4]`, `ARGV[5]`: the door's block cursor (epoch, sequence number), `ARGV[6]`: `P`, the
/// blocks published, then `P` pairs (member, lifetime ms), then per client key: tokens spent here
/// (negative when refunds of tokens an earlier sync sent outnumber them), emission interval
/// (ns), burst (tokens). Returns `{N, {deficit_ns…}, {epoch, seq, member,
/// left_ms, …}}` (the last empty when `ARGV[3]` is not `1`). Times are µs in Lua's doubles (exact
/// to 0.25 µs at today's epoch), deficits ns, block deadlines ms.
const SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = now / 1000
local life = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - life * 1000)
redis.call('PEXPIRE', KEYS[1], life)
local doors = redis.call('ZCARD', KEYS[1])
local p = tonumber(ARGV[6])
local blocks = {}
if ARGV[3] == '1' then
  local epoch = redis.call('HGET', KEYS[4], 'epoch')
  local cursor = tonumber(ARGV[5])
  local seq = tonumber(redis.call('HGET', KEYS[4], 'seq')) or 0
  if not epoch or (ARGV[4] == epoch and cursor > seq) then
    epoch = t[1] .. '.' .. t[2]
    redis.call('HSET', KEYS[4], 'epoch', epoch)
  end
  while true do
    local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now_ms, 'LIMIT', 0, 1000)
    if #gone == 0 then break end
    redis.call('ZREM', KEYS[2], unpack(gone))
    redis.call('ZREM', KEYS[3], unpack(gone))
  end
  for j = 0, p - 1 do
    local m = ARGV[7 + 2 * j]
    local deadline = now_ms + tonumber(ARGV[8 + 2 * j])
    local cur = tonumber(redis.call('ZSCORE', KEYS[2], m))
    if not cur or deadline > cur then
      redis.call('ZADD', KEYS[2], deadline, m)
      redis.call('ZADD', KEYS[3], redis.call('HINCRBY', KEYS[4], 'seq', 1), m)
    end
  end
  seq = tonumber(redis.call('HGET', KEYS[4], 'seq')) or 0
  if ARGV[4] ~= epoch then cursor = 0 end
  local changed = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. string.format('%.0f', cursor),
    string.format('%.0f', seq), 'WITHSCORES', 'LIMIT', 0, 512)
  blocks = { epoch, '' }
  for j = 1, #changed, 2 do
    local m = changed[j]
    cursor = tonumber(changed[j + 1])
    local deadline = tonumber(redis.call('ZSCORE', KEYS[2], m))
    if deadline and deadline > now_ms then
      blocks[#blocks + 1] = m
      blocks[#blocks + 1] = string.format('%.0f', math.ceil(deadline - now_ms))
    end
  end
  blocks[2] = string.format('%.0f', cursor)
end
local deficits = {}
for i = 5, #KEYS do
  local a = 7 + 2 * p + (i - 5) * 3
  local n = tonumber(ARGV[a])
  local interval = tonumber(ARGV[a + 1]) / 1000
  local burst = tonumber(ARGV[a + 2])
  local stored = redis.call('GET', KEYS[i])
  local tat = tonumber(stored) or now
  if tat ~= tat or tat < now then tat = now end
  if n <= 0 and tat <= now then
    -- A refund of a debt the store no longer holds (gone, or repaid): nothing to give back,
    -- nothing to write.
    deficits[i - 4] = 0
  else
    local most = now + (doors + 1) * (burst * interval + life * 1000)
    if tat > most then tat = most end
    tat = tat + n * interval
    -- A refund (n < 0) gives back what this door added before, never more than the debt.
    if tat < now then tat = now end
    local window = math.ceil(burst * interval / 1000)
    local ttl = math.ceil((tat - now) / 1000) + 2 * window + 1
    redis.call('SET', KEYS[i], string.format('%.3f', tat), 'PX', ttl)
    deficits[i - 4] = math.floor((tat - now) * 1000)
  end
end
return { doors, deficits, blocks }
";

/// A failed sync.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The URL could not be used (`cluster.redis`).
    #[error("cluster.redis: {0}")]
    Url(#[source] redis::RedisError),
    /// The store answered with an error, or the connection failed.
    #[error("cluster store: {0}")]
    Store(#[from] redis::RedisError),
    /// `cluster.ca_file` could not be read.
    #[error("cluster.ca_file {path}: {source}")]
    CaFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// A script call of the sync took longer than `cluster.timeout`, or the whole sync longer
    /// than 3 × `sync_interval` (and `cluster.timeout`).
    #[error("cluster sync timed out after {0:?}")]
    Timeout(Duration),
    /// The script's answer was not what it returns.
    #[error("cluster store: unexpected answer ({0} values for {1} keys)")]
    Answer(usize, usize),
    /// The blocks part of the script's answer was not `{epoch, seq, member, left_ms, …}`.
    #[error("cluster store: unexpected answer for the blocklist ({0} values)")]
    BlockAnswer(usize),
    /// The sync panicked (a bug, door's or a crate's; the blocks it was publishing stay on this
    /// door's shield only).
    #[error("cluster sync panicked")]
    Panicked,
}

impl ClusterError {
    /// Whether the connection the sync used may be unusable after it: anything but an error
    /// reply of a store that answers (`READONLY` during a failover, `OOM`, an ACL's refusal),
    /// whose connection is healthy and is kept, so that a struggling store is not also asked
    /// for a new connection by every door at every sync.
    fn may_wedge(&self) -> bool {
        !matches!(self, Self::Store(_)) || self.is_transient()
    }

    /// Whether it may pass by itself (a timeout, the connection lost or refused), as opposed to
    /// an answer the store will give again (an error reply: a refused command, a wrong type).
    fn is_transient(&self) -> bool {
        match self {
            Self::Timeout(_) => true,
            Self::Store(e) => {
                e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
            }
            _ => false,
        }
    }
}

/// Where the cluster stands, for `/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// No `[cluster] redis`: every door's budgets are its own.
    Off,
    /// The last sync succeeded: local buckets reflect the cluster's.
    Synced,
    /// The last sync failed (or none succeeded yet): groups run at `rate / N`.
    Degraded,
}

impl State {
    /// `off`, `synced` or `degraded`.
    pub const fn as_str(self) -> &'static str {
        match self {
            State::Off => "off",
            State::Synced => "synced",
            State::Degraded => "degraded",
        }
    }
}

/// What `/status` shows of the cluster.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot {
    /// The state now.
    pub state: State,
    /// Doors alive at the last good sync (this one included); 1 before any.
    pub doors: u32,
    /// When the last good sync ended (tokio's clock); `None` before any.
    pub last_sync: Option<Instant>,
}

/// Clients the admin API forgot whose shared debts wait to be deleted from the store, at most;
/// more are not deleted (their debts fold back into the reset rows at the next sync).
pub const PENDING_FORGETS: usize = 1_024;

/// The cluster's state, shared by the sync task and `/status`, and the clients the admin API
/// forgot (`DELETE /clients/{prefix}`) whose shared debts the next sync deletes.
#[derive(Debug)]
pub struct ClusterStatus {
    inner: Mutex<Snapshot>,
    /// Store keys (`door:{GROUP}:HEX`) to delete at the next sync.
    forgotten: Mutex<Vec<String>>,
}

impl ClusterStatus {
    /// The status of a door without a cluster.
    pub fn off() -> Self {
        Self::with(State::Off)
    }

    fn with(state: State) -> Self {
        Self {
            inner: Mutex::new(Snapshot {
                state,
                doors: 1,
                last_sync: None,
            }),
            forgotten: Mutex::new(Vec::new()),
        }
    }

    /// Deletes client `key`'s shared debt in `group` from the store at the next sync, after the
    /// admin API reset its row here: otherwise the sync would fold the debt straight back into
    /// the row. Nothing without a cluster; past [`PENDING_FORGETS`] waiting, nothing either
    /// (logged at most once a minute).
    pub fn forget(&self, group: &str, key: &PrefixKey) {
        if self.snapshot().state == State::Off {
            return;
        }
        let mut q = self
            .forgotten
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if q.len() < PENDING_FORGETS {
            q.push(store_key(group, key));
        } else {
            static FULL: RateLimitedWarn = RateLimitedWarn::new(Duration::from_mins(1));
            if let Some(suppressed) = FULL.due() {
                tracing::warn!(%key, group, suppressed, "cluster: too many forgotten clients wait for the next sync; this one's shared debt stays (at most one line a minute)");
            }
        }
    }

    /// The store keys to delete, taken.
    fn take_forgotten(&self) -> Vec<String> {
        std::mem::take(
            &mut *self
                .forgotten
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// Puts keys a failed sync could not delete back, within the bound.
    fn requeue_forgotten(&self, keys: Vec<String>) {
        let mut q = self
            .forgotten
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let room = PENDING_FORGETS.saturating_sub(q.len());
        q.extend(keys.into_iter().take(room));
    }

    /// The state now.
    pub fn snapshot(&self) -> Snapshot {
        *self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, f: impl FnOnce(&mut Snapshot)) {
        f(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// The `/status` object: `{"state", "doors", "last_sync_age_ms"}` (the age `null` before any
    /// good sync).
    pub fn json(&self) -> serde_json::Value {
        let s = self.snapshot();
        let age = s.last_sync.map(|t| {
            u64::try_from(crate::time::now().saturating_duration_since(t).as_millis())
                .unwrap_or(u64::MAX)
        });
        serde_json::json!({ "state": s.state.as_str(), "doors": s.doors, "last_sync_age_ms": age })
    }
}

/// The bucket bounds of `door.cluster.sync_duration`, seconds: from half a millisecond (a sync on
/// loopback) to 2.5 s (past any `cluster.timeout` worth setting; longer ones count in `+Inf`). The SDK's default bounds
/// (0 to 10,000) are meant for milliseconds: in seconds every sync fell into the first bucket.
pub const SYNC_DURATION_BOUNDS_S: [f64; 12] = [
    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// The cluster's instruments: `door.cluster.syncs`, `door.cluster.errors` (counters) and
/// `door.cluster.sync_duration` (histogram, seconds, bounds [`SYNC_DURATION_BOUNDS_S`]).
#[derive(Debug, Clone)]
pub struct ClusterMetrics {
    syncs: Counter<u64>,
    errors: Counter<u64>,
    duration: Histogram<f64>,
}

impl ClusterMetrics {
    /// Builds the instruments from `meter`.
    pub fn new(meter: &Meter) -> Self {
        Self {
            syncs: meter
                .u64_counter("door.cluster.syncs")
                .with_unit("{sync}")
                .with_description("Good syncs with the cluster store")
                .build(),
            errors: meter
                .u64_counter("door.cluster.errors")
                .with_unit("{sync}")
                .with_description("Failed or timed-out syncs with the cluster store")
                .build(),
            duration: meter
                .f64_histogram("door.cluster.sync_duration")
                .with_unit("s")
                .with_description("Time one sync with the cluster store took")
                .with_boundaries(SYNC_DURATION_BOUNDS_S.to_vec())
                .build(),
        }
    }
}

/// A running sync task.
#[derive(Debug)]
pub struct Cluster {
    status: Arc<ClusterStatus>,
    task: JoinHandle<()>,
}

impl Cluster {
    /// The state, for `/status`.
    pub fn status(&self) -> Arc<ClusterStatus> {
        Arc::clone(&self.status)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A door id unique among the doors of one store: host name, process id and 32 random bits.
pub fn door_id() -> String {
    use ring::rand::SecureRandom as _;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "door".to_owned(), |h| h.trim().to_owned());
    let mut r = [0u8; 4];
    // Without randomness the host and process id still tell doors apart.
    let _ = ring::rand::SystemRandom::new().fill(&mut r);
    format!(
        "{host}-{}-{:08x}",
        std::process::id(),
        u32::from_be_bytes(r)
    )
}

/// The Redis client of `[cluster]` `config` (its `redis` set; none is the empty URL, refused):
/// the URL parsed and `cluster.ca_file` read, nothing connected. [`spawn`] uses it, and
/// `door check-config` calls it so that a file start would fail on fails the check too.
///
/// # Errors
///
/// [`ClusterError::Url`] when the URL cannot be used or `cluster.ca_file` holds no usable PEM
/// certificate; [`ClusterError::CaFile`] when that file cannot be read.
pub fn client(config: &ClusterConfig) -> Result<redis::Client, ClusterError> {
    let url = config.redis.as_deref().unwrap_or_default();
    let url = redis::IntoConnectionInfo::into_connection_info(url).map_err(ClusterError::Url)?;
    // No `CLIENT SETINFO` after connecting (redis-rs sends it by default): the store's ACL for
    // door then lists only the commands door uses (docs/operations.md, "Trust"), where Redis 7.0
    // refuses `+client|setinfo` in an ACL and 7.2 logs each refused call.
    let settings = url.redis_settings().clone().set_skip_set_lib_name();
    let url = url.set_redis_settings(settings);
    let client = match &config.ca_file {
        // A `rediss://` store whose certificate chains to these CAs rather than the system's.
        Some(path) => {
            let pem =
                crate::http::tls::read_pem_file(path).map_err(|source| ClusterError::CaFile {
                    path: path.clone(),
                    source,
                })?;
            redis::Client::build_with_tls(
                url,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem),
                },
            )
            .map_err(ClusterError::Url)?
        }
        None => redis::Client::open(url).map_err(ClusterError::Url)?,
    };
    Ok(client)
}

/// Starts the sync task for `app`'s groups and planes with `[cluster]` `config` (its `redis`
/// set), as door `id`. With `blocks` (the door has a shield), the task also publishes the blocks
/// queued on it and puts the other doors' blocks on it ([`blocks`]). The connection is made
/// lazily: a store unreachable at start leaves the door [`State::Degraded`] until it answers.
///
/// # Errors
///
/// [`ClusterError::Url`] when the URL cannot be used (the configuration checked its scheme) or
/// `cluster.ca_file` holds no usable PEM certificate; [`ClusterError::CaFile`] when that file
/// cannot be read.
pub fn spawn(
    config: &ClusterConfig,
    app: Arc<App>,
    blocks: Option<Arc<SharedBlocklist>>,
    metrics: ClusterMetrics,
    id: String,
) -> Result<Cluster, ClusterError> {
    let client = client(config)?;
    let manager_config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.timeout))
        .set_response_timeout(Some(config.timeout))
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_secs(2));
    let manager = ConnectionManager::new_lazy_with_config(client.clone(), manager_config.clone())
        .map_err(ClusterError::Url)?;
    let status = Arc::new(ClusterStatus::with(State::Degraded));
    let mut syncer = Syncer {
        app,
        conn: manager,
        client,
        manager_config,
        warned: false,
        script: Script::new(SCRIPT),
        id,
        interval: config.sync_interval,
        timeout: config.timeout,
        status: Arc::clone(&status),
        metrics,
        spent: Vec::new(),
        blocks,
        cursor: blocks::Cursor::default(),
    };
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(syncer.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // A panic inside a sync (door's or the redis crate's: a debug assertion of its
            // script loading trips on a store that answers with a wrong hash) must not end the
            // task with `/status` still saying `synced` and the rates never divided again
            // (found by hostile testing): the sync counts as failed, and the next one comes.
            let outcome =
                futures_util::FutureExt::catch_unwind(core::panic::AssertUnwindSafe(syncer.sync()))
                    .await;
            if outcome.is_err() {
                tracing::error!(
                    "cluster: a sync panicked; counted as failed, the next one follows"
                );
                let limiters = syncer.app.limiters();
                syncer.failed(&ClusterError::Panicked, &limiters, Vec::new());
            }
        }
    });
    Ok(Cluster { status, task })
}

/// One client's spend in a batch: which limiter, which key.
type Entry = (usize, PrefixKey);

/// The sync task's state.
struct Syncer {
    app: Arc<App>,
    conn: ConnectionManager,
    /// The store's client and the connection's settings, for a new connection after a failed
    /// sync ([`Syncer::reconnect`]).
    client: redis::Client,
    manager_config: ConnectionManagerConfig,
    /// Whether the failure of the syncs since the last good one (or since the start) was
    /// logged: once per run of failures, whether or not the door was ever synced.
    warned: bool,
    script: Script,
    id: String,
    interval: Duration,
    timeout: Duration,
    status: Arc<ClusterStatus>,
    metrics: ClusterMetrics,
    spent: Vec<(PrefixKey, i32)>,
    /// The door's shared blocklist, when it has a shield.
    blocks: Option<Arc<SharedBlocklist>>,
    /// The last block change fetched from the store.
    cursor: blocks::Cursor,
}

/// What one sync's script calls answered.
struct Answer {
    doors: u32,
    deficits: Vec<u64>,
    fetched: Option<blocks::Fetched>,
}

impl Syncer {
    async fn sync(&mut self) {
        let started = crate::time::now();
        let limiters = self.app.limiters();
        let mut keys = Vec::new();
        let mut args: Vec<i64> = Vec::new();
        let mut entries: Vec<Entry> = Vec::new();
        for (i, l) in limiters.iter().enumerate() {
            let budget = l.configured_budget();
            l.record_spent(budget.max_clients);
            let dropped = l.drain_spent(&mut self.spent);
            if dropped > 0 {
                tracing::warn!(
                    group = l.group(),
                    dropped,
                    "cluster: clients charged since the last sync were more than the record holds; the oldest were not shared"
                );
            }
            for &(key, n) in &self.spent {
                keys.push(store_key(l.group(), &key));
                args.extend([
                    i64::from(n),
                    i64::try_from(budget.interval_ns()).unwrap_or(i64::MAX),
                    i64::from(budget.burst),
                ]);
                entries.push((i, key));
            }
        }
        let (published, dropped) = self.blocks.as_ref().map(|b| b.take()).unwrap_or_default();
        if dropped > 0 {
            tracing::warn!(
                dropped,
                "cluster: more blocks were waiting to be published than the queue holds; the newest were not shared"
            );
        }
        // The debts of clients the admin API forgot go first, so that this sync's answers do
        // not fold them back. A store that refuses the DEL (an ACL without it) must not keep
        // every sync failing: those keys are given up, logged; a store out of reach fails the
        // script call below too, and they wait for the next sync.
        let forgotten = self.status.take_forgotten();
        if let Err(e) = self.delete(&forgotten).await {
            if e.is_transient() {
                self.status.requeue_forgotten(forgotten);
            } else {
                static REFUSED: RateLimitedWarn = RateLimitedWarn::new(Duration::from_mins(1));
                if let Some(suppressed) = REFUSED.due() {
                    tracing::warn!(error = %e, keys = forgotten.len(), suppressed, "cluster: the store refused to delete forgotten clients' shared debts; they fold back into the reset rows (at most one line a minute)");
                }
            }
        }
        // At most the membership's lifetime: a door that has not synced for 3 × sync_interval
        // drops out of the doors alive.
        let whole = self.interval.saturating_mul(3).max(self.timeout);
        let outcome = tokio::time::timeout(whole, self.send(&keys, &args, &published))
            .await
            .unwrap_or(Err(ClusterError::Timeout(whole)));
        let took = started.elapsed().as_secs_f64();
        match outcome {
            Ok(Answer {
                doors,
                deficits,
                fetched,
            }) => {
                if let (Some(b), Some(f)) = (&self.blocks, fetched) {
                    for &(key, left_ms) in &f.blocks {
                        b.apply(key, Duration::from_millis(left_ms));
                    }
                    self.cursor = f.cursor;
                }
                // A client the admin API forgot while this sync was under way keeps its reset
                // row (fold_deficit skips it): its debt is deleted by the next sync.
                for (&(i, key), &d) in entries.iter().zip(&deficits) {
                    if d > 0
                        && let Some(l) = limiters.get(i)
                    {
                        l.fold_deficit(&key, d);
                    }
                }
                Self::restore(&limiters);
                let doors = doors.max(1);
                if self.warned {
                    tracing::info!(
                        doors,
                        "cluster: the store answers again; the configured rates apply"
                    );
                }
                self.warned = false;
                self.status.set(|s| {
                    s.state = State::Synced;
                    s.doors = doors;
                    s.last_sync = Some(crate::time::now());
                });
                self.metrics.syncs.add(1, &[]);
                self.metrics.duration.record(took, &[]);
            }
            Err(e) => self.failed(&e, &limiters, published),
        }
    }

    /// After a failed sync: the blocks it was to publish wait for the next one, the door turns
    /// degraded (every group at `rate / doors`, [`Syncer::divide`]), the failure is counted and,
    /// the first of a run, logged, and the connection is replaced when the failure may have
    /// wedged it ([`ClusterError::may_wedge`], [`Syncer::reconnect`]).
    fn failed(
        &mut self,
        e: &ClusterError,
        limiters: &[Arc<GroupLimiter>],
        published: Vec<blocks::Pending>,
    ) {
        if let Some(b) = &self.blocks {
            b.requeue(published);
        }
        let was = self.status.snapshot();
        if !self.warned {
            // Also when the door never synced: a store out of reach from the start (a wrong
            // `cluster.redis`) must not only show on `/status` (found by hostile testing).
            tracing::warn!(error = %e, doors = was.doors, "cluster: sync failed; enforcing rate / doors until the store answers");
            self.warned = true;
        }
        self.status.set(|s| s.state = State::Degraded);
        Self::divide(limiters, was.doors);
        self.metrics.errors.add(
            1,
            &[KeyValue::new(crate::obs::metrics::ATTR_REASON, reason(e))],
        );
        if e.may_wedge() {
            self.reconnect();
        }
    }

    /// Drops the store connection for a new one, opened by the next sync: after a failed sync
    /// ([`ClusterError::may_wedge`]) the connection may be wedged (a reply that never came, which door's own timeout gave up
    /// on, so that the connection manager saw no error and would go on writing to it; a path
    /// whose NAT or firewall state was lost; a reply that left the connection out of step), and
    /// the next sync must not wait on it (found by hostile testing: one silent connection kept a
    /// door degraded with the store healthy). At most one new connection per sync interval.
    fn reconnect(&mut self) {
        match ConnectionManager::new_lazy_with_config(
            self.client.clone(),
            self.manager_config.clone(),
        ) {
            Ok(fresh) => self.conn = fresh,
            // The URL was accepted at start; kept as it was if the client now refuses it.
            Err(e) => tracing::debug!(error = %e, "cluster: no new store connection"),
        }
    }

    /// Deletes the store keys `keys` (one `DEL`, within the timeout); nothing to do for none.
    async fn delete(&mut self, keys: &[String]) -> Result<(), ClusterError> {
        if keys.is_empty() {
            return Ok(());
        }
        let mut del = redis::cmd("DEL");
        del.arg(keys);
        tokio::time::timeout(self.timeout, del.query_async::<()>(&mut self.conn))
            .await
            .map_err(|_| ClusterError::Timeout(self.timeout))??;
        Ok(())
    }

    /// The script calls for `keys` (in batches of [`BATCH`]), the first also publishing
    /// `published` and fetching the block changes past the cursor: the doors alive, each key's
    /// deficit (ns), in order, and the blocks fetched. Fails when a call fails or takes longer
    /// than `cluster.timeout`.
    async fn send(
        &mut self,
        keys: &[String],
        args: &[i64],
        published: &[blocks::Pending],
    ) -> Result<Answer, ClusterError> {
        let life_ms = u64::try_from(self.interval.saturating_mul(3).as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut doors = 1;
        let mut deficits = Vec::with_capacity(keys.len());
        let mut fetched = None;
        // An empty sync still refreshes membership and the blocks.
        let batches: Vec<(&[String], &[i64])> = if keys.is_empty() {
            vec![(&[], &[])]
        } else {
            keys.chunks(BATCH).zip(args.chunks(BATCH * 3)).collect()
        };
        let with_blocks = self.blocks.is_some();
        for (n, (ks, a)) in batches.into_iter().enumerate() {
            let first = n == 0 && with_blocks;
            let mut call = self.script.key(ALIVE_KEY);
            call.key(blocks::BLOCKS_KEY)
                .key(blocks::BLOCKS_SEQ_KEY)
                .key(blocks::BLOCKS_META_KEY);
            call.arg(&self.id)
                .arg(life_ms)
                .arg(if first { "1" } else { "0" })
                .arg(&self.cursor.epoch)
                .arg(self.cursor.seq);
            if first {
                call.arg(published.len());
                for p in published {
                    let ms = u64::try_from(p.lifetime.as_millis())
                        .unwrap_or(u64::MAX)
                        .max(1);
                    call.arg(blocks::member(&p.key)).arg(ms);
                }
            } else {
                call.arg(0);
            }
            for k in ks {
                call.key(k);
            }
            for v in a {
                call.arg(*v);
            }
            // Each call within the timeout: a sync of many clients makes many calls, each a few
            // milliseconds of the store's time per 1,000 clients.
            let (n_alive, ds, bs): (i64, Vec<i64>, Vec<String>) =
                tokio::time::timeout(self.timeout, call.invoke_async(&mut self.conn))
                    .await
                    .map_err(|_| ClusterError::Timeout(self.timeout))??;
            if ds.len() != ks.len() {
                return Err(ClusterError::Answer(ds.len(), ks.len()));
            }
            if first {
                fetched =
                    Some(blocks::parse_fetched(&bs).ok_or(ClusterError::BlockAnswer(bs.len()))?);
            }
            doors = u32::try_from(n_alive).unwrap_or(1);
            deficits.extend(ds.into_iter().map(|d| u64::try_from(d).unwrap_or(0)));
        }
        Ok(Answer {
            doors,
            deficits,
            fetched,
        })
    }

    /// Runs every group at `rate / doors` ([`GroupLimiter::divide_rate`]: a reload meanwhile
    /// keeps the division, and a restore keeps the reload's budget).
    fn divide(limiters: &[Arc<GroupLimiter>], doors: u32) {
        for l in limiters {
            l.divide_rate(doors.max(1));
        }
    }

    /// Gives every group its configured rate back.
    fn restore(limiters: &[Arc<GroupLimiter>]) {
        for l in limiters {
            l.divide_rate(1);
        }
    }
}

/// `door:{GROUP}:HEX`: the group as a hash tag (one cluster slot per group), the key's 16 bytes.
fn store_key(group: &str, key: &PrefixKey) -> String {
    let mut s = String::with_capacity(group.len() + 40);
    let _ = write!(s, "door:{{{group}}}:");
    for b in key.addr {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// `door.reason` of a failed sync: `timeout`, `store` or `answer`.
fn reason(e: &ClusterError) -> &'static str {
    match e {
        ClusterError::Timeout(_) => "timeout",
        ClusterError::Answer(..) | ClusterError::BlockAnswer(_) | ClusterError::Panicked => {
            "answer"
        }
        ClusterError::Url(_) | ClusterError::Store(_) | ClusterError::CaFile { .. } => "store",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_keys_tag_the_group_and_spell_the_key() {
        let mut key = PrefixKey::default();
        key.addr[15] = 0xab;
        assert_eq!(
            store_key("webhook", &key),
            "door:{webhook}:000000000000000000000000000000ab"
        );
    }

    /// A sync's time is told apart at the scale syncs take (a fraction of a millisecond on
    /// loopback, up to the store's timeout), not all counted in the first bucket.
    #[test]
    fn sync_durations_are_bucketed_in_seconds() {
        let exposition = crate::obs::prometheus::Exposition::new();
        let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
            .with_reader(exposition.reader())
            .build();
        let metrics = ClusterMetrics::new(&opentelemetry::metrics::MeterProvider::meter(
            &provider, "door",
        ));
        for took in [0.000_4, 0.003, 0.08] {
            metrics.duration.record(took, &[]);
        }
        let text = exposition.render().unwrap_or_default();
        for line in [
            "door_cluster_sync_duration_seconds_bucket{le=\"0.0005\"} 1\n",
            "door_cluster_sync_duration_seconds_bucket{le=\"0.005\"} 2\n",
            "door_cluster_sync_duration_seconds_bucket{le=\"0.05\"} 2\n",
            "door_cluster_sync_duration_seconds_bucket{le=\"0.1\"} 3\n",
        ] {
            assert!(text.contains(line), "no {line:?} in:\n{text}");
        }
    }

    #[test]
    fn the_script_fetches_at_most_fetch_blocks() {
        assert!(SCRIPT.contains(&format!("'LIMIT', 0, {})", blocks::FETCH_BLOCKS)));
    }
}
