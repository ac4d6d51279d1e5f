use core::{
    pin::Pin,
    task::{Context, Poll},
};

use tokio::io::{AsyncWriteExt, ReadBuf};

use super::*;

const HTTP: &[u8] = b"GET /l/session/x HTTP/1.1\r\nHost: door\r\n\r\n";

fn trusted() -> TrustedProxies {
    TrustedProxies::parse_list("192.0.2.10, 2001:db8:ffff::/48").unwrap()
}

fn proxy_peer() -> SocketAddr {
    "192.0.2.10:40000".parse().unwrap()
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Reads a header from `input` delivered all at once; returns the result and the unread rest.
async fn read_all_at_once(input: &[u8]) -> (Result<Header, ProxyProtocolError>, Vec<u8>) {
    let mut rest = input;
    let header = read_header(&mut rest).await;
    (header, rest.to_vec())
}

/// A reader that hands out one byte per read, to check fragmented headers and that nothing past
/// the header is consumed.
struct OneByteAtATime<'a> {
    data: &'a [u8],
}

impl AsyncRead for OneByteAtATime<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some((first, rest)) = self.data.split_first()
            && buf.remaining() > 0
        {
            buf.put_slice(&[*first]);
            self.data = rest;
        }
        Poll::Ready(Ok(()))
    }
}

/// A reader that returns as much as asked for, counting reads.
struct Counting<'a> {
    data: &'a [u8],
    reads: usize,
}
impl AsyncRead for Counting<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.reads += 1;
        let n = buf.remaining().min(self.data.len());
        let (now, later) = self.data.split_at(n);
        buf.put_slice(now);
        self.data = later;
        Poll::Ready(Ok(()))
    }
}

/// A v2 header: version 2, `command` (0 LOCAL, 1 PROXY), `family_transport`, then `body`
/// (addresses and TLVs) with its length.
fn v2(command: u8, family_transport: u8, body: &[u8]) -> Vec<u8> {
    let mut h = V2_SIGNATURE.to_vec();
    h.push(0x20 | command);
    h.push(family_transport);
    h.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
    h.extend_from_slice(body);
    h
}

fn v2_ipv4_body(src: [u8; 4], src_port: u16) -> Vec<u8> {
    let mut b = src.to_vec();
    b.extend_from_slice(&[192, 0, 2, 1]);
    b.extend_from_slice(&src_port.to_be_bytes());
    b.extend_from_slice(&8443_u16.to_be_bytes());
    b
}

fn v2_ipv6_body(src: &str, src_port: u16) -> Vec<u8> {
    let ip = |s: &str| s.parse::<core::net::Ipv6Addr>().unwrap().octets();
    let mut b = ip(src).to_vec();
    b.extend_from_slice(&ip("2001:db8:d00::1"));
    b.extend_from_slice(&src_port.to_be_bytes());
    b.extend_from_slice(&8443_u16.to_be_bytes());
    b
}

fn with_http(header: &[u8]) -> Vec<u8> {
    let mut v = header.to_vec();
    v.extend_from_slice(HTTP);
    v
}

#[tokio::test]
async fn v1_tcp4_gives_the_source_and_leaves_the_request() {
    let input = with_http(b"PROXY TCP4 203.0.113.7 192.0.2.1 51234 8443\r\n");
    let (header, rest) = read_all_at_once(&input).await;
    assert_eq!(
        header.unwrap(),
        Header::Proxied {
            source: addr("203.0.113.7:51234")
        }
    );
    assert_eq!(rest, HTTP);
}

#[tokio::test]
async fn v1_tcp6_gives_the_source() {
    let input = with_http(b"PROXY TCP6 2001:db8:c1::2 2001:db8:d00::1 65535 443\r\n");
    let (header, rest) = read_all_at_once(&input).await;
    assert_eq!(
        header.unwrap(),
        Header::Proxied {
            source: addr("[2001:db8:c1::2]:65535")
        }
    );
    assert_eq!(rest, HTTP);
}

