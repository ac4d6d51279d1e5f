//! The client key (docs/design.md, "Client key"): who a request is charged to.
//!
//! The key is the TCP peer, unless the peer is a trusted proxy; then the forwarding chain
//! (`X-Forwarded-For`, or RFC 7239 `Forwarded`) is walked right to left, trusted hops are
//! skipped and the first untrusted address is the client. A malformed entry or an all-trusted
//! chain keys the last trusted hop. Every address is canonicalised (IPv4-mapped IPv6 unmapped,
//! zone stripped) *before* its trust check, and keys are masked by [`PrefixKey::from_ip`]
//! (IPv4 /32, IPv6 /64, NAT64 as its embedded IPv4).
//!
//! Getting this wrong does not fail loudly: a key that is always the proxy turns a per-client
//! limiter into one bucket for everyone, and a key read from client-controlled text lets a client
//! pick its own bucket (docs/troubleshooting.md, "Everyone shares one bucket behind nginx").

use core::fmt;
use core::net::IpAddr;
use core::str::FromStr;

use door_common::PrefixKey;
use http::HeaderMap;
use ipnet::IpNet;

use crate::client::forwarded::{
    Entry, FORWARDED_HEADER, PortSyntax, X_FORWARDED_FOR, forwarded_entries, parse_node,
    xff_entries,
};

/// Errors from reading the trusted-proxy list or the forwarding-header choice.
///
/// Every variant carries the offending value, so that `door` can exit before binding anything
/// with a message an operator can act on (docs/design.md, "Operating contract"). The CIDR
/// variants' messages describe the fault only, and callers prefix the key and the value
/// (`trusted_proxies = "0.0.0.0/0": a /0 covers …`); [`KeyError::BadSource`]'s message quotes the
/// value itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The text is neither an IP address nor `address/length` with a length that fits the family.
    #[error("not an IP address or CIDR (expected e.g. 10.0.0.0/8, 192.0.2.7 or 2001:db8::/48)")]
    BadCidr {
        /// The offending text, trimmed.
        value: String,
    },
    /// A `/0` would trust every address of its family, letting any client choose its own key.
    #[error("a /0 covers every address (as a trusted proxy, any client could choose its own key)")]
    ZeroPrefix {
        /// The offending text (or network, for [`TrustedProxies::from_nets`]).
        value: String,
    },
    /// Bits below the prefix length are set (`192.0.2.1/24`); probably a typo for a host or for
    /// the network.
    #[error("host bits set (did you mean {network}?)")]
    HostBitsSet {
        /// The offending text (or network, for [`TrustedProxies::from_nets`]).
        value: String,
        /// The network with its host bits cleared.
        network: IpNet,
    },
    /// The forwarding-header choice is neither `xff` nor `forwarded`.
    #[error(
        "forwarding header {value:?} is not one of \"xff\" (X-Forwarded-For) or \"forwarded\" (RFC 7239)"
    )]
    BadSource {
        /// The offending text.
        value: String,
    },
}

/// Unmaps an IPv4-mapped IPv6 address (`::ffff:192.0.2.7` → `192.0.2.7`, RFC 4291 §2.5.5.2);
/// every other address is returned unchanged (NAT64 addresses stay IPv6: the translator is a
/// different host from the IPv4 address it embeds).
///
/// Applied to the TCP peer and to every forwarded address before its trust check, so that a
/// dual-stack socket's `::ffff:10.0.0.1` matches a trusted `10.0.0.0/8`. (A zone cannot occur in
/// an [`IpAddr`]; zones in header text are stripped by the parser.)
pub fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// The `trusted_proxies` setting: the networks whose forwarding headers door believes
/// (docs/design.md, "Client key"; `--trusted-proxy` / `DOOR_TRUSTED_PROXIES`).
///
/// Invariants, checked by [`TrustedProxies::parse_list`] and [`TrustedProxies::from_nets`]: no
/// `/0`, no host bits set. IPv4-mapped IPv6 networks (`::ffff:10.0.0.0/104`) are stored as their
/// IPv4 equivalent, because addresses are unmapped before they are looked up. The empty list
/// (the default) trusts no one: every request is keyed on its TCP peer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
}

