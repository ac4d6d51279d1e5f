//! The front's connection-level settings: its timeouts, `ratelimit_headers`, the connection and
//! upstream caps, and `max_header_fields`.

use std::time::Duration;

use super::{
    ConfigError, DEFAULT_BODY_READ_TIMEOUT, DEFAULT_DRAIN_GRACE, DEFAULT_HEADER_READ_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS_PER_CLIENT, DEFAULT_MAX_HEADER_FIELDS,
    DEFAULT_SEND_TIMEOUT, DEFAULT_STREAM_IDLE_TIMEOUT, DEFAULT_UPSTREAM_MAX_INFLIGHT,
    DEFAULT_UPSTREAM_MAX_INFLIGHT_PER_CLIENT, DEFAULT_UPSTREAM_TIMEOUT, MAX_HEADER_FIELDS_LIMIT,
    durations::parse_duration, file::File, flags::Overrides, invalid, positive_u32,
};

/// The connection-level settings, before they are copied into [`Config`].
///
/// [`Config`]: super::Config
pub(super) struct Front {
    pub(super) header_read_timeout: Duration,
    pub(super) idle_timeout: Duration,
    pub(super) drain_grace: Duration,
    pub(super) upstream_timeout: Duration,
    pub(super) stream_idle_timeout: Duration,
    pub(super) send_timeout: Duration,
    pub(super) body_read_timeout: Duration,
    pub(super) ratelimit_headers: bool,
}

/// `header_read_timeout`, `idle_timeout`, `drain_grace`, `upstream_timeout`,
/// `stream_idle_timeout`, `send_timeout`, `body_read_timeout` and `ratelimit_headers`, each flag or env beating the
/// file.
///
/// # Errors
/// A duration that does not parse or is out of range, named with its key.
pub(super) fn build_front(file: &File, o: &Overrides) -> Result<Front, ConfigError> {
    let [
        header_read,
        idle,
        drain,
        upstream,
        stream_idle,
        send,
        body_read,
    ] = [
        &file.header_read_timeout,
        &file.idle_timeout,
        &file.drain_grace,
        &file.upstream_timeout,
        &file.stream_idle_timeout,
        &file.send_timeout,
        &file.body_read_timeout,
    ]
    .map(Clone::clone);
    let ratelimit_headers = file.ratelimit_headers;
    let duration = |key: &str, flag: &Option<String>, file: Option<String>, default| match flag
        .clone()
        .or(file)
    {
        Some(s) => parse_duration(key, &s),
        None => Ok(default),
    };
    Ok(Front {
        header_read_timeout: duration(
            "header_read_timeout",
            &o.header_read_timeout,
            header_read,
            DEFAULT_HEADER_READ_TIMEOUT,
        )?,
        idle_timeout: duration("idle_timeout", &o.idle_timeout, idle, DEFAULT_IDLE_TIMEOUT)?,
        drain_grace: duration("drain_grace", &o.drain_grace, drain, DEFAULT_DRAIN_GRACE)?,
        upstream_timeout: duration(
            "upstream_timeout",
            &o.upstream_timeout,
            upstream,
            DEFAULT_UPSTREAM_TIMEOUT,
        )?,
        stream_idle_timeout: duration(
            "stream_idle_timeout",
            &o.stream_idle_timeout,
            stream_idle,
            DEFAULT_STREAM_IDLE_TIMEOUT,
        )?,
        send_timeout: duration("send_timeout", &o.send_timeout, send, DEFAULT_SEND_TIMEOUT)?,
        body_read_timeout: duration(
            "body_read_timeout",
            &o.body_read_timeout,
            body_read,
            DEFAULT_BODY_READ_TIMEOUT,
        )?,
        ratelimit_headers: o.ratelimit_headers.or(ratelimit_headers).unwrap_or(true),
    })
}

/// `max_connections`, `max_connections_per_client`, `upstream_max_inflight` and
/// `upstream_max_inflight_per_client`, each flag or env beating the file: `max_connections`
/// (`None` when neither sets it: derived at start), then the other three with their defaults.
///
/// # Errors
/// A value below 1 or above `u32::MAX`, named with its key.
pub(super) fn build_connection_limits(
    file: &File,
    o: &Overrides,
) -> Result<(Option<u32>, [u32; 3]), ConfigError> {
    let file = [
        file.max_connections,
        file.max_connections_per_client,
        file.upstream_max_inflight,
        file.upstream_max_inflight_per_client,
    ];
    let flags = [
        o.max_connections,
        o.max_connections_per_client,
        o.upstream_max_inflight,
        o.upstream_max_inflight_per_client,
    ];
    let keys = [
        "max_connections",
        "max_connections_per_client",
        "upstream_max_inflight",
        "upstream_max_inflight_per_client",
    ];
    let mut set = [None; 4];
    for (((slot, flag), from_file), key) in set.iter_mut().zip(flags).zip(file).zip(keys) {
        *slot = flag
            .or(from_file)
            .map(|v| positive_u32(key, v))
            .transpose()?;
    }
    let [total, per_client, upstream, upstream_per_client] = set;
    Ok((
        total,
        [
            per_client.unwrap_or(DEFAULT_MAX_CONNECTIONS_PER_CLIENT),
            upstream.unwrap_or(DEFAULT_UPSTREAM_MAX_INFLIGHT),
            upstream_per_client.unwrap_or(DEFAULT_UPSTREAM_MAX_INFLIGHT_PER_CLIENT),
        ],
    ))
}

/// `max_header_fields`, the flag or env beating the file: from 1 to [`MAX_HEADER_FIELDS_LIMIT`].
pub(super) fn build_max_header_fields(
    file: Option<i64>,
    o: &Overrides,
) -> Result<usize, ConfigError> {
    let Some(v) = o.max_header_fields.or(file) else {
        return Ok(DEFAULT_MAX_HEADER_FIELDS);
    };
    usize::try_from(v)
        .ok()
        .filter(|n| (1..=MAX_HEADER_FIELDS_LIMIT).contains(n))
        .ok_or_else(|| {
            invalid(
                "max_header_fields",
                v,
                format!("must be a whole number from 1 to {MAX_HEADER_FIELDS_LIMIT}"),
            )
        })
}