#[tokio::test]
async fn v1_longest_line_is_accepted() {
    // §2.1: the worst case is UNKNOWN with two full IPv6 addresses and 5-digit ports.
    let line = b"PROXY UNKNOWN ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n";
    assert_eq!(line.len(), MAX_V1_HEADER);
    let (header, rest) = read_all_at_once(&with_http(line)).await;
    assert_eq!(header.unwrap(), Header::Unknown);
    assert_eq!(rest, HTTP);
    let line = b"PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n";
    let (header, rest) = read_all_at_once(&with_http(line)).await;
    assert_eq!(
        header.unwrap(),
        Header::Proxied {
            source: addr("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535")
        }
    );
    assert_eq!(rest, HTTP);
}

/// `header` (then an HTTP request) reads as `Header::Unknown`, leaving exactly the request, and
/// a trusted peer that sends it stays the connection's peer.
async fn unknown_keeps_the_real_peer(header: &[u8]) {
    let input = with_http(header);
    let (parsed, rest) = read_all_at_once(&input).await;
    assert_eq!(parsed.unwrap(), Header::Unknown, "{header:02x?}");
    assert_eq!(rest, HTTP);
    let mut r = input.as_slice();
    assert_eq!(
        accept(&mut r, proxy_peer(), &trusted()).await.unwrap(),
        proxy_peer()
    );
    assert_eq!(r, HTTP);
}

#[tokio::test]
async fn v1_unknown_keeps_the_real_peer() {
    for line in [
        &b"PROXY UNKNOWN\r\n"[..],
        b"PROXY UNKNOWN ffff:f::1 ffff:f::2 1 2\r\n",
        // §2.1: after UNKNOWN, anything up to the CRLF is ignored.
        b"PROXY UNKNOWN whatever here 1 2 3\r\n",
        b"PROXY UNKNOWN \r\n",
    ] {
        unknown_keeps_the_real_peer(line).await;
    }
}

#[tokio::test]
async fn v1_one_byte_at_a_time_reads_nothing_past_the_crlf() {
    let input = with_http(b"PROXY TCP4 203.0.113.7 192.0.2.1 51234 8443\r\n");
    let mut r = OneByteAtATime { data: &input };
    let header = read_header(&mut r).await.unwrap();
    assert_eq!(
        header,
        Header::Proxied {
            source: addr("203.0.113.7:51234")
        }
    );
    assert_eq!(r.data, HTTP);
}

#[tokio::test]
async fn v1_at_once_takes_few_reads() {
    // 45-byte line: 12 bytes, then two at a time (and one when a CR is last).
    let input = with_http(b"PROXY TCP4 203.0.113.7 192.0.2.1 51234 8443\r\n");
    let mut r = Counting {
        data: &input,
        reads: 0,
    };
    read_header(&mut r).await.unwrap();
    assert_eq!(r.data, HTTP);
    assert!(
        r.reads <= 1 + (45_usize - 12).div_ceil(2),
        "{} reads",
        r.reads
    );
}

#[tokio::test]
async fn v1_malformed_lines_are_refused() {
    for line in [
        &b"PROXY TCP4 203.0.113.300 192.0.2.1 51234 8443\r\n"[..],
        b"PROXY TCP4 2001:db8::1 192.0.2.1 51234 8443\r\n",
        b"PROXY TCP6 203.0.113.7 2001:db8::1 51234 8443\r\n",
        b"PROXY TCP4 203.0.113.7 192.0.2.1 051234 8443\r\n",
        b"PROXY TCP4 203.0.113.7 192.0.2.1 65536 8443\r\n",
        b"PROXY TCP4 203.0.113.7 192.0.2.1 51234\r\n",
        b"PROXY TCP5 203.0.113.7 192.0.2.1 51234 8443\r\n",
        b"PROXY TCP4  203.0.113.7 192.0.2.1 51234 8443\r\n",
        b"PROXY TCP4 203.0.113.7 192.0.2.1 51234 8443\rX",
        b"PROXY \r\n\r\n\r\n\r\n\r\n",
        // Found by fuzzing: after UNKNOWN, the first CR must still be followed by LF.
        b"PROXY UNKNOWN \n\r\r\nTCPP\r\r\rR\x03#\r \r\0",
        b"PROXY UNKNOWN\rX",
    ] {
        let (header, _) = read_all_at_once(&with_http(line)).await;
        assert!(
            matches!(
                header,
                Err(ProxyProtocolError::Malformed { version: 1, .. })
            ),
            "{:?}: {header:?}",
            String::from_utf8_lossy(line)
        );
    }
}

