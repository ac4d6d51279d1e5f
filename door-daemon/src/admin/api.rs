//! The admin API's operator endpoints (docs/operations.md, "Admin API"): the clients a group
//! tracks (`GET /clients`), forgetting one (`DELETE /clients/{prefix}`), and the XDP blocklist
//! (`GET /blocks`, `POST /blocks`, `DELETE /blocks/{prefix}`). JSON in and out; every bad input is
//! a 4xx naming it.

use std::{
    net::IpAddr,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use bytes::Bytes;
use door_common::PrefixKey;
use http::StatusCode;
use http_body::Body as _;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::{Value, json};

use super::StatusSource;
use crate::{
    cluster::SharedBlocklist,
    limit::{CREDENTIAL_KEY_PREFIX, GroupLimiter, KeyKind, RowSnapshot},
    shield::{Shield, ShieldError},
};

/// `top` of `GET /clients` when not given.
pub const DEFAULT_TOP: usize = 10;
/// The largest `top` of `GET /clients`.
pub const MAX_TOP: usize = 1_000;
/// The longest block `POST /blocks` accepts, in seconds (7 days).
pub const MAX_BLOCK_S: u64 = 7 * 86_400;
/// The largest request body the admin API reads, in bytes.
pub const MAX_BODY: usize = 4_096;

/// An answer that is not a success: the status and a JSON body `{"code", "message"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status (4xx for bad input, 503 without the shield, 500 for a map error).
    pub status: StatusCode,
    /// A stable, machine-readable code (`bad-prefix`, `unknown-group`, …).
    pub code: &'static str,
    /// What was wrong, naming the input.
    pub message: String,
}

impl ApiError {
    pub(super) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    fn bad(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        json!({ "code": self.code, "message": self.message })
    }
}

/// The XDP blocklist as the admin API edits it: the loaded [`Shield`] in production (behind its
/// mutex), an in-memory list in tests.
pub trait AdminBlocklist: Send + Sync + 'static {
    /// The prefixes blocked now and the whole seconds (rounded up) each has left; expired
    /// entries left out.
    ///
    /// # Errors
    /// [`ShieldError::Map`] if the blocklist cannot be read.
    fn list(&self) -> Result<Vec<(PrefixKey, u64)>, ShieldError>;
    /// Blocks `key` for `duration` from now (replacing its deadline if it was blocked).
    ///
    /// # Errors
    /// [`ShieldError::Map`] if the blocklist cannot be written.
    fn block(&self, key: PrefixKey, duration: Duration) -> Result<(), ShieldError>;
    /// Takes `key` off the blocklist; whether it was on it.
    ///
    /// # Errors
    /// [`ShieldError::Map`] if the blocklist cannot be written.
    fn unblock(&self, key: &PrefixKey) -> Result<bool, ShieldError>;
    /// Whether `key` is exempt from the shield (never shed, so never blocked either:
    /// [`Shield::exempt`]); `false` by default.
    ///
    /// # Errors
    /// [`ShieldError::Map`] if the exempt lists cannot be read.
    fn exempt(&self, _key: &PrefixKey) -> Result<bool, ShieldError> {
        Ok(false)
    }
}

/// The admin blocklist in cluster mode: `POST /blocks` puts the block on this door's shield and
/// publishes it to every door of the cluster ([`SharedBlocklist::publish`]), which apply it within
/// a sync interval with the lifetime it has left. Listing and `DELETE /blocks/{prefix}` are this
/// door's shield only: an unblock is not shared (the other doors keep the block until its
/// deadline; docs/operations.md, "Cluster").
pub struct ClusterBlocklist {
    /// This door's blocklist (its shield in production).
    pub local: Arc<dyn AdminBlocklist>,
    /// The cluster's shared blocklist.
    pub shared: Arc<SharedBlocklist>,
}

impl AdminBlocklist for ClusterBlocklist {
    fn list(&self) -> Result<Vec<(PrefixKey, u64)>, ShieldError> {
        self.local.list()
    }

    /// Blocks on this door first; published to the cluster only once that succeeded.
    fn block(&self, key: PrefixKey, duration: Duration) -> Result<(), ShieldError> {
        self.local.block(key, duration)?;
        self.shared.publish(key, duration);
        Ok(())
    }

    fn unblock(&self, key: &PrefixKey) -> Result<bool, ShieldError> {
        self.local.unblock(key)
    }

    fn exempt(&self, key: &PrefixKey) -> Result<bool, ShieldError> {
        self.local.exempt(key)
    }
}

