//! Routing, ns per request: [`Router::route_for_either`] as door's request path calls it (the
//! method overrides read only when the method has no route), on a route table of the kind an
//! application puts in front of door, for the paths its clients send: unrouted pages and static
//! assets (most of the traffic, and the paths with a `.` pay for the format-suffix reading),
//! routed paths, and the spellings the other readings exist for (a format suffix, case, `;`
//! parameters, an escaped separator, a network path). No peer: what a routing decision costs
//! door, against the microseconds a proxied request costs (docs/performance.md).

use std::hint::black_box;

use criterion::Criterion;
use door_daemon::http::route::{Route, Router, method_override};
use http::{HeaderMap, Method};

/// Eight routes, from the shipped configuration's and the examples in docs/configuration.md.
#[expect(
    clippy::expect_used,
    reason = "the routes are fixed: one that does not parse is a broken benchmark"
)]
fn router() -> Router {
    let route = |group: &str, methods: &[&str], path: &str| {
        let methods: Vec<String> = methods.iter().map(|m| (*m).to_owned()).collect();
        Route::new(group, &methods, path).expect("a valid route")
    };
    Router::new(vec![
        route("webhook", &["POST"], "/webhooks/github"),
        route("webhook", &["POST"], "/webhooks/stripe"),
        route("link", &["GET"], "/l/session/{id}"),
        route("health", &[], "/healthz"),
        route("login", &["POST"], "/api/login"),
        route("signup", &["POST"], "/api/signup"),
        route("writes", &["DELETE", "PUT"], "/api/items/{id}"),
        route("export", &["GET"], "/api/items/{id}/export"),
    ])
}

/// The requests measured: a name, the method, the path.
const REQUESTS: [(&str, &str, &str); 11] = [
    ("unrouted page", "GET", "/dashboard/projects"),
    ("unrouted asset", "GET", "/assets/app.4f3a9c.js"),
    // The same path without its dots: what the format-suffix reading costs the asset above.
    ("unrouted asset, no dot", "GET", "/assets/app-4f3a9c-js"),
    (
        "unrouted asset, deep",
        "GET",
        "/static/img/icons/logo.8c1e.svg",
    ),
    ("routed link", "GET", "/l/session/9f86d081884c7d65"),
    ("routed webhook", "POST", "/webhooks/github"),
    ("format suffix", "POST", "/api/login.json"),
    ("case and parameters", "POST", "/API/Login;jsessionid=1"),
    ("escaped separator", "GET", "/api/items%2F42/export"),
    ("network path", "POST", "//x/api/login"),
    ("wildcard, wrong method", "GET", "/api/items/42"),
];

fn main() {
    let router = router();
    let headers = HeaderMap::new();
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    let mut group = c.benchmark_group("route_for_either");
    for (name, method, path) in REQUESTS {
        let method = Method::from_bytes(method.as_bytes()).unwrap_or(Method::GET);
        group.bench_function(name, |b| {
            b.iter(|| {
                let (method, path) = (black_box(&method), black_box(path));
                let overrides = || method_override(method, None, &headers, |m| router.lists(m));
                router
                    .route_for_either(method, overrides, path)
                    .map(|r| r.group.len())
            });
        });
    }
    group.finish();
    c.final_summary();
}
