//! Route matching: which limit group, if any, a request belongs to (docs/design.md,
//! "Configuration", `[[route]]`). First match wins; no match means unlimited pass-through.
//!
//! Paths are compared segment by segment after normalisation, so that a client cannot step around
//! a limited route with a spelling the application treats as the same path: empty segments
//! (`//`, a trailing `/`) and `.` are ignored, `..` removes the previous segment (RFC 3986
//! §5.2.4), and percent-encoded characters are decoded as applications decode them, but for the
//! few that would change the path's structure (`decode_segment`).
//!
//! A path is also read as the lenient servers read it ([`lenient`]): an encoded slash (`%2F`), a
//! backslash and an encoded backslash as separators, each segment's `;` parameters dropped, and
//! letters compared without regard to case. For RFC 3986 those are other paths, but WSGI servers
//! decode `%2F` (PEP 3333's `PATH_INFO`: Django and Flask behind gunicorn or uWSGI), WHATWG URL
//! parsers (Node) read `\` as `/`, Tomcat and Spring drop `;` parameters, and Express and ASP.NET
//! route without regard to case: through door, `/webhooks%2Fgithub` would reach their
//! `/webhooks/github` unlimited. The first route that matches either reading wins, so a specific
//! route listed before a wildcard one holds for every spelling (`/api/LOGIN` is `/api/login`'s,
//! not `/api/{endpoint}`'s). A path that begins with two separators and matches no route in
//! those readings is read without its first segment, as URL parsers read such a target
//! (`network_path`), then, if it has `.` or `..` segments, with them kept as segments, as WSGI
//! servers and Express route them (`/l/session/%2e` is a session `.` there), and a request whose
//! method has no route is routed under the method it names in a method-override field or
//! parameter ([`method_override`]). Beside the lenient reading, a path is also read with its
//! last segment's format suffix cut (`/api/login.json` as `/api/login`: Rails' `(.:format)` and
//! Spring's suffix patterns route it so, `format_suffix`); the first route any of these main
//! readings matches wins. A `GET` route also matches `HEAD` (RFC 9110 §9.3.2: HEAD is GET without
//! the body).

use std::borrow::Cow;

use http::{HeaderName, Method};
use smallvec::SmallVec;
use thiserror::Error;

/// A `[[route]]` entry that cannot be used. Its message is the reason alone; the key it is about
/// is [`RouteError::key`] and the value [`RouteError::value`], which the configuration's error
/// names once (`route[0].path = "x": must start with '/'`).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RouteError {
    /// The path does not start with `/`.
    #[error("must start with '/'")]
    NotAbsolute(String),
    /// A segment mixes a `{name}` wildcard with other text, or the name is empty.
    #[error("segment {segment:?} must be literal text or a whole {{name}}")]
    BadWildcard {
        /// The offending path.
        path: String,
        /// The offending segment.
        segment: String,
    },
    /// A wildcard's name is not made of ASCII letters, digits, `_` and `-`: other routers give
    /// such names a meaning door's one-segment wildcard does not have (`{*rest}` and `{**rest}`
    /// match any number of segments in axum, matchit and ASP.NET Core, `{id?}` also matches no
    /// segment in Laravel and ASP.NET Core), so a request the application's route takes would
    /// pass door's unlimited.
    #[error(
        "wildcard {segment:?}: a name is ASCII letters, digits, '_' and '-', and a wildcard \
         matches exactly one segment (door has no catch-all like {{*rest}} and no optional \
         segment like {{id?}}: write a route for each form the application serves)"
    )]
    WildcardName {
        /// The offending path.
        path: String,
        /// The offending segment.
        segment: String,
    },
    /// The path holds a character no request path can carry: a `?` or `#` (a request's query
    /// and fragment are not part of its path), a space or a control character (request paths
    /// carry those percent-encoded). Such a route would never match. Characters outside ASCII
    /// are allowed: clients that send UTF-8 raw reach them.
    #[error(
        "{found:?} never appears in a request path (routes match the path alone, without the \
         query; spaces and control characters arrive percent-encoded), so the route would never \
         match"
    )]
    NeverMatches {
        /// The offending path.
        path: String,
        /// The first such character.
        found: char,
    },
    /// A method name is not an HTTP token, or is longer than 32 bytes.
    #[error("not an HTTP method (a token of at most 32 characters)")]
    BadMethod(String),
    /// `CONNECT`, which no request is routed as: door answers a plain CONNECT with 501 before
    /// routing (it tunnels to no other host), and routes an HTTP/2 WebSocket's extended CONNECT
    /// (RFC 8441) as the `GET` it sends upstream.
    #[error(
        "no request is routed as CONNECT: a plain CONNECT is answered 501, and an HTTP/2 \
         WebSocket's extended CONNECT is routed as the GET door sends upstream (list GET)"
    )]
    ConnectNeverRouted(String),
    /// The path has more than [`MAX_SEGMENTS`] segments.
    #[error("has {count} segments; a route's path has at most {MAX_SEGMENTS}")]
    TooManySegments {
        /// The offending path.
        path: String,
        /// Its segments, after normalisation.
        count: usize,
    },
}

/// The most segments a route's path may have. Each route is compared with the routes above it
/// segment by segment when the configuration is loaded ([`Route::shadowed_by`]), and each request
/// with the routes in order; no application's routes come near it.
pub const MAX_SEGMENTS: usize = 32;

/// The most characters of a segment an error quotes.
const QUOTED_SEGMENT: usize = 60;

impl RouteError {
    /// The route's key at fault: `path` or `methods`.
    pub fn key(&self) -> &'static str {
        match self {
            Self::NotAbsolute(_)
            | Self::BadWildcard { .. }
            | Self::WildcardName { .. }
            | Self::NeverMatches { .. }
            | Self::TooManySegments { .. } => "path",
            Self::BadMethod(_) | Self::ConnectNeverRouted(_) => "methods",
        }
    }

    /// The offending value as written: the path, or the one method name.
    pub fn value(&self) -> &str {
        match self {
            Self::NotAbsolute(path)
            | Self::BadWildcard { path, .. }
            | Self::WildcardName { path, .. }
            | Self::NeverMatches { path, .. }
            | Self::TooManySegments { path, .. } => path,
            Self::BadMethod(method) | Self::ConnectNeverRouted(method) => method,
        }
    }
}

/// One segment of a path pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    /// Must equal this text (already normalised).
    Literal(String),
    /// `{name}`: matches any one non-empty segment.
    Wildcard,
}

/// A path pattern: an exact path, or segments with `{name}` wildcards (`/l/session/{id}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    source: String,
    segments: Vec<Segment>,
}

impl PathPattern {
    /// Parses `/a/{name}/b`.
    ///
    /// # Errors
    /// [`RouteError::NotAbsolute`] without a leading `/`; [`RouteError::NeverMatches`] for a
    /// character no request path carries; [`RouteError::BadWildcard`] for a segment like `x{id}`
    /// or `{}`; [`RouteError::WildcardName`] for a name like `*rest` or `id?`;
    /// [`RouteError::TooManySegments`] past [`MAX_SEGMENTS`].
    pub fn parse(path: &str) -> Result<Self, RouteError> {
        if !path.starts_with('/') {
            return Err(RouteError::NotAbsolute(path.to_owned()));
        }
        let mut segments = Vec::new();
        for segment in normalise(path) {
            if segment.contains(['{', '}']) {
                let name = segment
                    .strip_prefix('{')
                    .and_then(|rest| rest.strip_suffix('}'));
                // Quoted in an error: at most its first characters.
                let shown = || match segment.char_indices().nth(QUOTED_SEGMENT) {
                    Some((end, _)) => format!("{}…", segment.get(..end).unwrap_or("")),
                    None => segment.clone().into_owned(),
                };
                match name {
                    Some(name) if !name.is_empty() && !name.contains(['{', '}']) => {
                        if !name
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
                        {
                            return Err(RouteError::WildcardName {
                                path: path.to_owned(),
                                segment: shown(),
                            });
                        }
                        segments.push(Segment::Wildcard);
                    }
                    _ => {
                        return Err(RouteError::BadWildcard {
                            path: path.to_owned(),
                            segment: shown(),
                        });
                    }
                }
            } else {
                segments.push(Segment::Literal(segment.into_owned()));
            }
        }
        // After the wildcards, so that `{id?}` is told what its `?` means elsewhere.
        if let Some(found) = path
            .chars()
            .find(|&c| matches!(c, '?' | '#' | ' ') || c.is_control())
        {
            return Err(RouteError::NeverMatches {
                path: path.to_owned(),
                found,
            });
        }
        if segments.len() > MAX_SEGMENTS {
            return Err(RouteError::TooManySegments {
                path: path.to_owned(),
                count: segments.len(),
            });
        }
        Ok(Self {
            source: path.to_owned(),
            segments,
        })
    }