impl AdminBlocklist for Mutex<Shield> {
    fn list(&self) -> Result<Vec<(PrefixKey, u64)>, ShieldError> {
        let list = self
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .blocked()?;
        let now = crate::time::kernel_monotonic_ns();
        Ok(list
            .into_iter()
            .filter(|(_, deadline)| *deadline > now)
            .map(|(k, deadline)| (k, (deadline - now).div_ceil(1_000_000_000)))
            .collect())
    }

    fn block(&self, key: PrefixKey, duration: Duration) -> Result<(), ShieldError> {
        self.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .block(key, duration)
    }

    fn exempt(&self, key: &PrefixKey) -> Result<bool, ShieldError> {
        self.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .exempt(key)
    }

    fn unblock(&self, key: &PrefixKey) -> Result<bool, ShieldError> {
        self.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .unblock(key)
    }
}

/// The client key a path segment or JSON field names: an address (keyed as door keys clients:
/// IPv4 /32, IPv6 /64, NAT64 and IPv4-mapped addresses as their IPv4 /32), or a key written as a
/// prefix of exactly that length (`198.51.100.7/32`, `2001:db8:1:2::/64`).
///
/// # Errors
/// [`ApiError`] `bad-prefix` (400) naming the input.
pub fn parse_prefix(raw: &str) -> Result<PrefixKey, ApiError> {
    let bad = |why: &str| {
        ApiError::bad(
            "bad-prefix",
            format!("{raw:?} is not a client key: {why} (door keys IPv4 by /32 and IPv6 by /64)"),
        )
    };
    if raw.is_empty() {
        return Err(bad("it is empty"));
    }
    let (addr, len) = match raw.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (raw, None),
    };
    let ip: IpAddr = addr
        .parse()
        .map_err(|_| bad("not an IPv4 or IPv6 address"))?;
    let key = PrefixKey::from_ip(ip);
    if let Some(len) = len {
        if ip.is_ipv6() && key.network().is_ipv4() {
            return Err(bad(&format!(
                "an IPv4-mapped or NAT64 address is keyed as its IPv4 address; write {key} or \
                 the bare address"
            )));
        }
        // Decimal digits without a sign or a leading zero, as CIDR notation writes them (RFC 4632).
        if len.is_empty()
            || !len.bytes().all(|b| b.is_ascii_digit())
            || len.len() > 3
            || (len.len() > 1 && len.starts_with('0'))
        {
            return Err(bad("the prefix length is not a number"));
        }
        let len: u8 = len
            .parse()
            .map_err(|_| bad("the prefix length is not a number"))?;
        if len != key.prefix_len() {
            return Err(bad(&format!(
                "a /{len} is not a key; write /{} or a bare address",
                key.prefix_len()
            )));
        }
        if key.network() != ip {
            return Err(bad(&format!("host bits are set; the key is {key}")));
        }
    }
    Ok(key)
}

/// The query parameters of `query` (percent-decoded), refusing one that is not UTF-8 once
/// decoded (named as sent: decoded, it would read as U+FFFD), any not in `allowed` and any given
/// twice (which one would count is anyone's guess).
fn params(query: Option<&str>, allowed: &[&str]) -> Result<Vec<(String, String)>, ApiError> {
    let not_utf8 = query.unwrap_or("").split('&').find(|pair| {
        let decoded: Vec<u8> = percent_encoding::percent_decode_str(pair).collect();
        core::str::from_utf8(&decoded).is_err()
    });
    if let Some(pair) = not_utf8 {
        return Err(ApiError::bad(
            "bad-parameter",
            format!("query parameter {pair:?} is not UTF-8 once percent-decoded"),
        ));
    }
    let pairs: Vec<(String, String)> = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    for (i, (k, _)) in pairs.iter().enumerate() {
        // The pairs before `k` are known and distinct: at most `allowed.len()` to look through.
        if pairs.iter().take(i).any(|(seen, _)| seen == k) {
            return Err(ApiError::bad(
                "repeated-parameter",
                format!("query parameter {k:?} is given more than once"),
            ));
        }
        if !allowed.contains(&k.as_str()) {
            return Err(ApiError::bad(
                "unknown-parameter",
                format!(
                    "unknown query parameter {k:?} (this endpoint takes {})",
                    if allowed.is_empty() {
                        "none".to_owned()
                    } else {
                        allowed.join(", ")
                    }
                ),
            ));
        }
    }
    Ok(pairs)
}

