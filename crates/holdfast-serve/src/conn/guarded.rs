//! [`Guarded`]: one accepted connection under its listener's limits. It holds the connection's
//! place under the cap, watches the first bytes for a complete request head (HTTP/1.1 headers,
//! or the HTTP/2 preface and the client's first SETTINGS frame), and fails its reads - so the
//! server drops the connection - when the head is late or the connection has been idle (no
//! request open, as [`super::TrackLayer`] tells) for the idle timeout.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};

use super::track::Activity;
use super::{Active, ConnectionLimits, Dropped};

/// A connection under its listener's [`ConnectionLimits`]; reads and writes pass through.
pub struct Guarded<IO> {
    io: IO,
    head: HeadScan,
    activity: Arc<Activity>,
    limits: ConnectionLimits,
    accepted_at: Instant,
    /// The deadline `timer` is set to, if it is armed.
    armed: Option<Instant>,
    timer: Pin<Box<Sleep>>,
    /// Set once a rule closed the connection: every later call fails.
    closed: Option<Dropped>,
    _place: OwnedSemaphorePermit,
}

impl<IO> Guarded<IO> {
    pub(super) fn new(
        io: IO,
        place: OwnedSemaphorePermit,
        accepted_at: Instant,
        limits: ConnectionLimits,
    ) -> Guarded<IO> {
        let first = accepted_at + limits.header_timeout;
        Guarded {
            io,
            head: HeadScan::default(),
            activity: Arc::new(Activity::new(accepted_at)),
            limits,
            accepted_at,
            armed: Some(first),
            timer: Box::pin(tokio::time::sleep_until(first)),
            closed: None,
            _place: place,
        }
    }

    /// The connection itself.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// The handle [`super::TrackLayer`] counts this connection's open requests on.
    pub fn active(&self) -> Active {
        Active(self.activity.clone())
    }

    /// When the connection is due to be closed if nothing changes: the header deadline until
    /// the head is complete, then the idle deadline while no request is open.
    fn due(&self) -> Option<Instant> {
        if !self.head.complete {
            return Some(self.accepted_at + self.limits.header_timeout);
        }
        self.activity
            .idle_since()
            .map(|since| since + self.limits.idle_timeout)
    }

    /// Whether the connection must close now; otherwise the timer (and the end of the last
    /// open request) will wake this task when it may have to.
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<Dropped> {
        if let Some(rule) = self.closed {
            return Some(rule);
        }
        if self.head.complete {
            self.activity.wake_on_idle(cx.waker());
        }
        let due = self.due()?;
        if self.armed != Some(due) {
            self.timer.as_mut().reset(due);
            self.armed = Some(due);
        }
        if self.timer.as_mut().poll(cx).is_pending() {
            return None;
        }
        let rule = if self.head.complete {
            Dropped::IdleTimeout
        } else {
            Dropped::HeaderTimeout
        };
        rule.count();
        self.closed = Some(rule);
        Some(rule)
    }
}