    /// Whether the request path (without query) matches, as written.
    pub fn matches(&self, path: &str) -> bool {
        self.matches_segments(&normalise(path), true)
    }

    /// Whether the normalised segments of a path match this pattern: literal segments compared
    /// `exact`ly, or without regard to ASCII case.
    fn matches_segments(&self, got: &[Cow<'_, str>], exact: bool) -> bool {
        self.segments.len() == got.len()
            && self.segments.iter().zip(got).all(|(want, got)| match want {
                Segment::Literal(lit) if exact => lit.as_str() == got.as_ref(),
                Segment::Literal(lit) => lit.eq_ignore_ascii_case(got),
                Segment::Wildcard => true,
            })
    }

    /// The pattern as written in the configuration.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether this pattern matches every path `other` matches, in every reading the router
    /// tries: as many segments, each of this pattern's a wildcard or the same literal text, or,
    /// for the last, the text of `other`'s without its format suffix (`/api/items` takes
    /// `/api/items.csv`'s paths in the reading that cuts it, [`format_suffix`]). (A literal that
    /// differs only in case also matches in the lenient reading; such a pair is not counted, so
    /// `covers` never claims more than it can prove.)
    fn covers(&self, other: &Self) -> bool {
        let last = self.segments.len().saturating_sub(1);
        self.segments.len() == other.segments.len()
            && self
                .segments
                .iter()
                .zip(&other.segments)
                .enumerate()
                .all(|(i, (mine, theirs))| match (mine, theirs) {
                    (Segment::Wildcard, _) => true,
                    (Segment::Literal(a), Segment::Literal(b)) => {
                        a == b
                            || (i == last
                                && format_suffix(b).and_then(|cut| b.get(..cut)) == Some(a))
                    }
                    (Segment::Literal(_), Segment::Wildcard) => false,
                })
    }
}

/// A route: methods (empty = any) and a path pattern, mapped to a limit group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The group's name (`webhook`, `link`, `health` or a configured one).
    pub group: String,
    /// Methods this route applies to; empty means every method.
    pub methods: Vec<Method>,
    /// The path pattern.
    pub path: PathPattern,
    /// `stream = true`: requests on this route are long-lived (server-sent events, long polls):
    /// no body read deadline, no upstream timeout, the response holds its limiter slot until it
    /// ends (closed after `stream_idle_timeout` of silence). Default `false`.
    pub stream: bool,
}

impl Route {
    /// Builds a route from configuration values.
    ///
    /// # Errors
    /// [`RouteError`] for a bad path or method name; [`RouteError::ConnectNeverRouted`] for
    /// `CONNECT`.
    pub fn new(group: &str, methods: &[String], path: &str) -> Result<Self, RouteError> {
        let methods = methods
            .iter()
            .map(|m| {
                let method = Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                    .ok()
                    .filter(|_| m.len() <= LONGEST_METHOD)
                    .ok_or_else(|| RouteError::BadMethod(m.clone()))?;
                if method == Method::CONNECT {
                    return Err(RouteError::ConnectNeverRouted(m.clone()));
                }
                Ok(method)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            group: group.to_owned(),
            methods,
            path: PathPattern::parse(path)?,
            stream: false,
        })
    }

    /// The routes of `earlier` (the routes listed before this one) that between them take every
    /// request this route would match, by their index, so that this one never decides a request
    /// (first match wins): a route whose pattern covers this one's (`PathPattern::covers`)
    /// for every method, or one such route for each method this route lists. `None` when some
    /// request can reach this route. Every reading the router tries (as written, lenient,
    /// fallback, a method override) asks the routes in order, so a route taken in one reading
    /// is taken in all.
    pub fn shadowed_by(&self, earlier: &[Route]) -> Option<Vec<usize>> {
        let covering: Vec<(usize, &Route)> = earlier
            .iter()
            .enumerate()
            .filter(|(_, r)| r.path.covers(&self.path))
            .collect();
        if self.methods.is_empty() {
            // Every method: only a route above for every method takes them all.
            let &(every, _) = covering.iter().find(|(_, r)| r.methods.is_empty())?;
            return Some(vec![every]);
        }
        // The first route above that takes each method (one for every method included), so
        // that the routes named are the ones that decide its requests.
        let mut taken: Vec<usize> = Vec::new();
        for method in &self.methods {
            let &(by, _) = covering.iter().find(|(_, r)| r.method_matches(method))?;
            if !taken.contains(&by) {
                taken.push(by);
            }
        }
        taken.sort_unstable();
        Some(taken)
    }

    /// This route with `stream = stream`.
    #[must_use]
    pub fn streaming(self, stream: bool) -> Self {
        Self { stream, ..self }
    }

    /// Whether the route covers `method`: its methods compared without regard to case (methods
    /// are case-sensitive in HTTP, RFC 9110 §9.1, but an application may treat `get` as `GET`,
    /// and a limit must not be stepped around by spelling); `HEAD` with `GET`.
    /// `method` is the request's, already in upper case ([`Router::route_for`]).
    fn method_matches(&self, method: &Method) -> bool {
        self.methods.is_empty()
            || self.methods.contains(method)
            || (*method == Method::HEAD && self.methods.contains(&Method::GET))
    }
}

/// The longest method name a route may list that [`upper_case`] compares: longer request methods
/// are left as they are (no route lists one).
const LONGEST_METHOD: usize = 32;

/// `method` in upper case when it has a lower-case letter and is at most [`LONGEST_METHOD`]
/// bytes (one allocation for such a rare spelling); `None` when it is fine as it is.
fn upper_case(method: &Method) -> Option<Method> {
    let name = method.as_str();
    if name.len() > LONGEST_METHOD || !name.bytes().any(|b| b.is_ascii_lowercase()) {
        return None;
    }
    Method::from_bytes(name.to_ascii_uppercase().as_bytes()).ok()
}

/// The ordered route table.
#[derive(Debug, Clone, Default)]
pub struct Router {
    routes: Vec<Route>,
    /// Whether a route's literal segment has an upper-case letter: then a path without one can
    /// still read, without regard to case, as that route's.
    upper_case_literals: bool,
    /// Whether a route lists methods: only then can a method override change the route.
    method_specific: bool,
    /// The methods the routes list, in upper case, `HEAD` with `GET`: the only overrides that
    /// can change a request's route ([`Router::lists`]).
    listed: Vec<Method>,
}

impl Router {
    /// A router over `routes`, tried in order.
    pub fn new(routes: Vec<Route>) -> Self {
        let upper_case_literals = routes.iter().any(|r| {
            r.path.segments.iter().any(
                |s| matches!(s, Segment::Literal(l) if l.bytes().any(|b| b.is_ascii_uppercase())),
            )
        });
        let method_specific = routes.iter().any(|r| !r.methods.is_empty());
        let mut listed: Vec<Method> = Vec::new();
        for m in routes.iter().flat_map(|r| &r.methods) {
            let head = (*m == Method::GET).then_some(Method::HEAD);
            for m in [Some(m.clone()), head].into_iter().flatten() {
                if !listed.contains(&m) {
                    listed.push(m);
                }
            }
        }
        Self {
            routes,
            upper_case_literals,
            method_specific,
            listed,
        }
    }

    /// Whether a route lists `method` (without regard to case; `HEAD` where `GET` is listed): an
    /// override naming any other method changes no request's route.
    pub fn lists(&self, method: &Method) -> bool {
        let upper = upper_case(method);
        self.listed.contains(upper.as_ref().unwrap_or(method))
    }

    /// Whether a route lists methods ([`Router::route_for_either`] then may differ from
    /// [`Router::route_for`]); a request's method override need not be looked for otherwise.
    pub fn method_specific(&self) -> bool {
        self.method_specific
    }

    /// The group of the first route matching `method` and `path`, or `None` (pass-through).
    pub fn group_for(&self, method: &Method, path: &str) -> Option<&str> {
        self.route_for(method, path).map(|r| r.group.as_str())
    }