fn param<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The limiters `group` names (all of them when `None`).
fn select_groups(
    limiters: Vec<Arc<GroupLimiter>>,
    group: Option<&str>,
) -> Result<Vec<Arc<GroupLimiter>>, ApiError> {
    let Some(group) = group else {
        return Ok(limiters);
    };
    let names: Vec<String> = limiters.iter().map(|l| l.group().to_owned()).collect();
    let chosen: Vec<_> = limiters
        .into_iter()
        .filter(|l| l.group() == group)
        .collect();
    if chosen.is_empty() {
        return Err(ApiError::bad(
            "unknown-group",
            format!("unknown group {group:?} (groups: {})", names.join(", ")),
        ));
    }
    Ok(chosen)
}

fn row_json(r: &RowSnapshot) -> Value {
    json!({
        "tokens": r.tokens,
        "spent": r.spent,
        "inflight": r.inflight,
        "rejections": r.rejections,
    })
}

/// `GET /status`: the status document ([`StatusSource::snapshot`]). It takes no query
/// parameters, so that `?group=link` is refused instead of answered with every group.
///
/// # Errors
/// 400 for any query parameter.
pub fn status(source: &StatusSource, query: Option<&str>) -> Result<Value, ApiError> {
    params(query, &[])?;
    Ok(source.snapshot())
}

/// `GET /clients?group=G&top=N`: per group (or only `G`), its `N` clients with the most
/// rejections, then the most tokens spent, and its shared row.
///
/// # Errors
/// 400 for an unknown parameter or group, or a `top` outside 1..=[`MAX_TOP`].
pub fn clients(source: &StatusSource, query: Option<&str>) -> Result<Value, ApiError> {
    let pairs = params(query, &["group", "top"])?;
    let top = match param(&pairs, "top") {
        None => DEFAULT_TOP,
        // Digits only: `parse` would also take a sign (`+5`).
        Some(raw) => Some(raw)
            .filter(|r| r.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|r| r.parse::<usize>().ok())
            .filter(|n| (1..=MAX_TOP).contains(n))
            .ok_or_else(|| {
                ApiError::bad(
                    "bad-top",
                    format!("top = {raw:?}: must be a whole number from 1 to {MAX_TOP}"),
                )
            })?,
    };
    let groups = select_groups((source.limiters)(), param(&pairs, "group"))?;
    let groups: Vec<Value> = groups
        .iter()
        .map(|l| {
            let b = l.budget();
            let clients: Vec<Value> = l
                .top(top)
                .iter()
                .map(|(k, r)| {
                    let mut v = row_json(r);
                    if let Some(o) = v.as_object_mut() {
                        o.insert("key".to_owned(), json!(l.key_kind().text(k)));
                    }
                    v
                })
                .collect();
            json!({
                "group": l.group(),
                "burst": b.burst,
                "per_client": b.per_client,
                "inflight_cap": b.inflight,
                "max_clients": b.max_clients,
                "tracked_clients": l.tracked_clients(),
                "inflight": l.inflight(),
                "clients": clients,
                "shared": row_json(&l.shared_row()),
            })
        })
        .collect();
    Ok(json!({ "groups": groups }))
}

/// `DELETE /clients/{key}[?group=G]`: forgets the key in every group (or only `G`) whose keys are
/// of its kind: a client key ([`parse_prefix`]) in the groups and the IP plane, a credential key
/// (`credential:` and 32 hex digits, as `GET /clients` writes the session plane's) in the session
/// plane.
///
/// # Errors
/// 400 for a bad key, an unknown parameter or group, or a group `G` whose keys are of the other
/// kind; 404 when no selected group tracks the key.
pub fn forget(source: &StatusSource, raw: &str, query: Option<&str>) -> Result<Value, ApiError> {
    let pairs = params(query, &["group"])?;
    let (kind, key) = match KeyKind::parse_credential(raw) {
        Some(key) => (KeyKind::Credential, key),
        None if raw.starts_with(CREDENTIAL_KEY_PREFIX) => {
            return Err(ApiError::bad(
                "bad-prefix",
                format!(
                    "{raw:?} is not a credential key: {CREDENTIAL_KEY_PREFIX} takes exactly 32 \
                     hex digits, as GET /clients writes them"
                ),
            ));
        }
        None => (KeyKind::Client, parse_prefix(raw)?),
    };
    let group = param(&pairs, "group");
    let groups = select_groups((source.limiters)(), group)?;
    if let (Some(g), Some(l)) = (group, groups.first())
        && l.key_kind() != kind
    {
        return Err(ApiError::bad(
            "bad-prefix",
            format!(
                "group {g:?} keys {}, and {raw:?} is {}",
                describe(l.key_kind()),
                describe(kind)
            ),
        ));
    }
    let text = kind.text(&key);
    let forgotten: Vec<&str> = groups
        .iter()
        .filter(|l| l.key_kind() == kind && l.forget(&key))
        .map(|l| l.group())
        .collect();
    for group in &forgotten {
        // Its debt shared through the cluster, if any, is deleted at the next sync.
        source.cluster.forget(group, &key);
    }
    if forgotten.is_empty() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not-tracked",
            format!(
                "{text} is not tracked in {}",
                match group {
                    Some(g) => format!("group {g:?}"),
                    None => "any group".to_owned(),
                }
            ),
        ));
    }
    Ok(json!({ "key": text, "forgotten_in": forgotten }))
}

