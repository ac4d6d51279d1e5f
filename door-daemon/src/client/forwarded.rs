//! Wire syntax of the forwarding headers: `X-Forwarded-For` and RFC 7239 `Forwarded`, read right
//! to left, and the text of one node (an address, perhaps with a port, brackets or a zone).
//!
//! This module only cuts header lines into entries and entries into addresses; which entry is the
//! client is [`crate::client::key`]'s business (docs/design.md, "Client key").
//!
//! Both readers walk from the *end* of the last header line towards the start of the first,
//! without joining lines and without allocating: each call to `next` scans only the bytes of the
//! entry it returns, so a caller that stops at the first untrusted entry never looks at anything
//! to its left (a client cannot influence its key with text it prepends).

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::header::{FORWARDED, HeaderMap, HeaderName, HeaderValue, ValueIter};

/// The `X-Forwarded-For` header name (de facto standard; RFC 7239 §1 describes it).
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The `Forwarded` header name (RFC 7239 §4).
pub(crate) const FORWARDED_HEADER: HeaderName = FORWARDED;

/// The longest node text we try to parse, in bytes. The longest address text with brackets, an
/// embedded IPv4, a port and a generous zone is well under this
/// (`[ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255%zone]:65535` is 54 bytes plus the zone).
const MAX_NODE_LEN: usize = 128;

/// One entry of a forwarding chain, as cut from the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Entry<'a> {
    /// The node text (an `X-Forwarded-For` element, or the unquoted `for=` value of a `Forwarded`
    /// element), not yet parsed: see [`parse_node`].
    Node(&'a [u8]),
    /// A `Forwarded` element that is not well formed: an unterminated quoted string, a backslash
    /// escape, a pair without `=`, a parameter name that is not a token, no `for=` or two of them.
    Malformed,
}

/// Trims spaces and horizontal tabs at both ends (RFC 9110 §5.6.3 OWS).
fn trim_ows(bytes: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = bytes.iter().position(|b| !is_ows(b)).unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |i| i + 1);
    bytes.get(start..end).unwrap_or_default()
}

/// The elements of all `X-Forwarded-For` lines, right to left: the lines in reverse wire order,
/// each split on commas from its end, each element trimmed of spaces and tabs, empty elements
/// skipped (RFC 9110 §5.6.1 list rule). Equivalent to joining the lines with `, ` and walking
/// the list backwards, without the join.
pub(crate) fn xff_entries(headers: &HeaderMap) -> impl Iterator<Item = Entry<'_>> {
    headers
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .rev()
        .flat_map(|line| line.as_bytes().rsplit(|b| *b == b','))
        .map(trim_ows)
        .filter(|element| !element.is_empty())
        .map(Entry::Node)
}

/// The `for=` values of all `Forwarded` elements, right to left (RFC 7239 §4: elements separated
/// by commas, pairs within an element by semicolons, values tokens or quoted strings; lines in
/// reverse wire order). Empty elements are skipped (RFC 9110 §5.6.1). After a
/// [`Entry::Malformed`] the iterator ends: the element boundaries to its left cannot be trusted.
pub(crate) fn forwarded_entries(headers: &HeaderMap) -> ForwardedFor<'_> {
    ForwardedFor {
        lines: headers.get_all(&FORWARDED_HEADER).iter(),
        current: None,
        done: false,
    }
}

/// Iterator returned by [`forwarded_entries`].
pub(crate) struct ForwardedFor<'a> {
    /// Header lines not started yet (taken from the back).
    lines: ValueIter<'a, HeaderValue>,
    /// The unread left part of the line being walked.
    current: Option<&'a [u8]>,
    /// Set after a malformed element.
    done: bool,
}

impl<'a> ForwardedFor<'a> {
    /// The next element to the left, trimmed, with its entry (for an unterminated quoted string
    /// or a backslash, the rest of its line).
    fn next_element(&mut self) -> Option<(&'a [u8], Entry<'a>)> {
        while !self.done {
            let line = match self.current.take() {
                Some(rest) => rest,
                None => self.lines.next_back()?.as_bytes(),
            };
            let Some((rest, element)) = split_last_element(line) else {
                self.done = true;
                return Some((line, Entry::Malformed));
            };
            self.current = rest;
            let element = trim_ows(element);
            if !element.is_empty() {
                let entry = for_value(element);
                if entry == Entry::Malformed {
                    self.done = true;
                }
                return Some((element, entry));
            }
        }
        None
    }
}