    /// The first route matching `method` and `path` as written or as the lenient servers read
    /// it ([`lenient`], see the module docs), or `None` (pass-through).
    pub fn route_for(&self, method: &Method, path: &str) -> Option<&Route> {
        self.route_for_either(method, Overrides::new, path)
    }

    /// As [`Router::route_for`], for a request that may name, in a method-override field or
    /// parameter, the methods the application may act on instead (`overridden`,
    /// [`method_override`]; looked for only when the request's own method has no route in the
    /// main readings, and only when a route lists methods; of those, only the methods a route
    /// lists are tried, each once, so that a request naming thousands costs no more than one
    /// naming each listed method). Tried in order, the first with a route deciding: the
    /// request's own method in the main readings (as written, lenient, the format suffix cut),
    /// each override's in them, then the fallback readings (without the authority of a `//host`
    /// path, dot segments kept) of the request's own method and of each override. The request's
    /// own method wins whenever its path has a route: an application that ignores the override
    /// acts on that one.
    pub fn route_for_either(
        &self,
        method: &Method,
        overridden: impl FnOnce() -> Overrides,
        path: &str,
    ) -> Option<&Route> {
        let own = self.main_position(method, path);
        let mut others = Overrides::new();
        if own.is_none() && self.method_specific {
            for m in overridden() {
                let m = upper_case(&m).unwrap_or(m);
                if self.listed.contains(&m) && !others.contains(&m) {
                    others.push(m);
                }
            }
        }
        own.or_else(|| others.iter().find_map(|m| self.main_position(m, path)))
            .or_else(|| self.fallback_position(method, path))
            .or_else(|| others.iter().find_map(|m| self.fallback_position(m, path)))
            .and_then(|i| self.routes.get(i))
    }

    /// The index of the first route matching `method`: a closure over the routes, with the
    /// method upper-cased once ([`upper_case`]).
    fn matcher(
        method: &Method,
    ) -> impl Fn(&[Route], &Segments<'_>, bool) -> Option<usize> + use<'_> {
        let upper = upper_case(method);
        move |routes: &[Route], segments: &Segments<'_>, exact: bool| {
            let method = upper.as_ref().unwrap_or(method);
            routes
                .iter()
                .position(|r| r.method_matches(method) && r.path.matches_segments(segments, exact))
        }
    }

    /// The main readings' route for `method`: the first route matching the path as written, as
    /// the lenient servers read it, or with its last segment's format suffix cut
    /// ([`format_suffix`]), whichever comes first.
    fn main_position(&self, method: &Method, path: &str) -> Option<usize> {
        let first = Self::matcher(method);
        // Normalised once for all the routes: segments borrowed from `path` unless they carry an
        // escape.
        let written = normalise(path);
        let as_written = first(&self.routes, &written, true);
        // Only a route before that one can come first in the lenient reading; none when it is
        // the first route (or there are no routes), and nothing to read again for the most
        // paths, which that reading cannot change.
        let before = self.routes.get(..as_written.unwrap_or(self.routes.len()))?;
        let upper = upper_case(method);
        let m = upper.as_ref().unwrap_or(method);
        let read_leniently = || {
            if !before.iter().any(|r| r.method_matches(m)) {
                return None;
            }
            let read = lenient(path);
            let suffixed = may_have_format_suffix(path);
            // The path reads as written, but a route with capitals may match it without regard
            // to case.
            if read.is_none() && !self.upper_case_literals && !suffixed {
                return None;
            }
            match read.as_deref() {
                // The written reading is read without regard to case and with its suffix cut
                // too: the lenient reading may lose the segment the written one ends in
                // (`/Api/Login/%5C/..`, `/a.b/%5C/..`).
                Some(text) => earliest(
                    later_readings(&first, before, normalise(text), true, suffixed),
                    later_readings(&first, before, written, self.upper_case_literals, suffixed),
                ),
                // The lenient reading is the written one.
                None => later_readings(&first, before, written, self.upper_case_literals, suffixed),
            }
        };
        read_leniently().or(as_written)
    }

    /// The fallback readings' route for `method`, for a path the main readings give none: the
    /// path without its authority when it begins with two separators (then also with its last
    /// segment's format suffix cut, [`format_suffix`]), then with its dot segments kept. An
    /// application that removes dot segments or takes `//` as `/` (Rails, Tomcat) acts on the
    /// main readings' route, so these never override one.
    fn fallback_position(&self, method: &Method, path: &str) -> Option<usize> {
        let two_separators = path.starts_with("//") || path.starts_with("/\\");
        let dots = may_have_dot_segment(path);
        if !two_separators && !dots {
            return None;
        }
        let first = Self::matcher(method);
        let read = lenient(path);
        let text = read.as_deref().unwrap_or(path);
        // As in the main readings, the first route the path or its suffix-cut reading matches
        // (a route that covers another by its format suffix, `/{x}/a` over `/{x}/a.b`, must
        // come first in these readings too).
        let either = |segments: Segments<'_>| {
            let plain = first(&self.routes, &segments, false);
            let cut =
                without_format_suffix(segments).and_then(|read| first(&self.routes, &read, false));
            earliest(plain, cut)
        };
        let without_authority = || either(normalise(network_path(text)?));
        let keeping_dots = || either(segments(text, true));
        two_separators
            .then(without_authority)
            .flatten()
            .or_else(|| dots.then(keeping_dots).flatten())
    }

    /// The routes, in order.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }
}

/// The route among `before` of a path's lenient reading (its `segments`, when `lenient`) and of
/// its format-suffix reading (with `suffixed`, the same segments with the last one's suffix cut,
/// [`format_suffix`]), whichever comes first; `first` finds a route ([`Router::matcher`]).
fn later_readings(
    first: &impl Fn(&[Route], &Segments<'_>, bool) -> Option<usize>,
    before: &[Route],
    segments: Segments<'_>,
    lenient: bool,
    suffixed: bool,
) -> Option<usize> {
    let as_lenient = lenient.then(|| first(before, &segments, false)).flatten();
    // Cut, the format suffix may make an earlier route the path's: the first route either
    // reading matches wins.
    let cut = suffixed
        .then(|| without_format_suffix(segments))
        .flatten()
        .and_then(|read| first(before, &read, false));
    earliest(as_lenient, cut)
}

/// The earlier of two readings' routes (their indices in the routes), or the one there is: the
/// first route any reading of a path matches is the path's.
fn earliest(a: Option<usize>, b: Option<usize>) -> Option<usize> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A path's normalised segments: up to 8 kept inline, so that routing a request allocates
/// nothing for the paths routes are written for.
type Segments<'a> = SmallVec<[Cow<'a, str>; 8]>;

/// Splits a path into normalised segments (see the module docs).
fn normalise(path: &str) -> Segments<'_> {
    segments(path, false)
}

/// Splits a path into segments, escapes decoded ([`decode_segment`]) and empty ones dropped;
/// `.` and `..` removed as RFC 3986 §5.2.4 removes them, or with `keep_dots` kept as the
/// segments WSGI servers, Express and other frameworks that do not remove them route on.
fn segments(path: &str, keep_dots: bool) -> Segments<'_> {
    let mut out = Segments::new();
    for raw in path.split('/') {
        let segment = decode_segment(raw);
        match segment.as_ref() {
            "." | ".." if keep_dots => out.push(segment),
            "" | "." => {}
            ".." => {
                out.pop();
            }
            _ => out.push(segment),
        }
    }
    out
}

/// Whether `path` may hold a `.` or `..` segment, written or escaped (`%2e`): then it is also read
/// with them kept ([`segments`]). A quick test of its bytes; most paths have neither.
fn may_have_dot_segment(path: &str) -> bool {
    path.contains("/.")
        || path.contains("\\.")
        || path
            .as_bytes()
            .windows(3)
            .any(|w| matches!(w, [b'%', b'2', b'e' | b'E']))
}

/// Where `segment`'s format suffix begins: at its first `.` past its first character
/// (`login.json` is `login`, `report.csv.gz` is `report`; a leading dot, as in `.well-known`, is
/// no suffix). Rails routes `/api/login.json` to `/api/login` (every route has an optional
/// `(.:format)`), and Spring's suffix pattern matching `/api/login.*` to it, so a route must hold
/// for the suffixed spellings. `None` when the segment has no such suffix; otherwise the byte
/// offset of its `.`.
fn format_suffix(segment: &str) -> Option<usize> {
    let second = segment.char_indices().nth(1)?.0;
    Some(second + segment.get(second..)?.find('.')?)
}