/// What keys of `kind` are, for an error message.
const fn describe(kind: KeyKind) -> &'static str {
    match kind {
        KeyKind::Client => "client addresses (198.51.100.7/32, 2001:db8:1:2::/64)",
        KeyKind::Credential => "credentials (credential: and 32 hex digits)",
    }
}

fn blocklist(source: &StatusSource) -> Result<Arc<dyn AdminBlocklist>, ApiError> {
    source.blocklist.clone().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "xdp-off",
            format!(
                "the XDP shield is not running (xdp.mode = {:?}, or it could not attach: see the \
                 log), so there is no blocklist",
                source.xdp_mode
            ),
        )
    })
}

fn map_error(e: &ShieldError) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "map-error",
        e.to_string(),
    )
}

/// `GET /blocks`: the prefixes blocked now, with the seconds each has left.
///
/// # Errors
/// 503 without the shield; 500 if the map cannot be read.
pub fn blocks(source: &StatusSource, query: Option<&str>) -> Result<Value, ApiError> {
    params(query, &[])?;
    let list = blocklist(source)?.list().map_err(|e| map_error(&e))?;
    let mut blocks: Vec<(PrefixKey, u64)> = list;
    blocks.sort_unstable_by_key(|(k, _)| *k);
    Ok(json!({
        "blocks": blocks
            .iter()
            .map(|(k, s)| json!({ "prefix": k.to_string(), "seconds_left": s }))
            .collect::<Vec<_>>()
    }))
}

/// The body of `POST /blocks`.
#[derive(Debug)]
struct BlockRequest {
    prefix: String,
    /// Seconds, 1..=[`MAX_BLOCK_S`].
    for_s: u64,
}

impl BlockRequest {
    /// Reads `{"prefix": "198.51.100.7/32", "for_s": 600}`, field by field, so that each error
    /// names its field and the value sent.
    ///
    /// # Errors
    /// 400 `bad-json` for a body that is no JSON object, a field missing, unknown or given
    /// twice, or a `prefix` that is no string; 400 `bad-for-s` for a `for_s` that is not a whole number of
    /// seconds from 1 to [`MAX_BLOCK_S`].
    fn parse(body: &[u8]) -> Result<Self, ApiError> {
        /// The body's two fields, any JSON each: serde refuses a field missing, unknown or
        /// given twice, and the values are checked below, each error naming its own.
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Fields {
            prefix: Value,
            for_s: Value,
        }
        let shape = "the body must be JSON {\"prefix\": \"198.51.100.7/32\", \"for_s\": 600}";
        let bad = |why: String| ApiError::bad("bad-json", format!("{shape}: {why}"));
        // An object, not the array serde would also read the fields from (`["…", 600]`).
        if !serde_json::from_slice::<Value>(body)
            .map_err(|e| bad(e.to_string()))?
            .is_object()
        {
            return Err(bad("not an object".to_owned()));
        }
        let Fields { prefix, for_s } =
            serde_json::from_slice::<Fields>(body).map_err(|e| bad(e.to_string()))?;
        let prefix = match prefix {
            Value::String(prefix) => prefix,
            other => return Err(bad(format!("prefix = {other}: must be a string"))),
        };
        let for_s = for_s
            .as_u64()
            .filter(|s| (1..=MAX_BLOCK_S).contains(s))
            .ok_or_else(|| {
                ApiError::bad(
                    "bad-for-s",
                    format!(
                        "for_s = {for_s}: must be a whole number of seconds from 1 to \
                         {MAX_BLOCK_S} (7 days)"
                    ),
                )
            })?;
        Ok(Self { prefix, for_s })
    }
}

/// Reads a request body of at most [`MAX_BODY`] bytes, within `timeout`.
///
/// # Errors
/// 413 `body-too-large` past [`MAX_BODY`], at once when the body's announced length
/// (`Content-Length`) is; 408 `request-timeout` when it has not arrived in full within
/// `timeout`; 400 `bad-body` when it breaks off.
pub async fn read_body(body: Incoming, timeout: Duration) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            format!("the body is over {MAX_BODY} bytes"),
        )
    };
    if body.size_hint().lower() > MAX_BODY as u64 {
        return Err(too_large());
    }
    let read = http_body_util::Limited::new(body, MAX_BODY).collect();
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(b)) => Ok(b.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Ok(Err(e)) => Err(ApiError::bad("bad-body", format!("reading the body: {e}"))),
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "request-timeout",
            format!("the body did not arrive within {} s", timeout.as_secs_f64()),
        )),
    }
}