fn closed_error(rule: Dropped) -> io::Error {
    let why = match rule {
        Dropped::HeaderTimeout => "no complete request head within --header-timeout",
        Dropped::IdleTimeout => "idle for --idle-timeout",
        Dropped::MaxConnections => "over --max-connections",
    };
    io::Error::new(io::ErrorKind::TimedOut, why)
}

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(rule) = this.closed {
            return Poll::Ready(Err(closed_error(rule)));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if !this.head.complete {
                    this.head.feed(&buf.filled()[before..]);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match this.expired(cx) {
                Some(rule) => Poll::Ready(Err(closed_error(rule))),
                None => Poll::Pending,
            },
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(rule) = this.closed {
            return Poll::Ready(Err(closed_error(rule)));
        }
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(rule) = this.closed {
            return Poll::Ready(Err(closed_error(rule)));
        }
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// The HTTP/2 connection preface a client sends first.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The preface and the header of the frame after it (which must be SETTINGS).
const H2_FIRST: usize = H2_PREFACE.len() + 9;
/// The HTTP/2 frame type SETTINGS.
const H2_SETTINGS: u8 = 0x4;

/// Watches a connection's first bytes until its request head is complete: HTTP/1.1 headers end
/// at an empty line; an HTTP/2 head is the preface and the whole SETTINGS frame after it. A
/// malformed head counts as complete: the server refuses it on its own.
struct HeadScan {
    complete: bool,
    /// Bytes seen so far.
    seen: usize,
    /// The first bytes, up to the HTTP/2 SETTINGS frame's header.
    first: [u8; H2_FIRST],
    /// The last four bytes, for HTTP/1.1's empty line.
    tail: u32,
    /// HTTP/2: the length of the preface and SETTINGS frame, once its header is read.
    h2_head: Option<usize>,
}

impl Default for HeadScan {
    fn default() -> HeadScan {
        HeadScan {
            complete: false,
            seen: 0,
            first: [0; H2_FIRST],
            tail: 0,
            h2_head: None,
        }
    }
}

impl HeadScan {
    fn feed(&mut self, bytes: &[u8]) {
        for (i, &b) in bytes.iter().enumerate() {
            if let Some(need) = self.h2_head {
                self.seen += bytes.len() - i;
                self.complete = self.seen >= need;
                return;
            }
            if self.seen < H2_FIRST {
                self.first[self.seen] = b;
            }
            self.seen += 1;
            self.tail = (self.tail << 8) | u32::from(b);
            if self.complete_after_byte() {
                self.complete = true;
                return;
            }
        }
    }

    fn complete_after_byte(&mut self) -> bool {
        let is_h2 = self.seen >= 3 && self.first[..3] == H2_PREFACE[..3];
        if !is_h2 {
            return self.seen >= 4 && self.tail == u32::from_be_bytes(*b"\r\n\r\n");
        }
        if self.seen < H2_FIRST {
            return self.seen <= H2_PREFACE.len()
                && self.first[..self.seen] != H2_PREFACE[..self.seen];
        }
        let frame = &self.first[H2_PREFACE.len()..];
        if self.first[..H2_PREFACE.len()] != H2_PREFACE[..] || frame[3] != H2_SETTINGS {
            return true;
        }
        let length =
            usize::from(frame[0]) << 16 | usize::from(frame[1]) << 8 | usize::from(frame[2]);
        self.h2_head = Some(H2_FIRST + length);
        self.seen >= H2_FIRST + length
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(chunks: &[&[u8]]) -> bool {
        let mut head = HeadScan::default();
        for chunk in chunks {
            head.feed(chunk);
        }
        head.complete
    }

    #[test]
    fn an_http1_head_ends_at_the_empty_line() {
        assert!(!scan(&[b"GET / HTTP/1.1\r\nHost: x\r\n"]));
        assert!(scan(&[b"GET / HTTP/1.1\r\nHost: x\r\n", b"\r\n"]));
        assert!(scan(&[b"GET / HTTP/1.1\r\n\r", b"\n"]));
        assert!(!scan(&[b""]));
    }

    #[test]
    fn an_http2_head_is_the_preface_and_the_settings_frame() {
        let settings = [0u8, 0, 6, H2_SETTINGS, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100];
        assert!(
            !scan(&[H2_PREFACE]),
            "the preface's own empty lines end nothing"
        );
        assert!(!scan(&[H2_PREFACE, &settings[..9]]));
        assert!(!scan(&[H2_PREFACE, &settings[..14]]));
        assert!(scan(&[H2_PREFACE, &settings]));
        let whole: Vec<u8> = [&H2_PREFACE[..], &settings, b"more"].concat();
        assert!(scan(&[&whole[..5], &whole[5..30], &whole[30..]]));
        let empty = [0u8, 0, 0, H2_SETTINGS, 0, 0, 0, 0, 0];
        assert!(scan(&[H2_PREFACE, &empty]));
    }

    #[test]
    fn a_malformed_head_is_left_to_the_server() {
        assert!(
            !scan(&[b"PRX / HTTP/1.1\r\n"]),
            "an HTTP/1.1 head, not yet complete"
        );
        assert!(scan(&[b"PRI * HTTP/1.1\r\n"]), "not the HTTP/2 preface");
        let ping = [0u8, 0, 8, 0x6, 0, 0, 0, 0, 0];
        assert!(scan(&[H2_PREFACE, &ping]), "not SETTINGS first");
    }
}
