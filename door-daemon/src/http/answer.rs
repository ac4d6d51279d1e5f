//! door's own answers, in one place: the status, body and headers door sends instead of (or on top
//! of) the upstream's. A limiter [`Rejection`] becomes 429 or 503 with `Retry-After` and the JSON
//! envelope of docs/design.md ("Limits"); [`ratelimit_fields`] adds the `RateLimit-Policy` and
//! `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers-10); a [`Failure`] becomes 408, 502 or
//! 504; a cached health answer carries `Cache-Status` (RFC 9211).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header, header::Entry};

use crate::{
    http::{body::ResponseBody, head::HeadError, upstream::ProxyError},
    limit::{Quota, RejectReason, Rejection},
    obs::logging::RateLimitedWarn,
};

/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-10).
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10).
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `Cache-Status` (RFC 9211), set on health answers served from the cache.
pub static CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// Why door answered instead of the upstream.
#[derive(Debug)]
pub enum Failure {
    /// The request body missed its read deadline (408).
    BodyTimeout,
    /// The upstream sent no response head within `upstream_timeout` (504).
    UpstreamTimeout,
    /// Door held a part of the request body the upstream was not taking, and the upstream took
    /// nothing for `upstream_timeout` (504).
    UpstreamStalled,
    /// The upstream call failed: refused, reset, malformed (502).
    Upstream(ProxyError),
    /// The upstream switched protocols where it must not (502).
    Protocol(crate::http::upgrade::UpgradeError),
    /// The client's request body broke off (the client went away): nobody reads the answer, which
    /// is a 400 for the log's sake.
    ClientGone,
}

impl Failure {
    /// Every value [`Failure::reason`] returns, in the order docs/operations.md lists them.
    pub const REASONS: [&'static str; 6] = [
        "body_timeout",
        "client_gone",
        "upstream_timeout",
        "upstream_stalled",
        "upstream_error",
        "upstream_protocol",
    ];

    /// Its `door.reason` in `door.requests_failed`.
    pub const fn reason(&self) -> &'static str {
        match self {
            Self::BodyTimeout => "body_timeout",
            Self::ClientGone => "client_gone",
            Self::UpstreamTimeout => "upstream_timeout",
            Self::UpstreamStalled => "upstream_stalled",
            Self::Upstream(_) => "upstream_error",
            Self::Protocol(_) => "upstream_protocol",
        }
    }
}

/// A structured-field string (RFC 8941 §3.3.3) of `s`: quoted, `"` and `\` escaped; characters
/// outside printable ASCII replaced by `?`.
pub fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

/// The status door answers a [`Failure`] with: 408, 504 or 502.
pub fn failure_status(f: &Failure) -> StatusCode {
    match f {
        Failure::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
        Failure::UpstreamTimeout | Failure::UpstreamStalled => StatusCode::GATEWAY_TIMEOUT,
        Failure::Upstream(_) | Failure::Protocol(_) => StatusCode::BAD_GATEWAY,
        Failure::ClientGone => StatusCode::BAD_REQUEST,
    }
}

