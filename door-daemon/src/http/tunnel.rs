//! The tunnel of an upgraded connection (a WebSocket, or any protocol the upstream switched to):
//! bytes copied both ways with backpressure (`tokio::io::copy_bidirectional`: neither side reads
//! faster than the other writes), until either side closes or resets, or until nothing crossed
//! in either direction for `stream_idle_timeout`.

use std::{
    io,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::time::Clock;

/// How a tunnel ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TunnelEnd {
    /// One side closed (or reset) and the other was told.
    Closed,
    /// Nothing crossed in either direction for the idle timeout.
    Idle,
}

/// Copies between `a` and `b` until one closes or the tunnel is idle for `idle`; returns how it
/// ended and the bytes copied `(a → b, b → a)`. Time comes from `clock` (the idle check) and
/// tokio's timer, so paused-time tests drive it.
pub async fn run<A, B>(a: A, b: B, idle: Duration, clock: &Arc<dyn Clock>) -> (TunnelEnd, u64, u64)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let last = Arc::new(AtomicU64::new(clock.now_ns()));
    let mut a = Active {
        io: a,
        last: Arc::clone(&last),
        clock: Arc::clone(clock),
    };
    let mut b = Active {
        io: b,
        last: Arc::clone(&last),
        clock: Arc::clone(clock),
    };
    let copy = tokio::io::copy_bidirectional(&mut a, &mut b);
    tokio::pin!(copy);
    let idle_ns = u64::try_from(idle.as_nanos()).unwrap_or(u64::MAX);
    loop {
        let since = clock.now_ns().saturating_sub(last.load(Ordering::Acquire));
        let Some(left) = idle_ns.checked_sub(since).filter(|l| *l > 0) else {
            return (TunnelEnd::Idle, 0, 0);
        };
        tokio::select! {
            r = copy.as_mut() => {
                let (ab, ba) = r.unwrap_or((0, 0));
                return (TunnelEnd::Closed, ab, ba);
            }
            () = tokio::time::sleep(Duration::from_nanos(left)) => {}
        }
    }
}

/// An I/O object that notes the time of every byte it moves.
struct Active<T> {
    io: T,
    last: Arc<AtomicU64>,
    clock: Arc<dyn Clock>,
}

impl<T> Active<T> {
    fn touch(&self) {
        self.last.store(self.clock.now_ns(), Ordering::Release);
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Active<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(poll, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch();
        }
        poll
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Active<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, data);
        if matches!(poll, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        poll
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, duplex};

    use super::*;
    use crate::time::MonotonicClock;

    #[tokio::test(start_paused = true)]
    async fn copies_both_ways_then_closes_with_either_side() {
        let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
        let (mut client, a) = duplex(64);
        let (b, mut server) = duplex(64);
        let tunnel = tokio::spawn(async move { run(a, b, Duration::from_mins(1), &clock).await });
        client.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        server.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        server.write_all(b"pong!").await.unwrap();
        let mut buf = [0u8; 5];
        client.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong!");
        // The upstream closes: the client is told (end of stream), then closes too.
        drop(server);
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        drop(client);
        let (end, ab, ba) = tunnel.await.unwrap();
        assert_eq!((end, ab, ba), (TunnelEnd::Closed, 4, 5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_tunnel_closes_at_the_idle_timeout_and_traffic_keeps_it_open() {
        let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
        let (mut client, a) = duplex(64);
        let (b, mut server) = duplex(64);
        let start = crate::time::now();
        let tunnel = tokio::spawn(async move { run(a, b, Duration::from_mins(5), &clock).await });
        // Traffic at 200 s pushes the deadline to 500 s.
        tokio::time::sleep(Duration::from_secs(200)).await;
        client.write_all(b"x").await.unwrap();
        let mut buf = [0u8; 1];
        server.read_exact(&mut buf).await.unwrap();
        let (end, _, _) = tunnel.await.unwrap();
        assert_eq!(end, TunnelEnd::Idle);
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(500) && waited < Duration::from_secs(501),
            "{waited:?}"
        );
    }
}