impl TrustedProxies {
    /// Parses a comma-separated list of CIDRs (`10.0.0.0/8, ::1/128`), the form of
    /// `--trusted-proxy` and `DOOR_TRUSTED_PROXIES`. Spaces and tabs around elements are trimmed
    /// and empty elements skipped, so `""` is the empty list (the configuration refuses empty
    /// elements before they get here). A bare address means a single host (`/32` or `/128`).
    ///
    /// # Errors
    ///
    /// [`KeyError::BadCidr`] for text that is not an address or `address/length` (lengths are
    /// decimal digits within the family's width; zones are refused), [`KeyError::ZeroPrefix`] for
    /// a `/0`, [`KeyError::HostBitsSet`] for `192.0.2.1/24`. The first offending element is named.
    pub fn parse_list(text: &str) -> Result<Self, KeyError> {
        let mut nets = Vec::new();
        for element in text.split(',') {
            let element = element.trim_matches([' ', '\t']);
            if element.is_empty() {
                continue;
            }
            let net = parse_cidr(element).ok_or_else(|| KeyError::BadCidr {
                value: element.to_owned(),
            })?;
            nets.push(check_net(net, element)?);
        }
        Ok(Self { nets })
    }

    /// Builds the list from networks already parsed (the config file's `trusted_proxies`), with
    /// the same checks as [`TrustedProxies::parse_list`].
    ///
    /// # Errors
    ///
    /// [`KeyError::ZeroPrefix`] for a `/0` (including `::ffff:0:0/96`, which is all of IPv4),
    /// [`KeyError::HostBitsSet`] for a network with host bits set.
    pub fn from_nets(nets: Vec<IpNet>) -> Result<Self, KeyError> {
        let nets = nets
            .into_iter()
            .map(|net| check_net(net, &net.to_string()))
            .collect::<Result<_, _>>()?;
        Ok(Self { nets })
    }

    /// Whether `ip`, canonicalised by [`canonical`], is inside one of the networks.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.nets.iter().any(|net| net.contains(&ip))
    }

    /// Whether the list is empty (no proxy is trusted).
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    /// The networks, in configuration order (for the XDP program's exempt map).
    pub fn nets(&self) -> &[IpNet] {
        &self.nets
    }
}

impl fmt::Display for TrustedProxies {
    /// The networks separated by `, ` (`10.0.0.0/8, ::1/128`); the empty list prints nothing.
    /// The output parses back with [`TrustedProxies::parse_list`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, net) in self.nets.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{net}")?;
        }
        Ok(())
    }
}

impl FromStr for TrustedProxies {
    type Err = KeyError;

    /// [`TrustedProxies::parse_list`].
    fn from_str(text: &str) -> Result<Self, KeyError> {
        Self::parse_list(text)
    }
}

/// `address` or `address/length`, strictly: the address by the standard library's parser, the
/// length as 1 to 3 decimal digits (no sign) within the family's width.
fn parse_cidr(text: &str) -> Option<IpNet> {
    let (address, length) = match text.split_once('/') {
        Some((address, length)) => {
            if !(1..=3).contains(&length.len()) || !length.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            (address, Some(length.parse::<u8>().ok()?))
        }
        None => (text, None),
    };
    let address: IpAddr = address.parse().ok()?;
    let length = length.unwrap_or(match address {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    });
    IpNet::new(address, length).ok()
}

