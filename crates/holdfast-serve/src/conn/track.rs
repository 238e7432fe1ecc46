//! Open requests per connection, so [`super::Guarded`] knows when a connection is idle: a
//! request is open from the moment the server calls its routes until its response body has
//! ended or been dropped (a Watch stream is open for as long as it streams). [`TrackLayer`]
//! goes in front of the routes; it finds the connection's [`Active`] handle in the request's
//! extensions.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use atomic_waker::AtomicWaker;
use tokio::time::Instant;
use tonic::transport::server::{Connected, TcpConnectInfo, TlsConnectInfo};

use super::Guarded;

/// One connection's open requests, and when the last one ended.
pub(super) struct Activity {
    accepted_at: Instant,
    open: AtomicUsize,
    /// When the connection last had no request open, in ms after `accepted_at`.
    idle_since_ms: AtomicU64,
    /// The connection's reader, woken when its last open request ends.
    reader: AtomicWaker,
}

impl Activity {
    pub(super) fn new(accepted_at: Instant) -> Activity {
        Activity {
            accepted_at,
            open: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            reader: AtomicWaker::new(),
        }
    }

    /// Since when no request has been open; `None` while one is.
    pub(super) fn idle_since(&self) -> Option<Instant> {
        if self.open.load(Ordering::Acquire) > 0 {
            return None;
        }
        let ms = self.idle_since_ms.load(Ordering::Acquire);
        Some(self.accepted_at + Duration::from_millis(ms))
    }

    /// Wakes `reader` when the last open request ends.
    pub(super) fn wake_on_idle(&self, reader: &Waker) {
        self.reader.register(reader);
    }
}

/// A connection's handle for counting its open requests.
#[derive(Clone)]
pub struct Active(pub(super) Arc<Activity>);

impl std::fmt::Debug for Active {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Active")
            .field("open", &self.0.open.load(Ordering::Relaxed))
            .finish()
    }
}

impl Active {
    /// One more request open until the returned guard is dropped.
    fn open(&self) -> OpenRequest {
        self.0.open.fetch_add(1, Ordering::AcqRel);
        OpenRequest(self.0.clone())
    }
}

/// A request open on its connection.
struct OpenRequest(Arc<Activity>);

impl Drop for OpenRequest {
    fn drop(&mut self) {
        let activity = &self.0;
        // The idle time first, so a reader that sees no request open reads when that began.
        let ms = u64::try_from(activity.accepted_at.elapsed().as_millis()).unwrap_or(u64::MAX);
        activity.idle_since_ms.store(ms, Ordering::Release);
        if activity.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            activity.reader.wake();
        }
    }
}

/// What a gRPC request's extensions carry of a [`Guarded`] connection: the connection's own
/// connect info (tonic's `TcpConnectInfo`, or `TlsConnectInfo` with the client certificate)
/// and its [`Active`] handle. [`TrackLayer::grpc`] puts `inner` back where tonic reads it.
#[derive(Clone, Debug)]
pub struct ConnInfo<T> {
    pub inner: T,
    pub active: Active,
}

impl<IO: Connected> Connected for Guarded<IO> {
    type ConnectInfo = ConnInfo<IO::ConnectInfo>;

    fn connect_info(&self) -> Self::ConnectInfo {
        ConnInfo {
            inner: self.get_ref().connect_info(),
            active: self.active(),
        }
    }
}

/// Counts each request as open on its connection until its response ends (see the module).
#[derive(Clone, Copy, Debug)]
pub struct TrackLayer {
    find: fn(&mut http::Extensions) -> Option<Active>,
}

impl TrackLayer {
    /// Finds each request's connection with `find`; a request without one (in-process) is
    /// not counted.
    pub fn new(find: fn(&mut http::Extensions) -> Option<Active>) -> TrackLayer {
        TrackLayer { find }
    }

    /// For a tonic server on [`Guarded`] connections: unwraps the [`ConnInfo`], so
    /// `Request::remote_addr` and `peer_certs` read the connection as they would without it.
    pub fn grpc() -> TrackLayer {
        TrackLayer::new(unwrap_grpc)
    }
}

fn unwrap_grpc(extensions: &mut http::Extensions) -> Option<Active> {
    if let Some(c) = extensions.remove::<ConnInfo<TcpConnectInfo>>() {
        extensions.insert(c.inner);
        return Some(c.active);
    }
    if let Some(c) = extensions.remove::<ConnInfo<TlsConnectInfo<TcpConnectInfo>>>() {
        extensions.insert(c.inner);
        return Some(c.active);
    }
    None
}

impl<S> tower::Layer<S> for TrackLayer {
    type Service = Track<S>;

    fn layer(&self, inner: S) -> Track<S> {
        Track {
            inner,
            find: self.find,
        }
    }
}

/// [`TrackLayer`]'s service.
#[derive(Clone, Debug)]
pub struct Track<S> {
    inner: S,
    find: fn(&mut http::Extensions) -> Option<Active>,
}

impl<S, B, RB> tower::Service<http::Request<B>> for Track<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    RB: 'static,
{
    type Response = http::Response<Tracked<RB>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let open = (self.find)(request.extensions_mut()).map(|a| a.open());
        let call = self.inner.call(request);
        Box::pin(async move {
            let response = call.await?;
            Ok(response.map(|body| Tracked { body, _open: open }))
        })
    }
}

/// A response body that keeps its request open on its connection until it ends or is dropped.
pub struct Tracked<B> {
    body: B,
    _open: Option<OpenRequest>,
}

impl<B: http_body::Body + Unpin> http_body::Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