#[tokio::test]
async fn v1_a_bare_lf_is_not_a_line_end() {
    // No CR: the line runs on into the request until the 107-byte bound.
    let input = with_http(b"PROXY TCP4 203.0.113.7 192.0.2.1 51234 8443\nGET / HTTP/1.1\n");
    let (header, _) = read_all_at_once(&input).await;
    assert!(header.is_err(), "{header:?}");
}

#[tokio::test]
async fn v1_without_crlf_stops_at_107_bytes() {
    let mut input = b"PROXY TCP4 ".to_vec();
    input.extend(std::iter::repeat_n(b'1', 500));
    let (header, rest) = read_all_at_once(&input).await;
    assert!(
        matches!(
            header,
            Err(ProxyProtocolError::TooLong {
                version: 1,
                limit: 107
            })
        ),
        "{header:?}"
    );
    assert_eq!(rest.len(), input.len() - MAX_V1_HEADER, "read exactly 107");
}

#[tokio::test]
async fn v2_proxy_ipv4_gives_the_source_and_leaves_the_request() {
    let input = with_http(&v2(1, 0x11, &v2_ipv4_body([203, 0, 113, 7], 51234)));
    let (header, rest) = read_all_at_once(&input).await;
    assert_eq!(
        header.unwrap(),
        Header::Proxied {
            source: addr("203.0.113.7:51234")
        }
    );
    assert_eq!(rest, HTTP);
}

#[tokio::test]
async fn v2_proxy_ipv6_gives_the_source() {
    let input = with_http(&v2(1, 0x21, &v2_ipv6_body("2001:db8:c1::2", 443)));
    let (header, rest) = read_all_at_once(&input).await;
    assert_eq!(
        header.unwrap(),
        Header::Proxied {
            source: addr("[2001:db8:c1::2]:443")
        }
    );
    assert_eq!(rest, HTTP);
}

#[tokio::test]
async fn v2_local_keeps_the_real_peer_and_skips_its_addresses() {
    // LOCAL with no address, and LOCAL that still carries one (§2.2: receivers must skip `len`).
    for header in [
        v2(0, 0x00, &[]),
        v2(0, 0x11, &v2_ipv4_body([203, 0, 113, 7], 1)),
    ] {
        unknown_keeps_the_real_peer(&header).await;
    }
}

#[tokio::test]
async fn v2_unspec_unix_and_datagram_keep_the_real_peer() {
    for header in [
        v2(1, 0x00, &[]),
        v2(1, 0x31, &[0; 216]),
        v2(1, 0x12, &v2_ipv4_body([203, 0, 113, 7], 1)),
        v2(1, 0x10, &v2_ipv4_body([203, 0, 113, 7], 1)),
    ] {
        let (parsed, rest) = read_all_at_once(&with_http(&header)).await;
        assert_eq!(parsed.unwrap(), Header::Unknown, "{header:02x?}");
        assert_eq!(rest, HTTP);
    }
}

/// A v2 TCP-over-IPv6 header whose source is the unspecified IPv4 address, mapped, names no
/// client, as `0.0.0.0` and `::` do: the proxy stays the peer.
#[tokio::test]
async fn v2_a_mapped_unspecified_source_keeps_the_real_peer() {
    let input = with_http(&v2(1, 0x21, &v2_ipv6_body("::ffff:0.0.0.0", 443)));
    let mut r = input.as_slice();
    assert_eq!(
        accept(&mut r, proxy_peer(), &trusted()).await.unwrap(),
        proxy_peer()
    );
    assert_eq!(r, HTTP);
}