/// door's answer to a [`Failure`]: its status and a JSON body `{"code","message"}`; a 408 also
/// closes the connection (the rest of the body is never read). An upstream failure is logged at
/// most once a minute.
pub fn failure_response(f: &Failure) -> Response<ResponseBody> {
    let (code, message) = match f {
        Failure::BodyTimeout => (
            "request-timeout",
            "the request body did not arrive in time".to_owned(),
        ),
        Failure::ClientGone => ("bad-request", "the request body broke off".to_owned()),
        Failure::Protocol(e) => ("bad-gateway", e.to_string()),
        Failure::UpstreamTimeout => (
            "gateway-timeout",
            "the application behind door did not answer in time".to_owned(),
        ),
        Failure::UpstreamStalled => (
            "gateway-timeout",
            "the application behind door stopped reading the request".to_owned(),
        ),
        Failure::Upstream(e) => {
            // An upstream down fails every request: one line a minute, with the count skipped.
            static UPSTREAM_FAILED: RateLimitedWarn = RateLimitedWarn::new(Duration::from_mins(1));
            if let Some(suppressed) = UPSTREAM_FAILED.due() {
                tracing::warn!(
                    error = %e,
                    cause = %e.causes(),
                    refused = e.is_connect(),
                    suppressed,
                    "upstream request failed (at most one line a minute)"
                );
            }
            (
                "bad-gateway",
                "the application behind door did not answer".to_owned(),
            )
        }
    };
    let mut res = json_response(
        failure_status(f),
        &serde_json::json!({ "code": code, "message": message }),
    );
    if matches!(
        f,
        Failure::BodyTimeout | Failure::ClientGone | Failure::UpstreamStalled
    ) {
        // The rest of the body is never read: the connection cannot be reused.
        res.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    res
}

/// A health answer door gives itself: `status` with its reason phrase as a plain-text body,
/// `Cache-Status: cache_status` and `Cache-Control: no-store`.
pub fn health_response(status: StatusCode, cache_status: &'static str) -> Response<ResponseBody> {
    let mut res = Response::new(ResponseBody::full(Bytes::from_static(
        status.canonical_reason().unwrap_or("unknown").as_bytes(),
    )));
    *res.status_mut() = status;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(&CACHE_STATUS, HeaderValue::from_static(cache_status));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

/// The 429/503 answer of docs/design.md ("Limits"): `Retry-After` in whole seconds and the
/// JSON envelope `{"code":"rate-limited","message":…,"details":{"group","scope","retry_after_s"}}`.
pub fn rejected(group: &str, r: &Rejection) -> Response<ResponseBody> {
    let body = serde_json::json!({
        "code": "rate-limited",
        "message": format!("too many requests to {group}; retry in {} s", r.retry_after_s),
        "details": {
            "group": group,
            "scope": r.scope.as_str(),
            "retry_after_s": r.retry_after_s,
        },
    });
    let mut res = json_response(status(r.reason), &body);
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(r.retry_after_s));
    res
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<ResponseBody> {
    let mut res = Response::new(ResponseBody::full(Bytes::from(body.to_string())));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

/// The answer to a pass-through request over `upstream_max_inflight` (503), or, `per_client`, over
/// `upstream_max_inflight_per_client` (429, RFC 6585 §4: this client's doing): `Retry-After: 1`
/// and the JSON body `{"code":"upstream-busy","message":…,"details":{"scope"}}`, the scope
/// `group` or `client` as in a limited group's answer.
pub fn upstream_busy(per_client: bool) -> Response<ResponseBody> {
    let (status, scope, whose) = if per_client {
        (StatusCode::TOO_MANY_REQUESTS, "client", "of yours ")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "group", "")
    };
    let mut res = json_response(
        status,
        &serde_json::json!({
            "code": "upstream-busy",
            "message": format!(
                "too many requests {whose}to the application behind door at once; retry in 1 s"
            ),
            "details": { "scope": scope },
        }),
    );
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(1u32));
    res
}

/// door's answer to a request head it refuses ([`HeadError`]): 400 (`bad-request`) or 501
/// (`not-implemented`) with the reason. Over HTTP/1.x the connection is closed after it: the
/// head's framing is in doubt, and after a refused CONNECT the client may already be sending the
/// tunnel's bytes, which must not be read as a request.
pub fn bad_head(e: &HeadError, version: http::Version) -> Response<ResponseBody> {
    let status = e.status();
    let code = if status == StatusCode::NOT_IMPLEMENTED {
        "not-implemented"
    } else {
        "bad-request"
    };
    let mut res = json_response(
        status,
        &serde_json::json!({ "code": code, "message": e.to_string() }),
    );
    if version < http::Version::HTTP_2 {
        res.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    res
}

/// The answer to a client on the `deny` list: 403 with `{"code":"forbidden"}`, before any bucket.
pub fn forbidden() -> Response<ResponseBody> {
    json_response(
        StatusCode::FORBIDDEN,
        &serde_json::json!({
            "code": "forbidden",
            "message": "this network may not use this service",
        }),
    )
}

/// The status of a rejection: 503 for the group's in-flight cap (the service as a whole is busy),
/// 429 for the client's rate or in-flight cap.
pub const fn status(reason: RejectReason) -> StatusCode {
    match reason {
        RejectReason::GroupConcurrency => StatusCode::SERVICE_UNAVAILABLE,
        RejectReason::Rate | RejectReason::ClientConcurrency => StatusCode::TOO_MANY_REQUESTS,
    }
}

/// The `RateLimit-Policy` value of a group: `"NAME";q=BURST;w=WINDOW_S`, or `None` when the name
/// cannot be a header value.
pub fn ratelimit_policy(sf_name: &str, burst: u32, window_s: u64) -> Option<HeaderValue> {
    HeaderValue::try_from(format!("{sf_name};q={burst};w={window_s}")).ok()
}

/// Sets `RateLimit-Policy: policy` and `RateLimit: "NAME";r=REMAINING;t=RESET_S` from the
/// client's `quota` on a limited route's response, whatever its status. A response that already
/// carries another policy's fields (a request plane's and a group's) gets this one appended: both
/// fields are lists (draft-ietf-httpapi-ratelimit-headers-10 §3, §4).
pub fn ratelimit_fields(headers: &mut HeaderMap, policy: &HeaderValue, sf_name: &str, q: Quota) {
    // `NAME;r=REMAINING;t=RESET_S`, built without the formatting machinery: this runs on every
    // limited response.
    let mut remaining = itoa::Buffer::new();
    let mut reset = itoa::Buffer::new();
    let mut item = Vec::with_capacity(sf_name.len() + 48);
    item.extend_from_slice(sf_name.as_bytes());
    item.extend_from_slice(b";r=");
    item.extend_from_slice(remaining.format(q.remaining).as_bytes());
    item.extend_from_slice(b";t=");
    item.extend_from_slice(reset.format(q.reset_s).as_bytes());
    append_item(headers, &RATELIMIT_POLICY, policy.clone());
    if let Ok(item) = HeaderValue::from_maybe_shared(Bytes::from(item)) {
        append_item(headers, &RATELIMIT, item);
    }
}

/// Removes `RateLimit-Policy` and `RateLimit` (an upstream's own): door's own fields describe door's limits.
/// Found by comparing names first: most upstreams send neither, and a removal hashes its name.
pub fn clear_ratelimit_fields(headers: &mut HeaderMap) {
    if headers
        .keys()
        .any(|k| *k == RATELIMIT_POLICY || *k == RATELIMIT)
    {
        headers.remove(&RATELIMIT_POLICY);
        headers.remove(&RATELIMIT);
    }
}

/// Sets `name: item`, or appends `, item` to the value already there (one lookup either way).
fn append_item(headers: &mut HeaderMap, name: &HeaderName, item: HeaderValue) {
    match headers.entry(name) {
        Entry::Vacant(slot) => {
            slot.insert(item);
        }
        Entry::Occupied(mut slot) => {
            let old = slot.get().as_bytes();
            let mut v = Vec::with_capacity(old.len() + 2 + item.len());
            v.extend_from_slice(old);
            v.extend_from_slice(b", ");
            v.extend_from_slice(item.as_bytes());
            if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(v)) {
                slot.insert(v);
            }
        }
    }
}

/// The 429 of a request plane (`session` or `ip`): as [`rejected`], with `details.group` and
/// `details.scope` both naming the plane (docs/design.md, "Streams and sessions", Planes).
pub fn rejected_by_plane(plane: &str, r: &Rejection) -> Response<ResponseBody> {
    let body = serde_json::json!({
        "code": "rate-limited",
        "message": format!("too many requests; retry in {} s", r.retry_after_s),
        "details": {
            "group": plane,
            "scope": plane,
            "retry_after_s": r.retry_after_s,
        },
    });
    let mut res = json_response(status(r.reason), &body);
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(r.retry_after_s));
    res
}