/// `POST /blocks` with `{"prefix": "198.51.100.7/32", "for_s": 600}`: blocks the prefix's SYNs
/// at XDP for `for_s` seconds (1..=[`MAX_BLOCK_S`]).
///
/// # Errors
/// 400 for bad JSON, a bad prefix or `for_s` out of range; 409 `exempt` for a prefix the shield
/// never sheds (on `allow`, `xdp.allow` or `trusted_proxies`); 503 without the shield; 500 if a
/// map cannot be read or written.
pub fn block(source: &StatusSource, query: Option<&str>, body: &[u8]) -> Result<Value, ApiError> {
    params(query, &[])?;
    let req = BlockRequest::parse(body)?;
    let key = parse_prefix(&req.prefix)?;
    let list = blocklist(source)?;
    if list.exempt(&key).map_err(|e| map_error(&e))? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "exempt",
            format!(
                "{key} is on allow, xdp.allow or trusted_proxies: the shield never sheds its SYNs, \
                 so a block would drop nothing; take it off that list first"
            ),
        ));
    }
    list.block(key, Duration::from_secs(req.for_s))
        .map_err(|e| map_error(&e))?;
    Ok(json!({ "prefix": key.to_string(), "seconds_left": req.for_s }))
}

/// `DELETE /blocks/{prefix}`: takes the prefix off the blocklist, and has the escalator forget
/// it ([`StatusSource::unblocked`]), so that its next 429s can block it again.
///
/// # Errors
/// 400 for a bad prefix; 404 when it is not blocked; 503 without the shield; 500 if the map
/// cannot be written.
pub fn unblock(source: &StatusSource, raw: &str, query: Option<&str>) -> Result<Value, ApiError> {
    params(query, &[])?;
    let key = parse_prefix(raw)?;
    let list = blocklist(source)?;
    let was_blocked = list.unblock(&key).map_err(|e| map_error(&e))?;
    // Also when it was not on the map (evicted, or a block the shield dropped): the escalator's
    // mark would still hold its next escalation back.
    (source.unblocked)(&key);
    if was_blocked {
        Ok(json!({ "prefix": key.to_string(), "unblocked": true }))
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not-blocked",
            format!("{key} is not on the blocklist"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_keys_or_addresses() {
        let v4 = PrefixKey::from_ipv4([198, 51, 100, 7]);
        assert_eq!(parse_prefix("198.51.100.7"), Ok(v4));
        assert_eq!(parse_prefix("198.51.100.7/32"), Ok(v4));
        assert_eq!(parse_prefix("::ffff:198.51.100.7"), Ok(v4));
        let v6 = parse_prefix("2001:db8:1:2::/64").unwrap();
        assert_eq!(v6.to_string(), "2001:db8:1:2::/64");
        assert_eq!(parse_prefix("2001:db8:1:2::99"), Ok(v6));
        for bad in [
            "",
            "/32",
            "198.51.100.0/24",
            "198.51.100.7/33",
            "198.51.100.7/x",
            "2001:db8::1/64",
            "2001:db8::/48",
            "300.1.1.1",
            "localhost",
            "198.51.100.7/32/1",
            "198.51.100.7/+32",
            "198.51.100.7/0032",
            "198.51.100.7/032",
            "::ffff:198.51.100.7/32",
            "64:ff9b::c633:6407/32",
        ] {
            let e = parse_prefix(bad).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
            assert_eq!(e.code, "bad-prefix");
            assert!(e.message.contains(&format!("{bad:?}")), "{}", e.message);
        }
        let e = parse_prefix("::ffff:198.51.100.7/32").unwrap_err();
        assert!(
            e.message.contains(
                "IPv4-mapped or NAT64 address is keyed as its IPv4 address; write 198.51.100.7/32"
            ),
            "{}",
            e.message
        );
    }

    #[test]
    fn unknown_parameters_are_named() {
        let e = params(Some("group=link&topp=3"), &["group", "top"]).unwrap_err();
        assert!(e.message.contains("\"topp\""), "{}", e.message);
        assert_eq!(
            params(Some("group=a%20b"), &["group"]).unwrap(),
            [("group".to_owned(), "a b".to_owned())]
        );
    }
}