/// Normalises an IPv4-mapped network to IPv4 and enforces the invariants; `shown` names the
/// value in errors.
fn check_net(net: IpNet, shown: &str) -> Result<IpNet, KeyError> {
    let net = unmap_net(net);
    if net.prefix_len() == 0 {
        return Err(KeyError::ZeroPrefix {
            value: shown.to_owned(),
        });
    }
    if net.trunc() != net {
        return Err(KeyError::HostBitsSet {
            value: shown.to_owned(),
            network: net.trunc(),
        });
    }
    Ok(net)
}

/// `::ffff:a.b.c.d/n` with `n ≥ 96` becomes `a.b.c.d/(n-96)`; anything else is unchanged.
fn unmap_net(net: IpNet) -> IpNet {
    if let IpNet::V6(v6) = net
        && let Some(v4) = v6.addr().to_ipv4_mapped()
        && let Some(length) = v6.prefix_len().checked_sub(96)
        && let Ok(mapped) = IpNet::new(IpAddr::V4(v4), length)
    {
        return mapped;
    }
    net
}

/// Which forwarding header is authoritative when a request from a trusted proxy carries both
/// `X-Forwarded-For` and `Forwarded` (RFC 7239). When only one is present, that one is used.
///
/// Set it to the header your proxy *writes*: a client can always add the other one, and if the
/// proxy does not overwrite it, a wrong choice reads client text (see `docs/decisions.md`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ForwardedSource {
    /// `X-Forwarded-For` (the default).
    #[default]
    Xff,
    /// RFC 7239 `Forwarded`, its `for=` parameter (§5.2).
    Forwarded,
}

impl fmt::Display for ForwardedSource {
    /// The header name: `X-Forwarded-For` or `Forwarded`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Xff => "X-Forwarded-For",
            Self::Forwarded => "Forwarded",
        })
    }
}

impl FromStr for ForwardedSource {
    type Err = KeyError;

    /// `xff` or `x-forwarded-for`, `forwarded`; ASCII case-insensitive.
    ///
    /// # Errors
    ///
    /// [`KeyError::BadSource`] for anything else.
    fn from_str(text: &str) -> Result<Self, KeyError> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("xff") || text.eq_ignore_ascii_case("x-forwarded-for") {
            Ok(Self::Xff)
        } else if text.eq_ignore_ascii_case("forwarded") {
            Ok(Self::Forwarded)
        } else {
            Err(KeyError::BadSource {
                value: text.to_owned(),
            })
        }
    }
}

/// Which rule of docs/design.md, "Client key" chose the key. Positions count the non-empty
/// entries of the authoritative header from the right, starting at 1 (the entry the peer itself
/// added), across all its lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// The TCP peer is not a trusted proxy: it is the client, forwarding headers are ignored.
    PeerUntrusted,
    /// The peer is a trusted proxy but sent no forwarding entries (no header, or only empty
    /// elements): the peer is the key.
    PeerNoHeader,
    /// The first untrusted address walking right to left is the key.
    FirstUntrustedEntry {
        /// The header walked.
        header: ForwardedSource,
        /// The entry's position from the right (1 = rightmost).
        position_from_right: usize,
    },
    /// An entry is not an address (or a `Forwarded` element is malformed): the last trusted hop
    /// (the address right of it, or the peer if it is the rightmost) is the key.
    MalformedEntry {
        /// The header walked.
        header: ForwardedSource,
        /// The malformed entry's position from the right (1 = rightmost).
        position_from_right: usize,
    },
    /// Every entry is a trusted proxy: the last trusted hop (the leftmost entry) is the key.
    AllTrusted {
        /// The header walked.
        header: ForwardedSource,
        /// How many entries it has.
        entries: usize,
    },
}

