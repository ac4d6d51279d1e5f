//! An in-process door serving one configuration on 127.0.0.1, for the request-path suites
//! (`front.rs`, `streams.rs`, `planes.rs`, `upstream_pool.rs`): its address, its front, and the counts a test reads back.
#![expect(
    clippy::unwrap_used,
    unreachable_pub,
    reason = "test support: a failed setup is a failed test; public for the suites that use it"
)]

use std::{net::SocketAddr, sync::Arc, time::Duration};

use door_daemon::{
    config::Config,
    http::{App, ConnSettings, Front},
    obs::metrics::{Metrics, Outcome},
    time::Clock,
};
use tokio::net::TcpListener;

/// A running in-process door.
pub struct Door {
    /// Where its front listens.
    pub addr: SocketAddr,
    /// The front and its app.
    pub front: Front,
}

impl Door {
    /// The request path.
    pub fn app(&self) -> &Arc<App> {
        self.front.app()
    }

    /// Requests holding a slot in `group`.
    pub fn inflight(&self, group: &str) -> u32 {
        self.app()
            .limiters()
            .iter()
            .find(|l| l.group() == group)
            .unwrap()
            .inflight()
    }

    /// Requests of `group` counted under `outcome`.
    pub fn count(&self, group: &str, outcome: Outcome) -> u64 {
        self.app()
            .outcome_totals(group)
            .into_iter()
            .find(|(o, _)| *o == outcome)
            .unwrap()
            .1
    }

    /// Waits (yielding, bounded) until `f` holds: for counts that settle on another task.
    pub async fn eventually(&self, what: &str, f: impl Fn(&Self) -> bool) {
        for _ in 0..500 {
            if f(self) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never: {what}");
    }
}

/// door with `cfg` on `clock`, terminating TLS with `tls` when given, on an ephemeral port.
pub async fn door_with(
    cfg: &Config,
    clock: Arc<dyn Clock>,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Door {
    let app = Arc::new(App::new(cfg, &clock, &Metrics::noop(), None));
    let front = Front::new(app, ConnSettings::from_config(cfg), tls);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    front.serve(l, false);
    Door { addr, front }
}