impl<'a> Iterator for ForwardedFor<'a> {
    type Item = Entry<'a>;

    fn next(&mut self) -> Option<Entry<'a>> {
        self.next_element().map(|(_, entry)| entry)
    }
}

/// The `Forwarded` elements the client key reads ([`forwarded_entries`]) when they stop at a
/// malformed one: the well-formed elements right of it, in wire order, each trimmed. `None` when
/// every element is well formed (or there is none): the chain reads to its start.
pub(crate) fn forwarded_readable_part(headers: &HeaderMap) -> Option<Vec<&[u8]>> {
    let mut walk = forwarded_entries(headers);
    let mut readable = Vec::new();
    while let Some((element, entry)) = walk.next_element() {
        if entry == Entry::Malformed {
            readable.reverse();
            return Some(readable);
        }
        readable.push(element);
    }
    None
}

/// Cuts the last element off a `Forwarded` line: scans from the end for a comma outside quoted
/// strings. Returns the text left of that comma (`None` when the element starts the line) and the
/// element, or `None` when a quoted string is unterminated or holds a backslash (a quoted-pair,
/// RFC 9110 §5.6.4, never occurs in a node identifier, and refusing it keeps the backwards scan
/// unambiguous).
fn split_last_element(line: &[u8]) -> Option<(Option<&[u8]>, &[u8])> {
    let mut in_quotes = false;
    for (i, byte) in line.iter().enumerate().rev() {
        match byte {
            b'"' => in_quotes = !in_quotes,
            b'\\' if in_quotes => return None,
            b',' if !in_quotes => {
                let left = line.get(..i)?;
                let element = line.get(i + 1..)?;
                return Some((Some(left), element));
            }
            _ => {}
        }
    }
    (!in_quotes).then_some((None, line))
}

/// RFC 9110 §5.6.2 `tchar`.
fn is_tchar(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

/// The `for=` value of one trimmed, non-empty `Forwarded` element whose quoted strings are
/// balanced and free of backslashes (what [`split_last_element`] returns). Parameter names are
/// case-insensitive (RFC 7239 §4); other parameters (`by`, `proto`, `host`, extensions) are
/// ignored; empty pairs are allowed by the grammar and skipped.
fn for_value(element: &[u8]) -> Entry<'_> {
    let mut found: Option<&[u8]> = None;
    for pair in split_outside_quotes(element, b';') {
        let pair = trim_ows(pair);
        if pair.is_empty() {
            continue;
        }
        let Some(eq) = pair.iter().position(|b| *b == b'=') else {
            return Entry::Malformed;
        };
        let name = trim_ows(pair.get(..eq).unwrap_or_default());
        let value = trim_ows(pair.get(eq + 1..).unwrap_or_default());
        if name.is_empty() || !name.iter().all(|b| is_tchar(*b)) {
            return Entry::Malformed;
        }
        if name.eq_ignore_ascii_case(b"for") {
            if found.is_some() {
                // RFC 7239 §4: a parameter MUST NOT occur more than once per element.
                return Entry::Malformed;
            }
            found = Some(value);
        }
    }
    let Some(value) = found else {
        return Entry::Malformed;
    };
    match value {
        [b'"', inner @ .., b'"'] if !inner.contains(&b'"') => Entry::Node(inner),
        _ if value.contains(&b'"') => Entry::Malformed,
        token => Entry::Node(token),
    }
}

/// Splits `bytes` on `separator` outside double-quoted strings (which must be balanced and free
/// of escapes, as [`split_last_element`] guarantees).
fn split_outside_quotes(bytes: &[u8], separator: u8) -> impl Iterator<Item = &[u8]> {
    let mut in_quotes = false;
    bytes.split(move |b| {
        if *b == b'"' {
            in_quotes = !in_quotes;
        }
        *b == separator && !in_quotes
    })
}

/// Which port syntax a node may carry after its address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PortSyntax {
    /// `X-Forwarded-For`: decimal digits only.
    Decimal,
    /// `Forwarded`: decimal digits or an obfuscated port `_abc` (RFC 7239 §6.3 `obfport`).
    DecimalOrObfuscated,
}