#[tokio::test]
async fn v2_tlvs_are_skipped() {
    let mut body = v2_ipv4_body([198, 51, 100, 9], 4242);
    // PP2_TYPE_AUTHORITY "door.example", PP2_TYPE_UNIQUE_ID, PP2_TYPE_NOOP with 3 bytes (§2.2.2,
    // §2.2.5, §2.2.4), and an unassigned type 0xE0 (§2.2.8).
    for (kind, value) in [
        (0x02_u8, &b"door.example"[..]),
        (0x05, b"\x01\x02\x03\x04"),
        (0x04, b"\0\0\0"),
        (0xE0, b"custom"),
    ] {
        body.push(kind);
        body.extend_from_slice(&u16::try_from(value.len()).unwrap().to_be_bytes());
        body.extend_from_slice(value);
    }
    let input = with_http(&v2(1, 0x11, &body));
    let (header, rest) = read_all_at_once(&input).await;
    assert_eq!(
        header.unwrap(),
        Header::Proxied {
            source: addr("198.51.100.9:4242")
        }
    );
    assert_eq!(rest, HTTP);
}

#[tokio::test]
async fn v2_one_byte_at_a_time_reads_nothing_past_the_header() {
    let input = with_http(&v2(1, 0x11, &v2_ipv4_body([203, 0, 113, 7], 51234)));
    let mut r = OneByteAtATime { data: &input };
    assert!(matches!(
        read_header(&mut r).await.unwrap(),
        Header::Proxied { .. }
    ));
    assert_eq!(r.data, HTTP);
}

#[tokio::test]
async fn v2_malformed_headers_are_refused() {
    let mut bad_version = v2(1, 0x11, &v2_ipv4_body([203, 0, 113, 7], 1));
    bad_version[12] = 0x11;
    let mut bad_command = v2(1, 0x11, &v2_ipv4_body([203, 0, 113, 7], 1));
    bad_command[12] = 0x2F;
    for (what, header) in [
        ("version 1 in the binary format", bad_version),
        ("command 0xF", bad_command),
        ("family 0x4", v2(1, 0x41, &[0; 12])),
        ("transport 0x3", v2(1, 0x13, &[0; 12])),
        ("IPv4 in 4 bytes", v2(1, 0x11, &[203, 0, 113, 7])),
        ("IPv6 in 12 bytes", v2(1, 0x21, &[0; 12])),
    ] {
        let (parsed, _) = read_all_at_once(&with_http(&header)).await;
        assert!(
            matches!(
                parsed,
                Err(ProxyProtocolError::Malformed { version: 2, .. })
            ),
            "{what}: {parsed:?}"
        );
    }
}

#[tokio::test]
async fn v2_oversized_length_is_refused_before_reading_the_body() {
    let mut header = V2_SIGNATURE.to_vec();
    header.extend_from_slice(&[0x21, 0x11, 0xFF, 0xFF]);
    header.extend(std::iter::repeat_n(0_u8, 100));
    let (parsed, rest) = read_all_at_once(&header).await;
    assert!(
        matches!(
            parsed,
            Err(ProxyProtocolError::TooLong {
                version: 2,
                limit: MAX_V2_HEADER
            })
        ),
        "{parsed:?}"
    );
    assert_eq!(rest.len(), 100, "only the 16-byte fixed part was read");
    // The largest accepted: exactly MAX_V2_HEADER bytes.
    let body = [v2_ipv4_body([203, 0, 113, 7], 1), vec![0x04, 0x07, 0xE1]].concat();
    let mut body = body;
    body.resize(MAX_V2_HEADER - V2_FIXED, 0);
    let (parsed, rest) = read_all_at_once(&with_http(&v2(1, 0x11, &body))).await;
    assert!(matches!(parsed.unwrap(), Header::Proxied { .. }));
    assert_eq!(rest, HTTP);
}