/// `read` with its last segment's format suffix cut ([`format_suffix`]), shortened where it is
/// (a borrowed segment re-sliced, an owned one truncated); `None` when it has none.
fn without_format_suffix(mut read: Segments<'_>) -> Option<Segments<'_>> {
    let last = read.last_mut()?;
    let cut = format_suffix(last)?;
    match last {
        Cow::Borrowed(segment) => *segment = segment.get(..cut)?,
        Cow::Owned(segment) => segment.truncate(cut),
    }
    Some(read)
}

/// Whether `path` may have a format suffix ([`format_suffix`]) in its last segment once
/// normalised: it has a `.`, written or escaped (`%2e`), anywhere (`/api/login.json/.` and
/// `/api/login.json/;` end in `login.json` as Tomcat reads them). A quick test of its bytes.
fn may_have_format_suffix(path: &str) -> bool {
    path.contains('.')
        || path
            .as_bytes()
            .windows(3)
            .any(|w| matches!(w, [b'%', b'2', b'e' | b'E']))
}

/// `path` as the lenient servers read it: `%2F`, `\\` and `%5C` (either case) made `/`, and each
/// segment's `;` parameters dropped; matched then without regard to case. `None` for a path with
/// none of these and no upper-case letter, which the reading cannot change (most paths: they
/// cost one pass over their bytes); otherwise one allocation.
pub fn lenient(path: &str) -> Option<String> {
    let separator_escape = |s: &str| {
        s.get(..3)
            .is_some_and(|e| e.eq_ignore_ascii_case("%2F") || e.eq_ignore_ascii_case("%5C"))
    };
    let changes = path.char_indices().any(|(i, c)| match c {
        '\\' | ';' => true,
        '%' => path.get(i..).is_some_and(separator_escape),
        c => c.is_ascii_uppercase(),
    });
    if !changes {
        return None;
    }
    let mut out = String::with_capacity(path.len());
    let mut in_parameters = false;
    let mut rest = path;
    while let Some(c) = rest.chars().next() {
        let (separator, len) = match c {
            _ if separator_escape(rest) => (true, 3),
            '/' | '\\' => (true, 1),
            c => (false, c.len_utf8()),
        };
        if separator {
            out.push('/');
            in_parameters = false;
        } else if c == ';' {
            in_parameters = true;
        } else if !in_parameters {
            out.push(c);
        }
        rest = rest.get(len..).unwrap_or_default();
    }
    Some(out)
}

/// What follows the authority of `path` when it begins with two separators (`//host/rest`, or
/// `/\host/rest` read leniently): a URL parser given such a request target reads it as a
/// network-path reference (RFC 3986 §4.2), so `host` becomes the authority and `/rest` the path.
/// An origin-form target is an absolute path, never that (RFC 9112 §3.2.1), but Node's
/// documented `new URL(req.url, base)` and Python's `urlsplit` read it so: through door,
/// `//x/api/login` would reach their `/api/login` unlimited. `None` for any other path (most:
/// two bytes compared).
fn network_path(path: &str) -> Option<&str> {
    // WHATWG URL parsers skip any further separators before the host (`///x/api` is `x`'s
    // `/api` to Node).
    let rest = path.strip_prefix("//")?.trim_start_matches('/');
    Some(rest.find('/').map_or("/", |i| rest.get(i..).unwrap_or("/")))
}

/// The fields in which a client names the method an application should act on instead of the
/// request's (`X-HTTP-Method-Override`: Rack's `MethodOverride`, in Rails' default stack,
/// Express's `method-override`, Flask's documented middleware; `X-HTTP-Method`: OData;
/// `X-Method-Override`).
pub(crate) static METHOD_OVERRIDES: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

/// The methods a request names for the application to act on instead of its own
/// ([`method_override`]), in the order they are tried. Two inline: most requests name none.
pub type Overrides = SmallVec<[Method; 2]>;

/// The query parameter in which a `POST` names the method an application should act on instead
/// (read as PHP reads names, [`is_method_parameter`]):
/// Express's `method-override('_method')` reads it there, and Symfony's `Request::getMethod` (so
/// Laravel, which turns it on) reads it from the query when the form body has none.
const METHOD_PARAMETER: &str = "_method";

/// The methods a request asks the application to act on instead of its own `method`, for
/// [`Router::route_for_either`]: a route limited for `DELETE` must hold for a `POST` that says
/// it is one. First each of `headers`' override fields (`METHOD_OVERRIDES`, in that order;
/// a list's first item); then, for a `POST` (in any case), each `_method` parameter of `query`,
/// decoded as a form decodes it (`%5Fmethod`, `+`) and named as PHP names it (`.method` too),
/// in order; of these, each method `wanted` (the router's [`Router::lists`]), once:
/// frameworks differ on which of two they take (PHP's parser keeps the last, Express's the
/// first), so each is tried. Empty when there is none (most requests: three header lookups, and
/// for a `POST` with a query one scan of it).
pub fn method_override(
    method: &Method,
    query: Option<&str>,
    headers: &http::HeaderMap,
    wanted: impl Fn(&Method) -> bool,
) -> Overrides {
    // Express's `method-override` takes a field's text before its first comma, trimmed.
    let first_item = |v: &[u8]| {
        let item = v.split(|b| *b == b',').next().unwrap_or_default();
        Method::from_bytes(item.trim_ascii()).ok()
    };
    // Each field's: an application may read any one of them (OData's `X-HTTP-Method` beside
    // Rack's `X-HTTP-Method-Override`).
    let mut out = Overrides::new();
    for m in METHOD_OVERRIDES
        .iter()
        .filter_map(|name| headers.get(name))
        .filter_map(|v| first_item(v.as_bytes()))
    {
        if wanted(&m) && !out.contains(&m) {
            out.push(m);
        }
    }
    let post = method.as_str().eq_ignore_ascii_case("POST");
    if let Some(query) = query.filter(|q| post && may_name_parameter(q)) {
        for (_, value) in
            form_urlencoded::parse(query.as_bytes()).filter(|(name, _)| is_method_parameter(name))
        {
            if let Ok(m) = Method::from_bytes(value.as_bytes())
                && wanted(&m)
                && !out.contains(&m)
            {
                out.push(m);
            }
        }
    }
    out
}

/// Whether a query parameter named `name` (decoded) is `_method` as PHP reads names: leading
/// spaces dropped, then `.`, ` ` and `[` become `_` (`.method=DELETE` and `+_method=DELETE` are
/// Laravel's and Symfony's `_method`), as [`crate::client::credential`] reads cookie names.
fn is_method_parameter(name: &str) -> bool {
    // PHP drops a name's leading spaces before it reads the rest.
    name.trim_start_matches(' ')
        .strip_prefix(['_', '.', ' ', '['])
        .is_some_and(|rest| rest == &METHOD_PARAMETER[1..])
}

/// Whether `query` may hold a `_method` parameter: it has `method` as written, or an escape
/// that could spell it. A quick test; most queries have neither.
fn may_name_parameter(query: &str) -> bool {
    query.contains('%') || query.contains(&METHOD_PARAMETER[1..])
}

/// Decodes a segment's `%XX` escapes as applications decode a path before routing it (RFC 3986
/// §6.2.2.2 makes that the rule for unreserved characters; Django, Express, Rails and the rest
/// decode every escape): `/caf%C3%A9` is `/café`, `/a%3Ab` is `/a:b`. Kept as written, hex digits
/// upper-cased (§6.2.2.1), are the escapes whose decoding would change what the path says to
/// door: `%2F` and `%5C` (separators in the lenient reading, [`lenient`]), `%3B` (a parameter
/// there), `%25` (decoded, it would start another escape), `%3F` and `%23` (no raw `?` or `#` is
/// in a path), `%7B` and `%7D` (a pattern's braces make a wildcard), and bytes that are not
/// UTF-8. A segment without `%` is returned as it is.
fn decode_segment(segment: &str) -> Cow<'_, str> {
    if !segment.contains('%') {
        return Cow::Borrowed(segment);
    }
    let escape = |i: usize| match (
        segment.as_bytes().get(i),
        segment.as_bytes().get(i + 1).copied().and_then(hex),
        segment.as_bytes().get(i + 2).copied().and_then(hex),
    ) {
        (Some(b'%'), Some(h), Some(l)) => Some(h * 16 + l),
        _ => None,
    };
    let kept = |b: u8| matches!(b, b'/' | b'\\' | b';' | b'%' | b'?' | b'#' | b'{' | b'}');
    let mut out: Vec<u8> = Vec::with_capacity(segment.len());
    let write_escaped = |out: &mut Vec<u8>, b: u8| {
        let digits = b"0123456789ABCDEF";
        out.push(b'%');
        out.extend(digits.get(usize::from(b >> 4)));
        out.extend(digits.get(usize::from(b & 15)));
    };
    let mut run = Vec::new();
    let mut i = 0;
    while i < segment.len() {
        match escape(i) {
            Some(b) if b.is_ascii() => {
                if kept(b) {
                    write_escaped(&mut out, b);
                } else {
                    out.push(b);
                }
                i += 3;
            }
            Some(_) => {
                // A run of escaped bytes above 0x7F: decoded where they are UTF-8.
                run.clear();
                while let Some(b) = escape(i).filter(|b| !b.is_ascii()) {
                    run.push(b);
                    i += 3;
                }
                for chunk in run.utf8_chunks() {
                    out.extend_from_slice(chunk.valid().as_bytes());
                    for &b in chunk.invalid() {
                        write_escaped(&mut out, b);
                    }
                }
            }
            None => {
                // Not an escape: copy one UTF-8 character.
                let Some(c) = segment.get(i..).and_then(|rest| rest.chars().next()) else {
                    break;
                };
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                i += c.len_utf8();
            }
        }
    }
    // Valid by construction: whole characters of `segment`, ASCII, and checked UTF-8 runs.
    Cow::Owned(
        String::from_utf8(out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
    )
}

fn hex(b: u8) -> Option<u8> {
    char::from(b)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router() -> Router {
        Router::new(vec![
            Route::new("webhook", &["POST".into()], "/webhooks/github").unwrap(),
            Route::new("link", &["GET".into()], "/l/session/{id}").unwrap(),
            Route::new("health", &[], "/healthz").unwrap(),
            Route::new("link", &[], "/l/{a}/x/{b}").unwrap(),
        ])
    }

    #[test]
    fn exact_paths_and_methods() {
        let r = router();
        assert_eq!(
            r.group_for(&Method::POST, "/webhooks/github"),
            Some("webhook")
        );
        assert_eq!(r.group_for(&Method::GET, "/webhooks/github"), None);
        assert_eq!(r.group_for(&Method::POST, "/webhooks/gitlab"), None);
        assert_eq!(r.group_for(&Method::GET, "/healthz"), Some("health"));
        assert_eq!(r.group_for(&Method::DELETE, "/healthz"), Some("health"));
        assert_eq!(r.group_for(&Method::GET, "/"), None);
    }

    #[test]
    fn wildcards_match_exactly_one_segment() {
        let r = router();
        assert_eq!(r.group_for(&Method::GET, "/l/session/abc"), Some("link"));
        assert_eq!(r.group_for(&Method::GET, "/l/session"), None);
        assert_eq!(r.group_for(&Method::GET, "/l/session/abc/more"), None);
        assert_eq!(r.group_for(&Method::POST, "/l/1/x/2"), Some("link"));
        assert_eq!(r.group_for(&Method::POST, "/l/1/y/2"), None);
    }

    #[test]
    fn first_match_wins() {
        let r = Router::new(vec![
            Route::new("health", &[], "/l/session/special").unwrap(),
            Route::new("link", &[], "/l/session/{id}").unwrap(),
        ]);
        assert_eq!(
            r.group_for(&Method::GET, "/l/session/special"),
            Some("health")
        );
        assert_eq!(r.group_for(&Method::GET, "/l/session/other"), Some("link"));
    }

    /// A target that begins with two separators is, to a URL parser (Node's `new URL(req.url,
    /// base)`, Python's `urlsplit`), an authority and a path: `//x/webhooks/github` is
    /// `/webhooks/github` there, and must be limited as that.
    #[test]
    fn a_network_path_reference_is_read_without_its_authority() {
        let r = router();
        for spelling in [
            "//x/webhooks/github",
            "//x:1/webhooks/github",
            "//user@x/webhooks/github",
            "/\\x/webhooks/github",
            "/\\x\\webhooks\\github",
            "///webhooks/github",
            "//X/Webhooks/GitHub",
            // Node's URL parser skips further separators before the host.
            "///x/webhooks/github",
            "////x/webhooks/github",
            "/\\/x/webhooks/github",
            "/\\\\x/webhooks/github",
        ] {
            assert_eq!(
                r.group_for(&Method::POST, spelling),
                Some("webhook"),
                "{spelling}"
            );
        }
        // Read so only when no other reading has a route: a route matching the path as written
        // (which Rails and Tomcat act on) wins, even one listed later.
        let both = Router::new(vec![
            Route::new("link", &[], "/webhooks/github").unwrap(),
            Route::new("webhook", &[], "/x/webhooks/github").unwrap(),
        ]);
        assert_eq!(
            both.group_for(&Method::POST, "//x/webhooks/github"),
            Some("webhook")
        );
        let page = Router::new(vec![
            Route::new("page", &[], "/{page}").unwrap(),
            Route::new("login", &[], "/api/login").unwrap(),
        ]);
        assert_eq!(page.group_for(&Method::POST, "//api/login"), Some("login"));
        // One separator: no authority.
        assert_eq!(r.group_for(&Method::POST, "/x/webhooks/github"), None);
        assert_eq!(network_path("//host"), Some("/"));
        assert_eq!(network_path("///host/a"), Some("/a"));
        assert_eq!(network_path("/a//b"), None);
    }

    /// A `.` or `..` segment, written or escaped, which RFC 3986 removes but WSGI servers and
    /// Express route on (`/l/session/%2e` is the session `.` to them), is read as a segment when
    /// the path has no route otherwise; a path that does keeps its route.
    #[test]
    fn dot_segments_are_kept_when_the_path_has_no_route_otherwise() {
        let r = router();
        for spelling in [
            "/l/session/%2e",
            "/l/session/%2E",
            "/l/session/.",
            "/l/session/..",
            "/l/session/%2e%2E",
            "/l/session\\%2e",
        ] {
            assert_eq!(
                r.group_for(&Method::GET, spelling),
                Some("link"),
                "{spelling}"
            );
        }
        assert_eq!(
            r.group_for(&Method::GET, "/l/x/../session/abc"),
            Some("link")
        );
        let strict = Router::new(vec![
            Route::new("lax", &[], "/{a}/{b}/{c}").unwrap(),
            Route::new("strict", &[], "/api/login").unwrap(),
        ]);
        assert_eq!(
            strict.group_for(&Method::GET, "/api/./login"),
            Some("strict")
        );
        assert_eq!(
            strict.group_for(&Method::GET, "/api/%2e/login"),
            Some("strict")
        );
        assert!(!may_have_dot_segment("/l/session/abc.json"));
        assert!(may_have_dot_segment("/l/.hidden"));
    }

    /// A request whose own method has no route is routed under the method it names in a
    /// method-override field, as Rails, Express and Flask's documented middleware act on it; its
    /// own method's route wins whenever there is one, since most applications ignore the field.
    #[test]
    fn a_method_override_is_routed_only_when_the_method_has_no_route() {
        let group = |r: &Router, m: &Method, over: Option<&str>, path: &str| {
            r.route_for_either(
                m,
                || {
                    over.map(|o| Method::from_bytes(o.as_bytes()).unwrap())
                        .into_iter()
                        .collect()
                },
                path,
            )
            .map(|r| r.group.clone())
        };
        let r = Router::new(vec![
            Route::new("login", &["DELETE".into()], "/api/login").unwrap(),
        ]);
        assert!(r.method_specific());
        assert_eq!(
            group(&r, &Method::POST, Some("DELETE"), "/api/login").as_deref(),
            Some("login")
        );
        assert_eq!(
            group(&r, &Method::POST, Some("delete"), "/api/login").as_deref(),
            Some("login")
        );
        assert_eq!(group(&r, &Method::POST, None, "/api/login"), None);
        // The request's own method has a route: that one, whatever the field says.
        let r = Router::new(vec![
            Route::new("lax", &["GET".into()], "/api/{x}").unwrap(),
            Route::new("strict", &["POST".into()], "/api/login").unwrap(),
        ]);
        assert_eq!(
            group(&r, &Method::POST, Some("GET"), "/api/login").as_deref(),
            Some("strict")
        );
        // The override's main readings come before the fallback readings of either method:
        // Rails reads `//api/account` as `/api/account` and acts on the DELETE.
        let account = Router::new(vec![
            Route::new("account", &["DELETE".into()], "/api/account").unwrap(),
            Route::new("pages", &[], "/{page}").unwrap(),
        ]);
        assert_eq!(
            group(&account, &Method::POST, Some("DELETE"), "//api/account").as_deref(),
            Some("account")
        );
        assert_eq!(
            group(&account, &Method::POST, None, "//api/account").as_deref(),
            Some("pages")
        );
        // The field is not even looked for then.
        let looked = std::cell::Cell::new(false);
        let _ = r.route_for_either(
            &Method::POST,
            || {
                looked.set(true);
                Overrides::new()
            },
            "/api/login",
        );
        assert!(!looked.get());
        // Every field, and a value that is no method.
        let names = |o: Overrides| o.iter().map(ToString::to_string).collect::<Vec<_>>();
        let mut headers = http::HeaderMap::new();
        assert!(method_override(&Method::POST, None, &headers, |_| true).is_empty());
        for name in &METHOD_OVERRIDES {
            headers.clear();
            headers.insert(name, http::HeaderValue::from_static("delete"));
            assert_eq!(
                names(method_override(&Method::POST, None, &headers, |_| true)),
                ["delete"],
                "{name}"
            );
        }
        // A list: its first item, as Express's `method-override` reads it.
        for list in ["DELETE, PUT", " delete ,", "DELETE,"] {
            headers.clear();
            headers.insert(
                "x-http-method-override",
                http::HeaderValue::from_static(list),
            );
            assert_eq!(
                names(method_override(&Method::POST, None, &headers, |_| true))
                    .iter()
                    .map(|m| m.to_ascii_uppercase())
                    .collect::<Vec<_>>(),
                ["DELETE"],
                "{list}"
            );
        }
        headers.clear();
        headers.insert(
            "x-http-method-override",
            http::HeaderValue::from_static("DE LETE"),
        );
        assert!(method_override(&Method::POST, None, &headers, |_| true).is_empty());
        assert!(!router_without_methods().method_specific());
    }

    /// A literal route holds for its format-suffixed spellings (`/api/login.json`), which Rails
    /// and Spring route to it, when no route takes them as written; a route written with the
    /// suffix, or one that matches first, still decides.
    #[test]
    fn a_format_suffix_is_cut_when_the_path_has_no_route_otherwise() {
        let r = Router::new(vec![
            Route::new("robots", &[], "/robots.txt").unwrap(),
            Route::new("pages", &[], "/{page}").unwrap(),
            Route::new("export", &["GET".into()], "/api/items.csv").unwrap(),
            Route::new("items", &["GET".into()], "/api/items").unwrap(),
            Route::new("login", &["POST".into()], "/api/login").unwrap(),
        ]);
        let post = |path: &str| r.group_for(&Method::POST, path);
        let get = |path: &str| r.group_for(&Method::GET, path);
        for path in [
            "/api/login.json",
            "/api/login.xml",
            "/API/LOGIN.JSON",
            "/api/login%2Ejson",
            "/api/login.v1.json",
            "/api/login.json/",
            "//x/api/login.json",
            "/api/login.json/.",
            "/api/login.json/./",
            "/api/login.json;x",
            "//x/api/login.json/.",
        ] {
            assert_eq!(post(path), Some("login"), "{path}");
        }
        // Kept dot segments too: an application that keeps them takes `.` for the wildcard.
        let dotted = Router::new(vec![Route::new("g", &[], "/{x}/a").unwrap()]);
        for path in ["/./a.b", "/%2e/a.json", "/../a.b"] {
            assert_eq!(dotted.group_for(&Method::GET, path), Some("g"), "{path}");
        }
        // A specific route listed before a wildcard one holds for the suffixed spelling too, as
        // for the lenient reading: the first route either reading matches wins.
        let lax = Router::new(vec![
            Route::new("login", &["POST".into()], "/api/login").unwrap(),
            Route::new("lax", &[], "/api/{endpoint}").unwrap(),
        ]);
        // The written reading's suffix is cut too: the lenient reading of the last path takes
        // `%5C` for a separator, and its `..` then removes `login.json`.
        for path in [
            "/api/login.json",
            "/API/LOGIN.JSON",
            "/API/login.json;x",
            "/api/login.json/%5C/..",
        ] {
            assert_eq!(lax.group_for(&Method::POST, path), Some("login"), "{path}");
        }
        // A route with capitals holds, without regard to case, for the written reading of a
        // path whose lenient reading loses its last segment.
        let capitals = Router::new(vec![
            Route::new("login", &["POST".into()], "/Api/Login").unwrap(),
            Route::new("lax", &[], "/api/{endpoint}").unwrap(),
        ]);
        for path in ["/api/login", "/api/login/%5C/..", "/api/login/%2F/.."] {
            assert_eq!(
                capitals.group_for(&Method::POST, path),
                Some("login"),
                "{path}"
            );
        }
        assert_eq!(lax.group_for(&Method::POST, "/api/other.json"), Some("lax"));
        assert_eq!(lax.group_for(&Method::GET, "/api/login.json"), Some("lax"));
        // A segment that begins with a character outside ASCII is cut past it too.
        let r2 = Router::new(vec![Route::new("e", &[], "/api/é").unwrap()]);
        assert_eq!(r2.group_for(&Method::GET, "/api/%C3%A9.json"), Some("e"));
        assert_eq!(r2.group_for(&Method::GET, "/api/é.json"), Some("e"));
        assert_eq!(post("/api/logins.json"), None);
        assert_eq!(post("/api/.json"), None, "a leading dot is no suffix");
        // Written with the suffix and listed first, or matched as written: that route.
        assert_eq!(get("/api/items.csv"), Some("export"));
        // Listed after the route without the suffix, it would never decide: refused as
        // shadowed.
        let items = Route::new("items", &["GET".into()], "/api/items").unwrap();
        let export = Route::new("export", &["GET".into()], "/api/items.csv").unwrap();
        assert_eq!(
            export.shadowed_by(std::slice::from_ref(&items)),
            Some(vec![0])
        );
        assert_eq!(items.shadowed_by(std::slice::from_ref(&export)), None);
        assert_eq!(get("/api/items.json"), Some("items"));
        assert_eq!(get("/robots.txt"), Some("robots"));
        assert_eq!(get("/index.html"), Some("pages"));
        // A method override's route is found the same way.
        let route = r.route_for_either(
            &Method::PUT,
            || Overrides::from_iter([Method::POST]),
            "/api/login.json",
        );
        assert_eq!(route.map(|r| r.group.as_str()), Some("login"));
        assert_eq!(format_suffix("login.json"), Some(5));
        assert_eq!(format_suffix("é.json"), Some(2));
        assert_eq!(format_suffix(".well-known"), None);
        assert_eq!(format_suffix("login"), None);
        assert!(!may_have_format_suffix("/api/login"));
        assert!(may_have_format_suffix("/api/login%2ejson"));
    }

    /// A `POST` naming a method in its query's `_method` parameter (Express's
    /// `method-override('_method')`, Symfony and Laravel) is routed under it, every such
    /// parameter tried; a field comes first; other methods' queries are not read.
    #[test]
    fn a_method_named_in_the_query_is_routed_like_a_field() {
        let names = |o: Overrides| o.iter().map(ToString::to_string).collect::<Vec<_>>();
        let none = http::HeaderMap::new();
        let over = |m: &Method, q: &str| names(method_override(m, Some(q), &none, |_| true));
        assert_eq!(over(&Method::POST, "_method=DELETE"), ["DELETE"]);
        assert_eq!(over(&Method::POST, "a=1&_method=delete&b=2"), ["delete"]);
        // Decoded as a form is: an escaped name, a `+`-less value; named as PHP names it.
        assert_eq!(over(&Method::POST, "%5Fmethod=PUT"), ["PUT"]);
        assert_eq!(over(&Method::POST, "_%6Dethod=PATCH"), ["PATCH"]);
        assert_eq!(over(&Method::POST, ".method=PUT"), ["PUT"]);
        assert_eq!(over(&Method::POST, "%2Emethod=PUT"), ["PUT"]);
        // PHP drops a name's leading spaces first: ` method` is `method` there, not `_method`.
        assert!(over(&Method::POST, "+method=PUT").is_empty());
        assert_eq!(over(&Method::POST, "[method=PUT"), ["PUT"]);
        assert_eq!(over(&Method::POST, "+_method=PUT"), ["PUT"]);
        assert_eq!(over(&Method::POST, "%20%20.method=PUT"), ["PUT"]);
        // Each of two, in order, once; a value that is no method is skipped.
        assert_eq!(
            over(
                &Method::POST,
                "_method=GET&_method=DE+LETE&_method=DELETE&_method=GET"
            ),
            ["GET", "DELETE"]
        );
        // A `post` in lower case is a POST.
        let post = Method::from_bytes(b"post").unwrap();
        assert_eq!(over(&post, "_method=DELETE"), ["DELETE"]);
        // Other names, and other methods, are not read.
        assert!(
            over(
                &Method::POST,
                "method=DELETE&x_method=DELETE&_METHOD=DELETE"
            )
            .is_empty()
        );
        assert!(over(&Method::GET, "_method=DELETE").is_empty());
        assert!(method_override(&Method::POST, None, &none, |_| true).is_empty());
        // Only the methods wanted (the router's listed ones) are kept.
        let only_delete = |m: &Method| *m == Method::DELETE;
        assert_eq!(
            names(method_override(
                &Method::POST,
                Some("_method=GET&_method=X&_method=DELETE"),
                &none,
                only_delete
            )),
            ["DELETE"]
        );
        // Every field is read, each for a method a route lists.
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "x-http-method-override",
            http::HeaderValue::from_static("PUT"),
        );
        headers.insert("x-http-method", http::HeaderValue::from_static("DELETE"));
        headers.insert("x-method-override", http::HeaderValue::from_static("PUT"));
        assert_eq!(
            names(method_override(&Method::POST, None, &headers, |_| true)),
            ["PUT", "DELETE"]
        );
        let only_delete = |m: &Method| *m == Method::DELETE;
        assert_eq!(
            names(method_override(&Method::POST, None, &headers, only_delete)),
            ["DELETE"]
        );
        // A field's method comes first.
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "x-http-method-override",
            http::HeaderValue::from_static("PUT"),
        );
        assert_eq!(
            names(method_override(
                &Method::POST,
                Some("_method=DELETE"),
                &headers,
                |_| true
            )),
            ["PUT", "DELETE"]
        );
        // Routed: the DELETE route holds for the POST, whichever parameter names it.
        let r = Router::new(vec![
            Route::new("items", &["DELETE".into()], "/api/items/{id}").unwrap(),
        ]);
        for q in [
            "_method=DELETE",
            "_method=GET&_method=DELETE",
            "_method=DELETE&_method=GET",
        ] {
            let route = r.route_for_either(
                &Method::POST,
                || method_override(&Method::POST, Some(q), &none, |m| r.lists(m)),
                "/api/items/1",
            );
            assert_eq!(route.map(|r| r.group.as_str()), Some("items"), "{q}");
        }
        let route = r.route_for_either(
            &Method::POST,
            || method_override(&Method::POST, Some("_method=PUT"), &none, |m| r.lists(m)),
            "/api/items/1",
        );
        assert!(route.is_none());
        // Thousands of parameters: only the listed methods are kept and tried, each once.
        let many = "_method=GET&_method=X&".repeat(5_000) + "_method=delete";
        let kept = method_override(&Method::POST, Some(&many), &none, |m| r.lists(m));
        assert_eq!(names(kept), ["delete"]);
    }

    /// The router knows the methods its routes list, `HEAD` with `GET`, in any case.
    #[test]
    fn the_router_lists_its_routes_methods() {
        let r = Router::new(vec![
            Route::new("a", &["get".into(), "DELETE".into()], "/a").unwrap(),
            Route::new("b", &[], "/b").unwrap(),
        ]);
        for m in ["GET", "get", "HEAD", "DELETE", "delete"] {
            assert!(r.lists(&Method::from_bytes(m.as_bytes()).unwrap()), "{m}");
        }
        for m in ["POST", "PUT", "X"] {
            assert!(!r.lists(&Method::from_bytes(m.as_bytes()).unwrap()), "{m}");
        }
    }

    fn router_without_methods() -> Router {
        Router::new(vec![Route::new("health", &[], "/healthz").unwrap()])
    }

    #[test]
    fn head_follows_get() {
        assert_eq!(
            router().group_for(&Method::HEAD, "/l/session/abc"),
            Some("link")
        );
        assert_eq!(router().group_for(&Method::HEAD, "/webhooks/github"), None);
    }

    #[test]
    fn a_method_in_lower_case_is_still_limited() {
        for spelling in ["get", "Get", "head"] {
            let method = Method::from_bytes(spelling.as_bytes()).unwrap();
            assert_eq!(
                router().group_for(&method, "/l/session/abc"),
                Some("link"),
                "{spelling}"
            );
        }
        let post = Method::from_bytes(b"post").unwrap();
        assert_eq!(
            router().group_for(&post, "/webhooks/github"),
            Some("webhook")
        );
        assert_eq!(router().group_for(&post, "/l/session/abc"), None);
    }

    #[test]
    fn path_spellings_cannot_step_around_a_limited_route() {
        let r = router();
        for path in [
            "/webhooks/github/",
            "//webhooks//github",
            "/webhooks/./github",
            "/webhooks/x/../github",
            "/%77ebhooks/github",
            "/webhooks/%67ithub",
        ] {
            assert_eq!(r.group_for(&Method::POST, path), Some("webhook"), "{path}");
        }
        // A path is also read as the lenient servers read it:
        // encoded slashes (WSGI), backslashes (WHATWG URL parsers), `;` parameters (Tomcat),
        // letters in any case (Express, ASP.NET).
        for path in [
            "/webhooks%2Fgithub",
            "/webhooks%2fgithub",
            "/x%2F..%2Fwebhooks/github",
            "/webhooks\\github",
            "/webhooks%5Cgithub",
            "\\webhooks%5cgithub",
            "/webhooks;jsessionid=1/github;x",
            "/WebHooks/GitHub",
            "/WEBHOOKS%2FGITHUB;A=B",
        ] {
            assert_eq!(r.group_for(&Method::POST, path), Some("webhook"), "{path}");
        }
        for other in [
            "/webhooks%3Agithub",
            "/webhooks/githubx",
            "/web;hooks/github",
        ] {
            assert_eq!(r.group_for(&Method::POST, other), None, "{other}");
        }
    }

    #[test]
    fn only_a_path_the_lenient_reading_could_change_is_read_again() {
        assert_eq!(lenient("/api/v1/users/42"), None);
        assert_eq!(lenient("/caf\u{e9}/x-y_z.~"), None);
        assert_eq!(
            lenient("/a%2fb%5Cc\\d;p=1/e").as_deref(),
            Some("/a/b/c/d/e")
        );
        assert_eq!(lenient("/A/%20").as_deref(), Some("/A/%20"));
        assert_eq!(lenient("/x/%20/%2"), None);
        assert_eq!(lenient("/a;b;c/d;").as_deref(), Some("/a/d"));
        assert_eq!(
            lenient("/\u{e9}%2F\u{e9}").as_deref(),
            Some("/\u{e9}/\u{e9}")
        );
    }

    /// The first route matching either reading wins: a route listed first keeps a path that
    /// matches it as written, and a specific route listed before a wildcard one holds for the
    /// spellings a lenient server reads as its path.
    #[test]
    fn the_first_route_matching_either_reading_wins() {
        let r = Router::new(vec![
            Route::new("upper", &[], "/Files/x").unwrap(),
            Route::new("a", &[], "/files/{name}").unwrap(),
            Route::new("b", &[], "/files/{dir}/{name}").unwrap(),
            Route::new("login", &["POST".to_owned()], "/api/login").unwrap(),
            Route::new("api", &[], "/api/{endpoint}").unwrap(),
            Route::new("caps", &[], "/Admin/Login").unwrap(),
        ]);
        assert_eq!(r.group_for(&Method::GET, "/files/a%2Fb"), Some("a"));
        assert_eq!(r.group_for(&Method::GET, "/files/a/b"), Some("b"));
        assert_eq!(r.group_for(&Method::GET, "/files%2Fa%2Fb"), Some("b"));
        assert_eq!(r.group_for(&Method::GET, "/Files/x"), Some("upper"));
        assert_eq!(r.group_for(&Method::GET, "/FILES/X"), Some("upper"));
        // A route written with capitals holds for a path in lower case too.
        assert_eq!(r.group_for(&Method::GET, "/files/x"), Some("upper"));
        assert_eq!(r.group_for(&Method::GET, "/admin/login"), Some("caps"));
        assert_eq!(r.group_for(&Method::GET, "/files/y"), Some("a"));
        assert_eq!(r.group_for(&Method::GET, "/FILES/X/y"), Some("b"));
        for path in ["/api/login", "/api/LOGIN", "/api/login;x=1", "/API%2Flogin"] {
            assert_eq!(r.group_for(&Method::POST, path), Some("login"), "{path}");
        }
        // The specific route's methods still apply: another method's spelling is the wildcard's.
        assert_eq!(r.group_for(&Method::GET, "/api/LOGIN"), Some("api"));
        assert_eq!(r.group_for(&Method::POST, "/api/Logout"), Some("api"));
    }

    #[test]
    fn bad_patterns_are_refused() {
        assert_eq!(
            PathPattern::parse("healthz"),
            Err(RouteError::NotAbsolute("healthz".into()))
        );
        assert!(matches!(
            PathPattern::parse("/l/x{id}"),
            Err(RouteError::BadWildcard { .. })
        ));
        assert!(matches!(
            PathPattern::parse("/l/{}"),
            Err(RouteError::BadWildcard { .. })
        ));
        // Other routers' catch-all and optional wildcards match more than one segment, or none.
        for (path, segment) in [
            ("/w/{*rest}", "{*rest}"),
            ("/w/{**rest}", "{**rest}"),
            ("/users/{id?}", "{id?}"),
            ("/p/{id:int}", "{id:int}"),
            ("/p/{ id }", "{ id }"),
        ] {
            let err = PathPattern::parse(path).unwrap_err();
            assert_eq!(
                err,
                RouteError::WildcardName {
                    path: path.into(),
                    segment: segment.into()
                }
            );
            assert!(err.to_string().contains("exactly one segment"), "{err}");
        }
        for path in ["/a/{id}", "/a/{user_id}/{Post-Slug9}"] {
            assert!(PathPattern::parse(path).is_ok(), "{path}");
        }
        // A request's query is not part of its path; a space or a tab arrives percent-encoded.
        for (path, found) in [
            ("/q?x=1", '?'),
            ("/a#b", '#'),
            ("/a b", ' '),
            ("/a\tb", '\t'),
        ] {
            assert_eq!(
                PathPattern::parse(path),
                Err(RouteError::NeverMatches {
                    path: path.into(),
                    found
                }),
                "{path}"
            );
        }
        assert!(PathPattern::parse("/a/%C3%BC/{id}/~x!$&'()*+,;=:@").is_ok());
        // Sent raw by some clients, and accepted by hyper: it can match.
        assert!(PathPattern::parse("/ü").is_ok_and(|p| p.matches("/ü")));
        assert_eq!(
            Route::new("link", &["GE T".into()], "/x").unwrap_err(),
            RouteError::BadMethod("GE T".into())
        );
        for connect in ["CONNECT", "connect"] {
            let err = Route::new("link", &[connect.into()], "/x").unwrap_err();
            assert_eq!(err, RouteError::ConnectNeverRouted(connect.into()));
            assert!(err.to_string().contains("list GET"), "{err}");
        }
        let long = "M".repeat(33);
        assert_eq!(
            Route::new("link", std::slice::from_ref(&long), "/x").unwrap_err(),
            RouteError::BadMethod(long)
        );
    }

    /// Escapes are decoded as applications decode them: a route written with UTF-8 or a reserved
    /// character holds for the escaped spelling browsers send, and the other way round. Escapes
    /// that would change the path's structure stay escapes.
    #[test]
    fn escaped_and_raw_spellings_match_the_same_route() {
        let r = Router::new(vec![
            Route::new("e", &[], "/\u{e9}/{id}").unwrap(),
            Route::new("n", &[], "/%C3%B1/{id}").unwrap(),
            Route::new("colon", &[], "/a%3Ab/{id}").unwrap(),
            Route::new("pct", &[], "/p%25/{id}").unwrap(),
        ]);
        // Escaped braces stay escapes: a literal segment, not a wildcard.
        let lit = Router::new(vec![Route::new("lit", &[], "/a/%7Bid%7D").unwrap()]);
        assert_eq!(lit.group_for(&Method::GET, "/a/%7bid%7d"), Some("lit"));
        assert_eq!(lit.group_for(&Method::GET, "/a/anything"), None);
        assert!(PathPattern::parse("/a/x%7B").is_ok());
        for (path, group) in [
            ("/\u{e9}/1", "e"),
            ("/%C3%A9/2", "e"),
            ("/%c3%a9/3", "e"),
            ("/\u{f1}/1", "n"),
            ("/%C3%B1/2", "n"),
            ("/a:b/1", "colon"),
            ("/a%3ab/2", "colon"),
            ("/p%25/1", "pct"),
        ] {
            assert_eq!(r.group_for(&Method::GET, path), Some(group), "{path}");
        }
        // Not decoded: an escaped percent (it would start another escape), bytes that are not
        // UTF-8; and an escaped slash is not a separator as written.
        for path in ["/p%2541/1", "/%C3/1", "/%E9/1", "/a%2Fb/1"] {
            assert_eq!(r.group_for(&Method::GET, path), None, "{path}");
        }
        assert_eq!(decode_segment("%C3%A9%FF%41"), "\u{e9}%FFA");
        assert_eq!(decode_segment("a%2fb%3b%3F%23"), "a%2Fb%3B%3F%23");
    }

    #[test]
    fn non_ascii_and_broken_escapes_do_not_panic() {
        let r = router();
        for path in ["/%", "/%z", "/%e2%82", "/héllo/%ff", "/l/session/%"] {
            let _ = r.group_for(&Method::GET, path);
        }
        assert_eq!(r.group_for(&Method::GET, "/l/session/%"), Some("link"));
    }

    /// A route that [`Route::shadowed_by`] says earlier routes always take is never the route of
    /// any request: every reading, spelling and method override tried, on route tables drawn
    /// from a few segments and methods (so that many routes shadow others).
    mod shadowing {
        use proptest::{collection::vec, prelude::*, sample::select};

        use super::*;

        fn route() -> impl Strategy<Value = Route> {
            (
                vec(select(vec!["a", "A", "b", "a.b", "{x}"]), 0..3),
                vec(select(vec!["GET", "HEAD", "POST"]), 0..3),
            )
                .prop_map(|(segments, methods)| {
                    let methods: Vec<String> = methods.into_iter().map(String::from).collect();
                    Route::new("g", &methods, &format!("/{}", segments.join("/"))).unwrap()
                })
        }

        fn method() -> impl Strategy<Value = Method> {
            select(vec!["GET", "HEAD", "POST", "PUT", "get", "post"])
                .prop_map(|m| Method::from_bytes(m.as_bytes()).unwrap())
        }

        proptest::proptest! {
            #[test]
            fn a_shadowed_route_decides_no_request(
                routes in vec(route(), 1..6),
                requests in vec(
                    (
                        method(),
                        vec(method(), 0..3),
                        vec(select(vec!["a", "A", "b", "c", "%61", ".", "..", "a;p", "//x", "\\", "%2F", "a.json", "A.b.c", "a%2Ex", "b.", "a.b", "a.b.c"]), 0..4),
                    ),
                    1..24,
                ),
            ) {
                let shadowed: Vec<bool> = (0..routes.len())
                    .map(|i| routes[i].shadowed_by(&routes[..i]).is_some())
                    .collect();
                let router = Router::new(routes);
                for (method, overridden, parts) in &requests {
                    let path = format!("/{}", parts.join("/"));
                    let chosen = router.route_for_either(
                        method,
                        || overridden.iter().cloned().collect(),
                        &path,
                    );
                    if let Some(chosen) = chosen {
                        let i = router
                            .routes()
                            .iter()
                            .position(|r| core::ptr::eq(r, chosen))
                            .unwrap();
                        prop_assert!(!shadowed[i], "route[{i}] chose {method} {path}");
                    }
                }
            }
        }
    }
}