/// Parses one node's text as an IP address, canonicalised: IPv4-mapped IPv6 is unmapped and an
/// IPv6 zone is stripped.
///
/// Accepted forms: `a.b.c.d`, `a.b.c.d:port`, an IPv6 address (RFC 4291 §2.2 text forms, with
/// an optional `%zone`), `[v6]` and `[v6]:port`. Addresses are parsed by the standard library's
/// strict parser: only dotted-quad with decimal octets without leading zeros, so `0127.0.0.1`,
/// `1.2.3`, `0x7f.1` are refused. `unknown`, obfuscated identifiers (`_abc`), hostnames, empty
/// text, non-ASCII or invisible bytes and text longer than 128 bytes are all `None`.
pub(crate) fn parse_node(text: &[u8], ports: PortSyntax) -> Option<IpAddr> {
    if text.is_empty() || text.len() > MAX_NODE_LEN || !text.iter().all(u8::is_ascii_graphic) {
        return None;
    }
    let text = core::str::from_utf8(text).ok()?;
    let ip = if let Some(bracketed) = text.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']')?;
        if !after.is_empty() {
            valid_port(after.strip_prefix(':')?, ports).then_some(())?;
        }
        IpAddr::V6(parse_v6_with_zone(host)?)
    } else {
        match text.split_once(':') {
            // Exactly one colon: IPv4 with a port.
            Some((host, port)) if !port.contains(':') => {
                valid_port(port, ports).then_some(())?;
                IpAddr::V4(host.parse::<Ipv4Addr>().ok()?)
            }
            // Two or more colons: bare IPv6, perhaps with a zone.
            Some(_) => IpAddr::V6(parse_v6_with_zone(text)?),
            None => IpAddr::V4(text.parse::<Ipv4Addr>().ok()?),
        }
    };
    Some(ip.to_canonical())
}

/// An IPv6 address with an optional non-empty `%zone`, which is dropped.
fn parse_v6_with_zone(text: &str) -> Option<Ipv6Addr> {
    let address = match text.split_once('%') {
        Some((address, zone)) if !zone.is_empty() => address,
        Some(_) => return None,
        None => text,
    };
    address.parse().ok()
}