#[tokio::test]
async fn truncated_headers_are_refused() {
    let v1 = b"PROXY TCP4 203.0.113.7 192.0.2.1 51234 8443\r\n";
    let v2 = v2(1, 0x11, &v2_ipv4_body([203, 0, 113, 7], 1));
    for (what, input) in [
        ("v1 in the signature", &v1[..3]),
        ("v1 after the signature", &v1[..20]),
        ("v1 before the LF", &v1[..v1.len() - 1]),
        ("v2 in the signature", &v2[..8]),
        ("v2 in the fixed part", &v2[..14]),
        ("v2 in the addresses", &v2[..20]),
        ("empty", &[][..]),
    ] {
        let (parsed, _) = read_all_at_once(input).await;
        assert!(
            matches!(parsed, Err(ProxyProtocolError::Truncated { read }) if read == input.len()),
            "{what}: {parsed:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn garbage_is_refused_at_once() {
    for input in [
        &b"GET / HTTP/1.1\r\nHost: door\r\n\r\n"[..],
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        b"proxy TCP4 203.0.113.7 192.0.2.1 1 2\r\n",
        b"\r\n\r\n\0\r\nQUIT\r",
        b"G",
        b"PROXY\t",
    ] {
        // The sender stays connected: the refusal must not wait for more bytes or the deadline.
        let (mut client, mut server) = tokio::io::duplex(4096);
        client.write_all(input).await.unwrap();
        let start = crate::time::now();
        let r = accept(&mut server, proxy_peer(), &trusted()).await;
        assert!(
            matches!(r, Err(ProxyProtocolError::NotProxyProtocol)),
            "{input:?}: {r:?}"
        );
        assert_eq!(start.elapsed(), Duration::ZERO, "{input:?}");
        drop(client);
    }
}

#[tokio::test(start_paused = true)]
async fn a_slow_header_times_out_after_5_s() {
    let (mut client, mut server) = tokio::io::duplex(4096);
    client.write_all(b"PROXY TCP4 203.0.113.7 ").await.unwrap();
    let start = crate::time::now();
    let r = accept(&mut server, proxy_peer(), &trusted()).await;
    assert!(
        matches!(r, Err(ProxyProtocolError::Timeout { limit }) if limit == HEADER_TIMEOUT),
        "{r:?}"
    );
    assert_eq!(start.elapsed(), HEADER_TIMEOUT);
    assert_eq!(r.unwrap_err().reason(), "timeout");
    drop(client);
}

#[tokio::test(start_paused = true)]
async fn a_header_in_two_parts_within_the_deadline_is_accepted() {
    let (mut client, mut server) = tokio::io::duplex(4096);
    let writer = tokio::spawn(async move {
        client.write_all(b"PROXY TCP4 203.0.113.7 ").await.unwrap();
        tokio::time::sleep(Duration::from_millis(4_999)).await;
        client.write_all(b"192.0.2.1 51234 8443\r\n").await.unwrap();
        client.write_all(HTTP).await.unwrap();
        client
    });
    let peer = accept(&mut server, proxy_peer(), &trusted()).await.unwrap();
    assert_eq!(peer, addr("203.0.113.7:51234"));
    let client = writer.await.unwrap();
    drop(client);
    let mut rest = Vec::new();
    server.read_to_end(&mut rest).await.unwrap();
    assert_eq!(rest, HTTP);
}

#[tokio::test]
async fn an_untrusted_sender_is_refused_before_anything_is_read() {
    let input = with_http(b"PROXY TCP4 203.0.113.7 192.0.2.1 51234 8443\r\n");
    for peer in [
        "198.51.100.1:5000",
        "192.0.2.11:5000",
        "[2001:db8:fffe::1]:1",
    ] {
        let mut r = input.as_slice();
        let e = accept(&mut r, addr(peer), &trusted()).await.unwrap_err();
        assert!(
            matches!(e, ProxyProtocolError::Untrusted { peer: p } if p == addr(peer).ip()),
            "{e:?}"
        );
        assert_eq!(e.reason(), "untrusted");
        assert_eq!(r.len(), input.len(), "nothing read from {peer}");
    }
    // No trusted proxies at all: nobody may send the header.
    let mut r = input.as_slice();
    assert!(matches!(
        accept(&mut r, proxy_peer(), &TrustedProxies::default()).await,
        Err(ProxyProtocolError::Untrusted { .. })
    ));
}

#[tokio::test]
async fn a_trusted_sender_on_a_mapped_address_is_trusted() {
    let input = with_http(&v2(1, 0x11, &v2_ipv4_body([203, 0, 113, 7], 51234)));
    let mut r = input.as_slice();
    let peer = accept(&mut r, addr("[::ffff:192.0.2.10]:40000"), &trusted())
        .await
        .unwrap();
    assert_eq!(peer, addr("203.0.113.7:51234"));
    // The header's own address is returned as carried; the key canonicalises it later.
    let mut body = vec![0_u8; 10];
    body.extend_from_slice(&[0xff, 0xff, 203, 0, 113, 8]);
    body.extend_from_slice(&[0; 16]);
    body.extend_from_slice(&[0, 1, 0, 2]);
    let input = v2(1, 0x21, &body);
    let mut r = input.as_slice();
    let peer = accept(&mut r, proxy_peer(), &trusted()).await.unwrap();
    assert_eq!(
        crate::client::key::canonical(peer.ip()),
        addr("203.0.113.8:1").ip()
    );
}

#[tokio::test]
async fn accept_or_reject_drops_and_counts() {
    let metrics = Metrics::noop();
    let mut r = &b"GET / HTTP/1.1\r\n\r\n"[..];
    assert_eq!(
        accept_or_reject(&mut r, proxy_peer(), &trusted(), &metrics).await,
        None
    );
    let input = with_http(b"PROXY TCP4 203.0.113.7 192.0.2.1 51234 8443\r\n");
    let mut r = input.as_slice();
    assert_eq!(
        accept_or_reject(&mut r, proxy_peer(), &trusted(), &metrics).await,
        Some(Accepted {
            peer: addr("203.0.113.7:51234"),
            named: true
        })
    );
    // A header that names no client leaves the proxy as the peer, and says so.
    for header in [
        &b"PROXY UNKNOWN\r\n"[..],
        b"PROXY TCP4 0.0.0.0 192.0.2.1 51234 8443\r\n",
        b"PROXY TCP6 :: 2001:db8::1 51234 8443\r\n",
        // The unspecified IPv4 address, mapped: no client either.
        b"PROXY TCP6 ::ffff:0.0.0.0 2001:db8::1 51234 8443\r\n",
    ] {
        let input = with_http(header);
        let mut r = input.as_slice();
        assert_eq!(
            accept_or_reject(&mut r, proxy_peer(), &trusted(), &metrics).await,
            Some(Accepted {
                peer: proxy_peer(),
                named: false
            }),
            "{}",
            String::from_utf8_lossy(header)
        );
    }
}

#[test]
fn reasons_are_a_fixed_small_set() {
    let all = [
        ProxyProtocolError::Untrusted {
            peer: proxy_peer().ip(),
        },
        ProxyProtocolError::Timeout {
            limit: HEADER_TIMEOUT,
        },
        ProxyProtocolError::Truncated { read: 0 },
        ProxyProtocolError::NotProxyProtocol,
        ProxyProtocolError::TooLong {
            version: 1,
            limit: 107,
        },
        ProxyProtocolError::Malformed {
            version: 2,
            reason: String::new(),
        },
        ProxyProtocolError::Io(std::io::ErrorKind::ConnectionReset.into()),
    ];
    let reasons: Vec<_> = all.iter().map(ProxyProtocolError::reason).collect();
    assert_eq!(
        reasons,
        [
            "untrusted",
            "timeout",
            "truncated",
            "not_proxy_protocol",
            "too_long",
            "malformed",
            "io"
        ]
    );
    assert_eq!(
        all[0].to_string(),
        "192.0.2.10 is not a trusted proxy: a PROXY protocol header is accepted only from trusted_proxies"
    );
}