impl fmt::Display for Rule {
    /// One human line explaining the choice (for `door key`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::PeerUntrusted => f.write_str(
                "the TCP peer is not a trusted proxy, so it is the client (forwarding headers ignored)",
            ),
            Self::PeerNoHeader => f.write_str(
                "the TCP peer is a trusted proxy but sent no forwarding entries, so the peer is the key",
            ),
            Self::FirstUntrustedEntry {
                header,
                position_from_right,
            } => write!(
                f,
                "{header} entry {position_from_right} from the right is the first untrusted address",
            ),
            Self::MalformedEntry {
                header,
                position_from_right,
            } => write!(
                f,
                "{header} entry {position_from_right} from the right is not an address, so the last trusted hop is the key",
            ),
            Self::AllTrusted { header, entries } => write!(
                f,
                "all {entries} {header} entries are trusted proxies, so the last trusted hop (the leftmost) is the key",
            ),
        }
    }
}

/// The outcome of [`client_key`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDecision {
    /// The masked key the limiter charges ([`PrefixKey::from_ip`] of `client`).
    pub key: PrefixKey,
    /// The chosen address, canonicalised (IPv4-mapped unmapped, zone stripped).
    pub client: IpAddr,
    /// Which rule chose it.
    pub rule: Rule,
    /// An `X-Forwarded-For` or `Forwarded` header came from an untrusted peer that is loopback,
    /// private (RFC 1918), unique-local (`fc00::/7`) or link-local: probably a local proxy missing
    /// from `trusted_proxies`. The daemon counts it in `door.untrusted_xff` and warns once.
    pub ignored_untrusted_xff: bool,
}

impl KeyDecision {
    fn new(client: IpAddr, rule: Rule, ignored_untrusted_xff: bool) -> Self {
        Self {
            key: PrefixKey::from_ip(client),
            client,
            rule,
            ignored_untrusted_xff,
        }
    }

    /// Whether the key is the untrusted TCP peer itself ([`Rule::PeerUntrusted`]): only such
    /// keys may be escalated to the XDP blocklist (docs/design.md, "Flood shield"); a key
    /// learnt through a proxy, or a proxy itself, never is.
    pub fn is_untrusted_peer(&self) -> bool {
        self.rule == Rule::PeerUntrusted
    }
}

impl fmt::Display for KeyDecision {
    /// `key 192.0.2.7/32 (client 192.0.2.7): <rule>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "key {} (client {}): {}",
            self.key, self.client, self.rule
        )
    }
}

/// The client key of a request from `peer` (its TCP peer address) carrying `headers`
/// (docs/design.md, "Client key").
///
/// - `peer` is canonicalised ([`canonical`]). If it is not in `trusted`, it is the key
///   ([`Rule::PeerUntrusted`]).
/// - Otherwise the authoritative header is walked: `X-Forwarded-For` or `Forwarded` (RFC 7239
///   §4, `for=`), whichever is present, `source` when both are. All its lines, in wire order, are
///   one list (RFC 9110 §5.6.1): elements split on commas, trimmed of spaces and tabs, empty
///   elements ignored, walked right to left. Each entry is parsed as an address (`a.b.c.d`,
///   `a.b.c.d:port`, RFC 4291 §2.2 IPv6 text, `[v6]`, `[v6]:port`, a `%zone` stripped,
///   IPv4-mapped unmapped) *before* its trust check. Trusted entries are skipped; the first
///   untrusted one is the key; entries left of it are never parsed.
/// - A malformed entry (`unknown`, `_obfuscated`, hostnames, `0127.0.0.1`, `1.2.3`, `0x7f.1`,
///   non-ASCII bytes, …) or an all-trusted chain keys the last trusted hop.
/// - The key is [`PrefixKey::from_ip`] of the chosen address (IPv4 /32, IPv6 /64, NAT64
///   `64:ff9b::/96` per RFC 6052 as its embedded IPv4 /32).
///
/// Never panics; work is linear in the bytes of the entries walked, without allocation.
pub fn client_key(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &TrustedProxies,
    source: ForwardedSource,
) -> KeyDecision {
    client_key_counting(peer, headers, trusted, source, &mut 0)
}