/// A port: 1 to 5 decimal digits, at most 65535; with [`PortSyntax::DecimalOrObfuscated`] also
/// `_` followed by letters, digits, `.`, `_` or `-` (RFC 7239 §6.3).
fn valid_port(port: &str, ports: PortSyntax) -> bool {
    if let Some(obfuscated) = port.strip_prefix('_') {
        return ports == PortSyntax::DecimalOrObfuscated
            && !obfuscated.is_empty()
            && obfuscated
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    }
    (1..=5).contains(&port.len())
        && port.bytes().all(|b| b.is_ascii_digit())
        && port.parse::<u32>().is_ok_and(|p| p <= 65_535)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(text: &str) -> Option<IpAddr> {
        parse_node(text.as_bytes(), PortSyntax::Decimal)
    }

    /// `Some(address)`; the expectations below are all valid addresses.
    fn ip(text: &str) -> Option<IpAddr> {
        let parsed = text.parse().ok();
        assert!(parsed.is_some(), "bad expectation {text}");
        parsed
    }

    #[test]
    fn node_forms() {
        let cases: &[(&str, Option<IpAddr>)] = &[
            ("192.0.2.7", ip("192.0.2.7")),
            ("192.0.2.7:8080", ip("192.0.2.7")),
            ("192.0.2.7:0", ip("192.0.2.7")),
            ("192.0.2.7:65535", ip("192.0.2.7")),
            ("192.0.2.7:65536", None),
            ("192.0.2.7:", None),
            ("192.0.2.7:080800", None),
            ("192.0.2.7:+80", None),
            ("192.0.2.7:_obf", None),
            ("2001:db8::1", ip("2001:db8::1")),
            ("[2001:db8::1]", ip("2001:db8::1")),
            ("[2001:db8::1]:443", ip("2001:db8::1")),
            ("[2001:db8::1]:", None),
            ("[2001:db8::1]x", None),
            ("[2001:db8::1", None),
            ("2001:db8::1]", None),
            ("[192.0.2.7]", None),
            ("[192.0.2.7]:80", None),
            ("fe80::1%eth0", ip("fe80::1")),
            ("[fe80::1%eth0]:80", ip("fe80::1")),
            ("fe80::1%", None),
            ("192.0.2.7%eth0", None),
            ("::ffff:192.0.2.7", ip("192.0.2.7")),
            ("[::ffff:192.0.2.7]:80", ip("192.0.2.7")),
            ("::ffff:c000:207", ip("192.0.2.7")),
            ("64:ff9b::192.0.2.7", ip("64:ff9b::c000:207")),
            ("0127.0.0.1", None),
            ("127.0.0.01", None),
            ("1.2.3", None),
            ("1.2.3.4.5", None),
            ("0x7f.1", None),
            ("0x7f000001", None),
            ("2130706433", None),
            ("256.1.1.1", None),
            ("unknown", None),
            ("_hidden", None),
            ("example.com", None),
            ("localhost", None),
            ("", None),
            ("1.2.3.4 ", None),
            ("1.2.3.4\t", None),
            ("::ffff:1.2.3", None),
            (":::", None),
            ("1::2::3", None),
            ("\"1.2.3.4\"", None),
            ("1.2.3.4é", None),
        ];
        for (text, want) in cases {
            assert_eq!(node(text), *want, "{text:?}");
        }
        assert_eq!(node(&"1".repeat(129)), None);
        let long_zone = format!("fe80::1%{}", "z".repeat(100));
        assert_eq!(node(&long_zone), ip("fe80::1"));
    }

    #[test]
    fn obfuscated_port_only_in_forwarded() {
        let text = b"192.0.2.7:_x-1.y";
        assert_eq!(parse_node(text, PortSyntax::Decimal), None);
        assert_eq!(
            parse_node(text, PortSyntax::DecimalOrObfuscated),
            ip("192.0.2.7")
        );
        assert_eq!(
            parse_node(b"192.0.2.7:_", PortSyntax::DecimalOrObfuscated),
            None
        );
        assert_eq!(
            parse_node(b"[2001:db8::1]:_a", PortSyntax::DecimalOrObfuscated),
            ip("2001:db8::1")
        );
    }

    fn map(pairs: &[(&HeaderName, &[u8])]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_bytes(value).unwrap());
        }
        headers
    }

    #[test]
    fn xff_is_read_right_to_left_across_lines() {
        let headers = map(&[
            (&X_FORWARDED_FOR, b"a, b,,\t c\t"),
            (&X_FORWARDED_FOR, b""),
            (&X_FORWARDED_FOR, b" , d ,e"),
        ]);
        let got: Vec<_> = xff_entries(&headers).collect();
        let want: Vec<_> = ["e", "d", "c", "b", "a"]
            .iter()
            .map(|s| Entry::Node(s.as_bytes()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn forwarded_elements_right_to_left() {
        let headers = map(&[
            (&FORWARDED_HEADER, b"for=a;proto=https, For=\"[b]:1\";by=x"),
            (
                &FORWARDED_HEADER,
                b" , proto=http;FOR=c ; host=\"h,;\" ,for=d",
            ),
        ]);
        let got: Vec<_> = forwarded_entries(&headers).collect();
        let want: Vec<_> = ["d", "c", "[b]:1", "a"]
            .iter()
            .map(|s| Entry::Node(s.as_bytes()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn forwarded_malformed_elements_end_the_walk() {
        let cases: &[&[u8]] = &[
            b"for=a, for=\"b",
            b"for=a, b\", for=c\"",
            b"for=a, for=\"\\b\"",
            b"for=a, proto=https",
            b"for=a, for=b;for=c",
            b"for=a, for",
            b"for=a, f\"o\"r=b",
            b"for=a, =b",
            b"for=a, for=\"b\"c",
            b"for=a, for=b\"",
        ];
        for line in cases {
            let headers = map(&[(&FORWARDED_HEADER, line)]);
            let got: Vec<_> = forwarded_entries(&headers).collect();
            assert_eq!(got, vec![Entry::Malformed], "{}", line.escape_ascii());
        }
    }

    #[test]
    fn forwarded_quoted_values() {
        let headers = map(&[(
            &FORWARDED_HEADER,
            b"for=\"_gazonk\", For=\"[2001:db8:cafe::17]:4711\", for=192.0.2.60;proto=http;by=203.0.113.43",
        )]);
        let got: Vec<_> = forwarded_entries(&headers).collect();
        assert_eq!(
            got,
            vec![
                Entry::Node(b"192.0.2.60"),
                Entry::Node(b"[2001:db8:cafe::17]:4711"),
                Entry::Node(b"_gazonk"),
            ]
        );
    }

    #[test]
    fn trim_ows_edges() {
        assert_eq!(trim_ows(b""), b"");
        assert_eq!(trim_ows(b" \t "), b"");
        assert_eq!(trim_ows(b" a b\t"), b"a b");
    }
}
