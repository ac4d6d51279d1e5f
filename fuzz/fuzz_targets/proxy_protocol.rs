//! Fuzzes `door_daemon::client::proxy_protocol::read_header` with arbitrary bytes as the start of a
//! connection on a PROXY protocol listener (haproxy.org/download/2.9/doc/proxy-protocol.txt,
//! §2.1 and §2.2).
//!
//! The input is read twice: all at once, and one byte per read (a header fragmented by TCP).
//! Checks: no panic; both readings agree; an accepted header consumed exactly its own bytes (a v1
//! line up to its first CRLF, at most 107 bytes; a v2 header 16 bytes plus its length field, at
//! most `MAX_V2_HEADER`), so what follows is left for the HTTP server; a refusal never consumed
//! more than the bounds.
#![no_main]

use std::{
    pin::Pin,
    sync::OnceLock,
    task::{Context, Poll},
};

use door_daemon::client::proxy_protocol::{Header, MAX_V1_HEADER, MAX_V2_HEADER, read_header};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncRead, ReadBuf};

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime")
    })
}

/// Hands out one byte per read.
struct OneByte<'a>(&'a [u8]);

impl AsyncRead for OneByte<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some((first, rest)) = self.0.split_first() {
            if buf.remaining() > 0 {
                buf.put_slice(&[*first]);
                self.0 = rest;
            }
        }
        Poll::Ready(Ok(()))
    }
}

fuzz_target!(|data: &[u8]| {
    let mut whole = data;
    let at_once = runtime().block_on(read_header(&mut whole));
    let consumed = data.len() - whole.len();
    assert!(consumed <= MAX_V2_HEADER);

    let mut fragmented = OneByte(data);
    let by_byte = runtime().block_on(read_header(&mut fragmented));
    let consumed_by_byte = data.len() - fragmented.0.len();

    match (&at_once, &by_byte) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b);
            assert_eq!(consumed, consumed_by_byte);
            let header = &data[..consumed];
            if header.starts_with(b"PROXY ") {
                assert!(consumed <= MAX_V1_HEADER);
                assert!(header.ends_with(b"\r\n"));
                assert_eq!(header.iter().position(|b| *b == b'\r'), Some(consumed - 2));
            } else {
                let len = usize::from(u16::from_be_bytes([header[14], header[15]]));
                assert_eq!(consumed, 16 + len);
            }
            if let Header::Proxied { source } = a {
                let _ = source.ip();
            }
        }
        (Err(a), Err(b)) => {
            assert_eq!(a.reason(), b.reason(), "{a} / {b}");
            assert!(consumed_by_byte <= MAX_V2_HEADER);
            let _ = a.to_string();
        }
        _ => panic!("reading at once and byte by byte disagree: {at_once:?} / {by_byte:?}"),
    }
});