/// [`client_key`], adding the number of entries it parsed to `parsed` (for tests of bounded work).
fn client_key_counting(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &TrustedProxies,
    source: ForwardedSource,
    parsed: &mut usize,
) -> KeyDecision {
    let peer = canonical(peer);
    if !trusted.contains(peer) {
        let ignored = ignored_from_untrusted(peer, headers);
        return KeyDecision::new(peer, Rule::PeerUntrusted, ignored);
    }
    let has_xff = headers.contains_key(&X_FORWARDED_FOR);
    let has_forwarded = headers.contains_key(&FORWARDED_HEADER);
    let header = match (has_xff, has_forwarded) {
        (true, true) => source,
        (true, false) => ForwardedSource::Xff,
        (false, true) => ForwardedSource::Forwarded,
        (false, false) => return KeyDecision::new(peer, Rule::PeerNoHeader, false),
    };
    let (client, rule) = match header {
        ForwardedSource::Xff => walk(
            peer,
            header,
            xff_entries(headers).map(|entry| parse_entry(entry, PortSyntax::Decimal)),
            trusted,
            parsed,
        ),
        ForwardedSource::Forwarded => walk(
            peer,
            header,
            forwarded_entries(headers)
                .map(|entry| parse_entry(entry, PortSyntax::DecimalOrObfuscated)),
            trusted,
            parsed,
        ),
    };
    KeyDecision::new(client, rule, false)
}

/// Whether the forwarding headers in `headers` from `peer`, an untrusted peer, are worth
/// counting in `door.untrusted_xff` and warning about: `peer` is a loopback or private address
/// (almost always a proxy missing from `trusted_proxies`) and sent `X-Forwarded-For` or
/// `Forwarded`. The address is looked at first: a public peer costs no header lookup.
pub fn ignored_from_untrusted(peer: IpAddr, headers: &HeaderMap) -> bool {
    super::is_local(peer)
        && (headers.contains_key(&X_FORWARDED_FOR) || headers.contains_key(&FORWARDED_HEADER))
}

/// Parses a TCP peer's address as an operator writes it (`door key --peer`): an address or a
/// socket address, in the forms of an `X-Forwarded-For` entry (`a.b.c.d`, `a.b.c.d:port`, IPv6
/// with an optional `%zone`, `[v6]`, `[v6]:port`), canonicalised as a real peer is: IPv4-mapped
/// IPv6 unmapped, the zone and the port dropped. `None` when it is none of those forms.
pub fn parse_peer(text: &str) -> Option<IpAddr> {
    parse_node(text.as_bytes(), PortSyntax::Decimal)
}

fn parse_entry(entry: Entry<'_>, ports: PortSyntax) -> Option<IpAddr> {
    match entry {
        Entry::Node(text) => parse_node(text, ports),
        Entry::Malformed => None,
    }
}

/// Walks canonical addresses (`None` = malformed) right to left from a trusted `peer`.
fn walk(
    peer: IpAddr,
    header: ForwardedSource,
    entries: impl Iterator<Item = Option<IpAddr>>,
    trusted: &TrustedProxies,
    parsed: &mut usize,
) -> (IpAddr, Rule) {
    let mut last_trusted = peer;
    let mut position = 0;
    for entry in entries {
        position += 1;
        *parsed += 1;
        match entry {
            None => {
                let rule = Rule::MalformedEntry {
                    header,
                    position_from_right: position,
                };
                return (last_trusted, rule);
            }
            Some(ip) if trusted.contains(ip) => last_trusted = ip,
            Some(ip) => {
                let rule = Rule::FirstUntrustedEntry {
                    header,
                    position_from_right: position,
                };
                return (ip, rule);
            }
        }
    }
    if position == 0 {
        (peer, Rule::PeerNoHeader)
    } else {
        let rule = Rule::AllTrusted {
            header,
            entries: position,
        };
        (last_trusted, rule)
    }
}

#[cfg(test)]
mod tests;
