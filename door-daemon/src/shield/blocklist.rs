//! The blocklist writer: escalations from the request path are queued to a dedicated thread that
//! writes the XDP blocklist map, so that a request never waits for the shield's lock.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use door_common::prefix::PrefixKey;

use super::{Shield, escalate};
use crate::obs::logging::RateLimitedWarn;

/// Escalations waiting for the blocklist writer, at most; more are dropped (and logged, at most
/// one line a minute with the count of those not logged).
pub const BLOCKLIST_QUEUE: usize = 1_024;

/// The escalator's [`Blocklist`](crate::shield::escalate::Blocklist) in production: queues blocks for a
/// dedicated thread that writes the XDP blocklist, so that the request path never waits for the
/// shield's lock or for a map walk (`/status`, metrics collection). A block written for a prefix
/// blocked longer already leaves the longer deadline ([`Shield::extend`]).
#[derive(Debug)]
pub struct BlocklistWriter {
    queue: std::sync::mpsc::SyncSender<(PrefixKey, Duration)>,
    dropped: RateLimitedWarn,
}

impl BlocklistWriter {
    /// Starts the writer thread for `shield`; it ends when the writer is dropped.
    pub fn spawn(shield: Arc<Mutex<Shield>>) -> Self {
        let (queue, rx) = std::sync::mpsc::sync_channel::<(PrefixKey, Duration)>(BLOCKLIST_QUEUE);
        let spawned = std::thread::Builder::new()
            .name("door-blocklist".to_owned())
            .spawn(move || {
                for (key, duration) in rx {
                    let result = shield
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .extend(key, duration);
                    if let Err(e) = result {
                        static BLOCK_FAILED: RateLimitedWarn =
                            RateLimitedWarn::new(Duration::from_mins(1));
                        if let Some(suppressed) = BLOCK_FAILED.due() {
                            tracing::warn!(%key, error = %e, suppressed, "could not add to the XDP blocklist (at most one line a minute)");
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "could not start the blocklist writer: escalation is off");
        }
        Self {
            queue,
            dropped: RateLimitedWarn::new(Duration::from_mins(1)),
        }
    }
}

impl escalate::Blocklist for BlocklistWriter {
    fn block(&self, key: PrefixKey, duration: Duration) -> bool {
        if self.queue.try_send((key, duration)).is_ok() {
            return true;
        }
        if let Some(suppressed) = self.dropped.due() {
            tracing::warn!(%key, suppressed, "blocklist writer is behind or gone: escalations are being dropped (at most one line a minute)");
        }
        false
    }
}
