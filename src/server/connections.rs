//! Serving the connections of one listener ourselves (`axum::serve` offers none of this): at most
//! `--max-connections` open at once across both listeners (one more is closed as soon as it is accepted, counted
//! and logged); a request head must arrive within `--header-read-timeout-ms` of the connection's opening, or of its
//! first byte after an idle spell; a body within `--body-read-timeout-ms` of its head ([`TimedBody`]); a connection
//! with no request in flight is closed after `--idle-timeout-ms` (HTTP/2 with a GOAWAY); HTTP/2 connections are
//! pinged (`--http2-ping-interval-ms`). A connection whose client does not read its responses is dropped, with
//! every response it holds: when they have made no progress (16 KiB written to the socket: HTTP/1 writes not
//! blocked, HTTP/2 flow control open) for `--write-timeout-ms`, or for [`UNREAD_GRACE`] while they hold more than
//! [`MAX_UNSENT_BYTES`] not yet taken. Response bodies are handed over in frames of at most [`MAX_FRAME_BYTES`], so that a body is
//! taken only as fast as the client reads it, rather than copied whole into a send buffer it may never drain.
//!
//! Draining (shutdown): the listener is closed at once, so new connections are refused. HTTP/2 connections get a
//! GOAWAY and finish their streams. An HTTP/1 connection answers the request in flight, or whose head has begun to
//! arrive, with `Connection: close`; an idle one stays open for [`DRAIN_IDLE_GRACE`], so that a request already on
//! its way is answered (with `Connection: close`) instead of meeting a closed socket, then closes.
//!
//! With TLS (`--tls-cert`, [`super::tls`]), the handshake is the connection's first step, in its task and under
//! its permit: it must end within `--header-read-timeout-ms` of the connection's opening (else the connection is
//! dropped and counted as a `tls_handshake` timeout), and a drain drops connections still in their handshake. The
//! head of the first request must then arrive within what is left of that timeout; everything after reads and
//! writes the decrypted stream, so the slow-client rules below hold alike.
//!
//! What to do when is [`next_step`], a pure function of the connection's [`Activity`] and the clock, tested with
//! a paused clock; the task around it ([`connection`]) only acts on its answers.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::http::{HeaderValue, Request, Response, Version, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;
use tower_service::Service as _;

use crate::api::guard::HYPER_MAX_HEADERS;
use crate::api::timed_body::{Reader, TimedBody};
use crate::config::Timeouts;
use crate::telemetry::requests::{Observed, RequestTelemetry};
use crate::telemetry::traceparent;
use crate::tls::Tls;
use recserve_core::metrics::{ConnectionMetrics, Metrics, TraceSink};
use recserve_core::trace::{self, TraceCell};

/// How long an idle connection stays open once the drain begins, answering a request that was already on its way
/// (with `Connection: close`) instead of closing under it.
pub(crate) const DRAIN_IDLE_GRACE: Duration = Duration::from_secs(1);

/// How long a connection the server chose to close may take to go (an HTTP/2 GOAWAY waits for the client's
/// answer to a ping) once it has no request in flight; then it is dropped.
pub(crate) const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Most bytes of responses a connection may hold that its client has not read (not yet taken for sending) without
/// progress for [`UNREAD_GRACE`]; more, and the connection is dropped then rather than after `--write-timeout-ms`:
/// a connection that does not read cannot grow the server's memory by opening streams for long, while a client
/// that reads many large answers at once (64 MiB is 45 replies of the largest recall `--max-reply-items` allows)
/// keeps making progress.
pub(crate) const MAX_UNSENT_BYTES: u64 = 64 << 20;

/// Bytes written to a connection's socket that count as its responses' progress ([`Activity::bytes_written`]).
const PROGRESS_BYTES: u64 = 16 << 10;

/// How long a connection over [`MAX_UNSENT_BYTES`] may go without progress: a client that reads makes some
/// within it, however many large responses it has asked for at once.
pub(crate) const UNREAD_GRACE: Duration = Duration::from_secs(1);

/// Largest frame of a response body handed to hyper at once ([`CountedBody`]).
const MAX_FRAME_BYTES: usize = 64 << 10;

/// Which listener: the label of its metrics, how its request bodies time out, and whether Nagle's algorithm is
/// turned off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Listener {
    Http,
    Grpc,
}

impl Listener {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Listener::Http => "http",
            Listener::Grpc => "grpc",
        }
    }

    fn reader(self) -> Reader {
        match self {
            Listener::Http => Reader::Http,
            Listener::Grpc => Reader::Grpc,
        }
    }
}

/// What both listeners share: the connection cap, the timeouts, and the drain signal.
#[derive(Debug)]
pub(crate) struct Connections {
    permits: Arc<Semaphore>,
    max: usize,
    timeouts: Timeouts,
    metrics: Metrics,
    /// Read by every HTTP/1 response (`Connection: close` once draining), so an atomic beside the watch.
    draining: Arc<AtomicBool>,
    drain: watch::Sender<bool>,
    refusals: Throttle,
    /// `None`: plain TCP.
    tls: Option<Arc<Tls>>,
    /// Tracing and the access log; `None` when both are off, and then a request does no work for them.
    telemetry: Option<Arc<RequestTelemetry>>,
}

impl Connections {
    pub(crate) fn new(
        max: usize,
        timeouts: Timeouts,
        metrics: Metrics,
        tls: Option<Arc<Tls>>,
    ) -> Connections {
        Connections {
            permits: Arc::new(Semaphore::new(max)),
            max,
            timeouts,
            metrics,
            draining: Arc::new(AtomicBool::new(false)),
            drain: watch::Sender::new(false),
            refusals: Throttle::default(),
            tls,
            telemetry: None,
        }
    }

    /// Traces and logs requests as `telemetry` says.
    pub(crate) fn with_telemetry(
        mut self,
        telemetry: Option<Arc<RequestTelemetry>>,
    ) -> Connections {
        self.telemetry = telemetry;
        self
    }

    /// Stops accepting on every listener and drains their connections ([`serve`] returns once they are closed).
    pub(crate) fn drain(&self) {
        self.draining.store(true, Ordering::Release);
        self.drain.send_replace(true);
    }
}

/// Serves `listener` with `app` until the drain has closed its last connection.
pub(crate) async fn serve(
    listener: TcpListener,
    kind: Listener,
    app: Router,
    connections: Arc<Connections>,
) -> io::Result<()> {
    let metrics = connections.metrics.connections(kind.label());
    let mut drain = connections.drain.subscribe();
    let mut tasks = JoinSet::new();
    let accept_errors = Throttle::default();
    loop {
        tokio::select! {
            () = drained(&mut drain) => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let Ok(permit) = Arc::clone(&connections.permits).try_acquire_owned() else {
                        // Closing at once tells the client now, where leaving it in the backlog would not.
                        drop(stream);
                        metrics.refused.inc();
                        if let Some(suppressed) = connections.refusals.ready() {
                            tracing::warn!(
                                listener = kind.label(),
                                max_connections = connections.max,
                                suppressed,
                                "connection refused: --max-connections are open (suppressed: refusals not logged \
                                 since the last line)"
                            );
                        }
                        continue;
                    };
                    tasks.spawn(connection(
                        stream,
                        kind,
                        app.clone(),
                        Arc::clone(&connections),
                        metrics.clone(),
                        permit,
                    ));
                }
                // A client that gave up between its SYN and our accept: nothing to do.
                Err(e) if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionRefused
                ) => {}
                Err(e) => {
                    // Out of file descriptors, most likely: accepting again at once would spin.
                    if let Some(suppressed) = accept_errors.ready() {
                        tracing::error!(listener = kind.label(), suppressed, "cannot accept a connection: {e}");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    // New connections are refused from here on.
    drop(listener);
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// Serves one connection until it closes or [`next_step`] closes it.
async fn connection(
    stream: TcpStream,
    kind: Listener,
    app: Router,
    connections: Arc<Connections>,
    metrics: ConnectionMetrics,
    _permit: OwnedSemaphorePermit,
) {
    metrics.open.inc();
    let _open = OnDrop(|| metrics.open.dec());
    let accepted = Instant::now();
    if kind == Listener::Grpc
        && let Err(e) = stream.set_nodelay(true)
    {
        // gRPC is HTTP/2 with small frames: without TCP_NODELAY, Nagle's algorithm would hold them back.
        tracing::warn!("cannot set TCP_NODELAY on a gRPC connection: {e}");
    }
    let timeouts = connections.timeouts;
    let stream = match &connections.tls {
        None => Stream::Plain(stream),
        Some(tls) => {
            let acceptor = match kind {
                Listener::Http => tls.http_acceptor(),
                Listener::Grpc => tls.grpc_acceptor(),
            };
            let handshake = acceptor.accept(stream);
            let mut drain = connections.drain.subscribe();
            tokio::select! {
                result = handshake => match result {
                    Ok(stream) => Stream::Tls(Box::new(stream)),
                    Err(e) => {
                        metrics.handshake_failures.inc();
                        tracing::debug!(listener = kind.label(), "TLS handshake failed: {e}");
                        return;
                    }
                },
                () = tokio::time::sleep_until(accepted + timeouts.header_read) => {
                    metrics.handshake_timeouts.inc();
                    return;
                }
                // Nothing has been asked yet: nothing to finish.
                () = drained(&mut drain) => return,
            }
        }
    };
    let activity = Arc::new(Activity::new(accepted));
    let io = TokioIo::new(Watched {
        inner: stream,
        activity: Arc::clone(&activity),
        protocol_known: false,
    });
    let service = ConnectionService {
        app,
        traces: connections.metrics.traces(),
        activity: Arc::clone(&activity),
        body_read: timeouts.body_read,
        reader: kind.reader(),
        draining: Arc::clone(&connections.draining),
        telemetry: connections.telemetry.clone(),
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        // Our own header timeout (below) also knows an idle keep-alive connection from a slow head.
        .header_read_timeout(None)
        .max_headers(HYPER_MAX_HEADERS);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(timeouts.http2_ping)
        .keep_alive_timeout(timeouts.http2_ping.unwrap_or(Duration::from_secs(20)));
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);

    let mut drain = connections.drain.subscribe();
    let mut drain_started = None;
    let mut closing_since = None;
    loop {
        let draining = *drain.borrow_and_update();
        if drain_started.is_none() && draining {
            drain_started = Some(Instant::now());
        }
        let changed = activity.changed.notified();
        let step = next_step(
            &activity.state(),
            &timeouts,
            drain_started,
            closing_since,
            Instant::now(),
        );
        let wake = match step {
            Step::Close(reason) => {
                match reason {
                    Reason::HeaderTimeout => metrics.header_timeouts.inc(),
                    Reason::IdleTimeout => metrics.idle_timeouts.inc(),
                    Reason::Drain => {}
                    Reason::Gone => return,
                    Reason::WriteTimeout | Reason::Unread => {
                        // Nothing can be said to a client that reads nothing: drop the connection, and with it
                        // the responses it holds.
                        metrics.write_timeouts.inc();
                        let state = activity.state();
                        tracing::debug!(
                            listener = kind.label(),
                            ?reason,
                            responses = state.unsent,
                            bytes = state.unsent_bytes,
                            "connection dropped: its client does not read its responses"
                        );
                        return;
                    }
                }
                if !activity.state().http2 {
                    // HTTP/1 with nothing in flight: nothing to say before closing (and hyper would wait for a
                    // head it has begun to read).
                    return;
                }
                conn.as_mut().graceful_shutdown();
                closing_since = Some(Instant::now());
                continue;
            }
            Step::WaitUntil(at) => at,
        };
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(listener = kind.label(), "connection ended: {e}");
                }
                return;
            }
            () = changed => {}
            _ = drain.changed(), if drain_started.is_none() => {}
            () = sleep_until(wake) => {}
        }
    }
}

/// Resolves once the drain has begun (the value's guard is not held across an await: it is not `Send`).
async fn drained(drain: &mut watch::Receiver<bool>) {
    let _ = drain.wait_for(|&draining| draining).await.map(|_| ());
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What a connection has been doing, as [`next_step`] needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConnectionState {
    pub(crate) accepted: Instant,
    /// Requests whose head has arrived.
    pub(crate) requests: u64,
    /// Requests whose response has not been sent whole.
    pub(crate) in_flight: usize,
    /// When `in_flight` last fell to 0 (or the connection opened).
    pub(crate) idle_since: Instant,
    /// The first byte read since `idle_since`: a request head has begun (HTTP/1).
    pub(crate) head_started: Option<Instant>,
    /// The connection began with HTTP/2's preface (or carried an HTTP/2 request).
    pub(crate) http2: bool,
    /// Responses handed to hyper whose bodies have not all been taken for sending.
    pub(crate) unsent: usize,
    /// The bytes of those bodies not yet taken (as far as their size is known).
    pub(crate) unsent_bytes: u64,
    /// When the responses last made progress: 16 KiB written to the socket, or one began while none was unsent.
    pub(crate) last_sent: Instant,
}

/// Why a connection is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    /// No complete request head within `--header-read-timeout-ms`.
    HeaderTimeout,
    /// No request within `--idle-timeout-ms`.
    IdleTimeout,
    /// The server is draining.
    Drain,
    /// Closed once already and still open [`CLOSE_GRACE`] later: dropped.
    Gone,
    /// Its responses made no progress within `--write-timeout-ms`: dropped.
    WriteTimeout,
    /// Its responses hold more than [`MAX_UNSENT_BYTES`] its client has not read: dropped.
    Unread,
}

/// What the connection's task does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Close it now, gracefully (HTTP/2: GOAWAY; HTTP/1: at once when idle), or drop it (`Reason::Gone`).
    Close(Reason),
    /// Nothing before this time (`None`: until the activity changes), unless the activity changes.
    WaitUntil(Option<Instant>),
}

/// The rules of the module's documentation, in one place.
pub(crate) fn next_step(
    state: &ConnectionState,
    timeouts: &Timeouts,
    drain_started: Option<Instant>,
    closing_since: Option<Instant>,
    now: Instant,
) -> Step {
    let due = |at: Instant, reason: Reason| {
        if at <= now {
            Step::Close(reason)
        } else {
            Step::WaitUntil(Some(at))
        }
    };
    // Responses the client does not read end the connection, whatever else it is doing.
    let hoarding = state.unsent > 0 && state.unsent_bytes > MAX_UNSENT_BYTES;
    let write_due = (state.unsent > 0).then(|| {
        let grace = if hoarding {
            UNREAD_GRACE
        } else {
            timeouts.write
        };
        state.last_sent + grace.min(timeouts.write)
    });
    if let Some(at) = write_due
        && at <= now
    {
        return Step::Close(if hoarding {
            Reason::Unread
        } else {
            Reason::WriteTimeout
        });
    }
    // With requests in flight and none of their responses unsent yet, look again a write timeout from now: a
    // response may begin meanwhile, and waking the task for each one would cost every request a wake.
    let in_flight = Step::WaitUntil(Some(write_due.unwrap_or(now + timeouts.write)));
    if let Some(closing) = closing_since {
        // Requests in flight finish; then the connection has CLOSE_GRACE to go.
        return if state.in_flight > 0 {
            in_flight
        } else {
            due(closing.max(state.idle_since) + CLOSE_GRACE, Reason::Gone)
        };
    }
    // A connection known to be HTTP/2 closes with a GOAWAY, which lets streams in flight (and on their way)
    // finish and tells the client to open no more: no need to wait.
    let http2 = state.http2;
    if drain_started.is_some() && http2 {
        return Step::Close(Reason::Drain);
    }
    if state.in_flight > 0 {
        // Bodies have their own timeout; an HTTP/1 response while draining carries `Connection: close`.
        return in_flight;
    }
    let (at, reason) = if state.requests == 0 {
        (state.accepted + timeouts.header_read, Reason::HeaderTimeout)
    } else if let (false, Some(started)) = (http2, state.head_started) {
        (started + timeouts.header_read, Reason::HeaderTimeout)
    } else {
        (state.idle_since + timeouts.idle, Reason::IdleTimeout)
    };
    match drain_started {
        // A head on its way is a request on its way: it has its header timeout to arrive, and is answered.
        Some(_) if state.head_started.is_some() => due(at, reason),
        Some(drain) if drain + DRAIN_IDLE_GRACE < at => {
            due(drain + DRAIN_IDLE_GRACE, Reason::Drain)
        }
        _ => due(at, reason),
    }
}

/// A connection's [`ConnectionState`], updated by its service (requests) and its socket (bytes read).
#[derive(Debug)]
struct Activity {
    state: Mutex<ConnectionState>,
    /// Whether the next byte read starts a request head: checked on every read without taking the lock.
    awaiting_head: AtomicBool,
    /// The connection's first bytes, until there are enough to tell HTTP/2's preface from an HTTP/1 request
    /// line ([`PREFACE_START`]); `None` once told.
    first_bytes: Mutex<Option<Vec<u8>>>,
    /// Bytes written to the socket since the last progress ([`Activity::bytes_written`]).
    written: AtomicU64,
    /// Wakes the connection's task when the state changes in a way that moves its deadline.
    changed: Notify,
}

impl Activity {
    fn new(now: Instant) -> Activity {
        Activity {
            state: Mutex::new(ConnectionState {
                accepted: now,
                requests: 0,
                in_flight: 0,
                idle_since: now,
                head_started: None,
                http2: false,
                unsent: 0,
                unsent_bytes: 0,
                last_sent: now,
            }),
            awaiting_head: AtomicBool::new(true),
            first_bytes: Mutex::new(Some(Vec::with_capacity(PREFACE_START.len()))),
            written: AtomicU64::new(0),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ConnectionState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn state(&self) -> ConnectionState {
        *self.lock()
    }

    fn first_bytes_seen(&self) -> bool {
        self.first_bytes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }

    /// Counts a request whose head has arrived; returns it in flight, and when its first byte arrived if this
    /// connection saw it (an HTTP/1 request read while no other was in flight).
    fn request_started(self: &Arc<Self>, http2: bool) -> (InFlight, Option<std::time::Instant>) {
        self.awaiting_head.store(false, Ordering::Relaxed);
        let (first, head_started) = {
            let mut state = self.lock();
            state.requests += 1;
            state.in_flight += 1;
            let head_started = state.head_started.take();
            state.http2 |= http2;
            (state.in_flight == 1, head_started)
        };
        if first {
            self.changed.notify_one();
        }
        (
            InFlight(Arc::clone(self)),
            head_started.map(Instant::into_std),
        )
    }

    fn request_finished(&self) {
        let idle = {
            let mut state = self.lock();
            state.in_flight = state.in_flight.saturating_sub(1);
            if state.in_flight == 0 {
                state.idle_since = Instant::now();
            }
            state.in_flight == 0
        };
        if idle {
            self.awaiting_head.store(true, Ordering::Relaxed);
            self.changed.notify_one();
        }
    }

    /// A response body of (at least) `bytes` bytes is handed to hyper.
    fn body_started(&self, bytes: u64) {
        let wake = {
            let mut state = self.lock();
            state.unsent += 1;
            state.unsent_bytes += bytes;
            // A response beginning is progress only on a connection with none unsent: one more response beside
            // unread ones is not a sign that the client reads.
            if state.unsent == 1 {
                state.last_sent = Instant::now();
            }
            // Too many bytes: a nearer deadline. (The first unsent body needs no wake: a connection with a request
            // in flight looks again every --write-timeout-ms, [`next_step`].)
            state.unsent_bytes > MAX_UNSENT_BYTES
        };
        if wake {
            self.changed.notify_one();
        }
    }

    /// A frame of `bytes` (of the bytes announced) was taken for sending.
    fn body_taken(&self, bytes: u64) {
        let mut state = self.lock();
        state.unsent_bytes = state.unsent_bytes.saturating_sub(bytes);
    }

    /// `bytes` were written to the socket: every [`PROGRESS_BYTES`] of them is progress. Counted at the socket,
    /// not where hyper takes a body's frames: HTTP/2 may take a frame of a stream whose flow-control window is
    /// closed (into its send buffer, on the connection's window), which would look like progress of a client
    /// that reads nothing; and small control frames (ping acknowledgements) are not a response read.
    fn bytes_written(&self, bytes: usize) {
        let total = self.written.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
        if total >= PROGRESS_BYTES {
            self.written.store(0, Ordering::Relaxed);
            self.lock().last_sent = Instant::now();
        }
    }

    /// A response body is done (or abandoned) with `left` of its announced bytes not taken.
    fn body_ended(&self, left: u64) {
        let mut state = self.lock();
        state.unsent = state.unsent.saturating_sub(1);
        state.unsent_bytes = state.unsent_bytes.saturating_sub(left);
    }

    /// Looks at the connection's first bytes (`read`: what one read returned) for HTTP/2's preface.
    fn first_read(&self, read: &[u8]) {
        let mut first = self
            .first_bytes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(bytes) = first.as_mut() else {
            return;
        };
        let wanted = PREFACE_START.len() - bytes.len();
        bytes.extend_from_slice(&read[..read.len().min(wanted)]);
        if bytes.len() == PREFACE_START.len() {
            if bytes.as_slice() == PREFACE_START {
                self.lock().http2 = true;
            }
            *first = None;
        }
    }

    fn bytes_read(&self) {
        if !self.awaiting_head.load(Ordering::Relaxed)
            || !self.awaiting_head.swap(false, Ordering::Relaxed)
        {
            return;
        }
        {
            let mut state = self.lock();
            if state.in_flight > 0 || state.head_started.is_some() {
                return;
            }
            state.head_started = Some(Instant::now());
        }
        self.changed.notify_one();
    }
}

/// How HTTP/2's connection preface begins; no HTTP/1 method does.
const PREFACE_START: &[u8] = b"PRI ";

/// One request in flight, until its response has been sent whole (or abandoned).
#[derive(Debug)]
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_finished();
    }
}

/// A connection's byte stream: the socket, or TLS over it (decrypted).
enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The connection's stream, telling [`Activity`] when bytes arrive.
struct Watched {
    inner: Stream,
    activity: Arc<Activity>,
    /// Whether [`Activity::first_read`] has seen enough.
    protocol_known: bool,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            if !this.protocol_known {
                this.activity.first_read(&buf.filled()[before..]);
                this.protocol_known = this.activity.first_bytes_seen();
            }
            this.activity.bytes_read();
        }
        result
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            this.activity.bytes_written(n);
        }
        written
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = written {
            this.activity.bytes_written(n);
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The router, seen by hyper: counts each request in flight until its response body is done, gives its body the
/// read timeout, traces it from its first byte until its response is handed over ([`recserve_core::trace`]), and closes
/// HTTP/1 connections after their response once the server drains. With tracing or the access log on, it reads the
/// caller's `traceparent`, answers with the server span's, and exports and logs the request once its response is
/// handed over ([`crate::telemetry::requests`]).
#[derive(Clone)]
struct ConnectionService {
    app: Router,
    traces: Arc<TraceSink>,
    activity: Arc<Activity>,
    body_read: Duration,
    reader: Reader,
    draining: Arc<AtomicBool>,
    telemetry: Option<Arc<RequestTelemetry>>,
}

type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<Response<CountedBody>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for ConnectionService {
    type Response = Response<CountedBody>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn call(&self, request: Request<Incoming>) -> ResponseFuture {
        let http2 = request.version() == Version::HTTP_2;
        let (in_flight, head_started) = self.activity.request_started(http2);
        // HTTP/2 (and a pipelined HTTP/1 request) starts when hyper has its head: the frames before it are not
        // told apart per stream.
        let first_byte = head_started
            .filter(|_| !http2)
            .unwrap_or_else(std::time::Instant::now);
        let trace = TraceCell::new(first_byte);
        let observed = self
            .telemetry
            .as_ref()
            .and_then(|t| Some((Arc::clone(t), t.observe(&request)?)));
        let (body_read, reader) = (self.body_read, self.reader);
        let request = request.map(|body| TimedBody::new(body, body_read, reader));
        let mut app = self.app.clone();
        let draining = Arc::clone(&self.draining);
        let traces = Arc::clone(&self.traces);
        Box::pin(async move {
            let Ok(mut response) = trace::scope(Arc::clone(&trace), app.call(request)).await;
            if let Some(value) = observed
                .as_ref()
                .and_then(|(_, o)| o.response_traceparent())
            {
                response.headers_mut().insert(traceparent::HEADER, value);
            }
            let finisher = Finisher {
                trace,
                traces,
                telemetry: observed,
                sent: 0,
            };
            let mut response = response.map(|body| CountedBody::new(body, in_flight, finisher));
            if !http2 && draining.load(Ordering::Acquire) {
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok(response)
        })
    }
}

/// A response body that holds its request's place in flight, and its trace, until it is dropped; it hands its
/// data over in frames of at most [`MAX_FRAME_BYTES`], so that it is taken as the client reads it, and tells the
/// connection's [`Activity`] how much of it is still to take.
struct CountedBody {
    inner: Body,
    /// The rest of a data frame larger than [`MAX_FRAME_BYTES`].
    pending: Option<Bytes>,
    /// Bytes announced (the body's known size) and not yet taken.
    left: u64,
    in_flight: InFlight,
    finisher: Finisher,
}

impl CountedBody {
    fn new(inner: Body, in_flight: InFlight, trace: Finisher) -> CountedBody {
        let left = inner.size_hint().lower();
        in_flight.0.body_started(left);
        CountedBody {
            inner,
            pending: None,
            left,
            in_flight,
            finisher: trace,
        }
    }

    /// Hands over the first [`MAX_FRAME_BYTES`] of `data`, keeping the rest for the next poll.
    fn take(&mut self, mut data: Bytes) -> Bytes {
        if data.len() > MAX_FRAME_BYTES {
            self.pending = Some(data.split_off(MAX_FRAME_BYTES));
        }
        self.finisher.sent += data.len() as u64;
        let taken = (data.len() as u64).min(self.left);
        self.left -= taken;
        self.in_flight.0.body_taken(taken);
        data
    }
}

impl Drop for CountedBody {
    fn drop(&mut self) {
        self.in_flight.0.body_ended(self.left);
    }
}

/// Finishes a request's trace when its response body is dropped: once hyper has taken its last byte, or when the
/// response was abandoned.
struct Finisher {
    trace: Arc<TraceCell>,
    traces: Arc<TraceSink>,
    /// The request's spans and access-log line, when it is traced or logged.
    telemetry: Option<(Arc<RequestTelemetry>, Box<Observed>)>,
    /// Bytes of the response body handed over.
    sent: u64,
}

impl Drop for Finisher {
    fn drop(&mut self) {
        if let Some(finished) = self.trace.finish(std::time::Instant::now()) {
            if let Some((telemetry, observed)) = &self.telemetry {
                telemetry.finish(observed, &finished, self.sent);
            }
            self.traces.finish(finished);
        }
    }
}

impl HttpBody for CountedBody {
    type Data = <Body as HttpBody>::Data;
    type Error = <Body as HttpBody>::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(rest) = this.pending.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(this.take(rest)))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(match frame.into_data() {
                Ok(data) => http_body::Frame::data(this.take(data)),
                Err(frame) => frame,
            }))),
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.pending.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let pending = self.pending.as_ref().map_or(0, |p| p.len() as u64);
        let inner = self.inner.size_hint();
        let mut hint = http_body::SizeHint::new();
        hint.set_lower(inner.lower() + pending);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + pending);
        }
        hint
    }
}

/// Lets a log line through at most once a second, counting the ones held back.
#[derive(Debug, Default)]
struct Throttle {
    last: Mutex<Option<Instant>>,
    suppressed: AtomicU64,
}

impl Throttle {
    /// `Some(suppressed since the last line)` when a line may be logged now.
    fn ready(&self) -> Option<u64> {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if last.is_some_and(|at| now < at + Duration::from_secs(1)) {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }
}

/// Runs a closure when dropped.
struct OnDrop<F: FnMut()>(F);

impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn timeouts() -> Timeouts {
        Timeouts {
            header_read: 200 * MS,
            body_read: 300 * MS,
            idle: 1000 * MS,
            write: 500 * MS,
            http2_ping: None,
        }
    }

    fn fresh(t0: Instant) -> ConnectionState {
        ConnectionState {
            accepted: t0,
            requests: 0,
            in_flight: 0,
            idle_since: t0,
            head_started: None,
            http2: false,
            unsent: 0,
            unsent_bytes: 0,
            last_sent: t0,
        }
    }

    #[test]
    fn a_connection_whose_responses_are_not_read_is_dropped() {
        let t0 = Instant::now();
        let t = timeouts();
        let waiting = ConnectionState {
            requests: 3,
            in_flight: 3,
            unsent: 2,
            unsent_bytes: 1 << 20,
            last_sent: t0 + 100 * MS,
            http2: true,
            ..fresh(t0)
        };
        // Until the write timeout after the last progress, the connection waits; then it is dropped, also while
        // it is closing (a GOAWAY's streams that never drain would keep it open for ever).
        assert_eq!(
            next_step(&waiting, &t, None, None, t0 + 200 * MS),
            Step::WaitUntil(Some(t0 + 600 * MS))
        );
        assert_eq!(
            next_step(&waiting, &t, None, None, t0 + 600 * MS),
            Step::Close(Reason::WriteTimeout)
        );
        assert_eq!(
            next_step(&waiting, &t, Some(t0), Some(t0 + 50 * MS), t0 + 200 * MS),
            Step::WaitUntil(Some(t0 + 600 * MS))
        );
        assert_eq!(
            next_step(&waiting, &t, Some(t0), Some(t0 + 50 * MS), t0 + 700 * MS),
            Step::Close(Reason::WriteTimeout)
        );
        // Progress moves the deadline.
        let progressed = ConnectionState {
            last_sent: t0 + 550 * MS,
            ..waiting
        };
        assert_eq!(
            next_step(&progressed, &t, None, None, t0 + 600 * MS),
            Step::WaitUntil(Some(t0 + 1050 * MS))
        );
        // Too many bytes unread: dropped after the (shorter) unread grace without progress.
        let t_long = Timeouts {
            write: 30_000 * MS,
            ..t
        };
        let hoarding = ConnectionState {
            unsent_bytes: MAX_UNSENT_BYTES + 1,
            ..progressed
        };
        assert_eq!(
            next_step(&hoarding, &t_long, None, None, t0 + 600 * MS),
            Step::WaitUntil(Some(t0 + 550 * MS + UNREAD_GRACE))
        );
        assert_eq!(
            next_step(&hoarding, &t_long, None, None, t0 + 550 * MS + UNREAD_GRACE),
            Step::Close(Reason::Unread)
        );
        // A request still computing has no response to send: only its own deadline bounds it.
        let computing = ConnectionState {
            unsent: 0,
            unsent_bytes: 0,
            ..waiting
        };
        assert_eq!(
            next_step(&computing, &t, None, None, t0 + 5000 * MS),
            Step::WaitUntil(Some(t0 + 5000 * MS + t.write))
        );
    }

    #[test]
    fn a_fresh_connection_must_send_a_head_within_the_header_timeout() {
        let t0 = Instant::now();
        let s = fresh(t0);
        assert_eq!(
            next_step(&s, &timeouts(), None, None, t0),
            Step::WaitUntil(Some(t0 + 200 * MS))
        );
        // Bytes of a head do not extend it: the head must be whole by then.
        let dripping = ConnectionState {
            head_started: Some(t0 + 150 * MS),
            ..s
        };
        assert_eq!(
            next_step(&dripping, &timeouts(), None, None, t0 + 200 * MS),
            Step::Close(Reason::HeaderTimeout)
        );
        // Once its head has arrived, the request is in flight: its body has a timeout of its own.
        let busy = ConnectionState {
            requests: 1,
            in_flight: 1,
            ..s
        };
        assert_eq!(
            next_step(&busy, &timeouts(), None, None, t0 + 10_000 * MS),
            Step::WaitUntil(Some(t0 + 10_000 * MS + timeouts().write))
        );
    }

    #[test]
    fn a_keep_alive_connection_idles_for_the_idle_timeout_but_a_begun_head_has_the_header_timeout()
    {
        let t0 = Instant::now();
        let idle = ConnectionState {
            requests: 1,
            idle_since: t0 + 50 * MS,
            ..fresh(t0)
        };
        assert_eq!(
            next_step(&idle, &timeouts(), None, None, t0 + 60 * MS),
            Step::WaitUntil(Some(t0 + 1050 * MS))
        );
        assert_eq!(
            next_step(&idle, &timeouts(), None, None, t0 + 1050 * MS),
            Step::Close(Reason::IdleTimeout)
        );
        let heading = ConnectionState {
            head_started: Some(t0 + 500 * MS),
            ..idle
        };
        assert_eq!(
            next_step(&heading, &timeouts(), None, None, t0 + 600 * MS),
            Step::WaitUntil(Some(t0 + 700 * MS))
        );
        // HTTP/2 reads pings and window updates between requests: only the idle timeout applies.
        let h2 = ConnectionState {
            http2: true,
            ..heading
        };
        assert_eq!(
            next_step(&h2, &timeouts(), None, None, t0 + 600 * MS),
            Step::WaitUntil(Some(t0 + 1050 * MS))
        );
    }

    #[test]
    fn draining_closes_http2_at_once_and_idle_http1_after_the_grace() {
        let t0 = Instant::now();
        let drain = Some(t0 + 100 * MS);
        let h2 = ConnectionState {
            requests: 3,
            in_flight: 2,
            http2: true,
            ..fresh(t0)
        };
        assert_eq!(
            next_step(&h2, &timeouts(), drain, None, t0 + 100 * MS),
            Step::Close(Reason::Drain)
        );
        let idle = ConnectionState {
            requests: 1,
            idle_since: t0,
            ..fresh(t0)
        };
        let long_idle = Timeouts {
            idle: 60_000 * MS,
            ..timeouts()
        };
        assert_eq!(
            next_step(&idle, &long_idle, drain, None, t0 + 100 * MS),
            Step::WaitUntil(Some(t0 + 100 * MS + DRAIN_IDLE_GRACE))
        );
        assert_eq!(
            next_step(
                &idle,
                &long_idle,
                drain,
                None,
                t0 + 100 * MS + DRAIN_IDLE_GRACE
            ),
            Step::Close(Reason::Drain)
        );
        // An earlier timeout still applies; a busy HTTP/1 connection answers first (with Connection: close).
        assert_eq!(
            next_step(&fresh(t0), &timeouts(), drain, None, t0 + 150 * MS),
            Step::WaitUntil(Some(t0 + 200 * MS))
        );
        let busy = ConnectionState {
            requests: 1,
            in_flight: 1,
            ..fresh(t0)
        };
        assert_eq!(
            next_step(&busy, &timeouts(), drain, None, t0 + 5000 * MS),
            Step::WaitUntil(Some(t0 + 5000 * MS + timeouts().write))
        );
        // A head on its way is let arrive.
        let heading = ConnectionState {
            head_started: Some(t0 + 50 * MS),
            ..idle
        };
        let slow_heads = Timeouts {
            header_read: 5000 * MS,
            ..long_idle
        };
        assert_eq!(
            next_step(
                &heading,
                &slow_heads,
                drain,
                None,
                t0 + 200 * MS + DRAIN_IDLE_GRACE
            ),
            Step::WaitUntil(Some(t0 + 5050 * MS))
        );
    }

    #[test]
    fn a_closed_connection_is_dropped_a_grace_after_its_last_request() {
        let t0 = Instant::now();
        let closing = Some(t0);
        let busy = ConnectionState {
            requests: 1,
            in_flight: 1,
            http2: true,
            ..fresh(t0)
        };
        assert_eq!(
            next_step(&busy, &timeouts(), None, closing, t0 + 5000 * MS),
            Step::WaitUntil(Some(t0 + 5000 * MS + timeouts().write))
        );
        let done = ConnectionState {
            in_flight: 0,
            idle_since: t0 + 5000 * MS,
            ..busy
        };
        assert_eq!(
            next_step(&done, &timeouts(), None, closing, t0 + 5000 * MS),
            Step::WaitUntil(Some(t0 + 5000 * MS + CLOSE_GRACE))
        );
        assert_eq!(
            next_step(
                &done,
                &timeouts(),
                None,
                closing,
                t0 + 5000 * MS + CLOSE_GRACE
            ),
            Step::Close(Reason::Gone)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn activity_tracks_requests_and_the_start_of_a_head() {
        let t0 = Instant::now();
        let activity = Arc::new(Activity::new(t0));
        tokio::time::advance(10 * MS).await;
        activity.bytes_read();
        assert_eq!(activity.state().head_started, Some(t0 + 10 * MS));
        let first = activity.request_started(false);
        let second = activity.request_started(false);
        activity.bytes_read(); // a body: not a head
        assert_eq!(
            (activity.state().in_flight, activity.state().head_started),
            (2, None)
        );
        drop(first);
        tokio::time::advance(10 * MS).await;
        drop(second);
        let state = activity.state();
        assert_eq!(
            (state.requests, state.in_flight, state.idle_since),
            (2, 0, t0 + 20 * MS)
        );
        tokio::time::advance(5 * MS).await;
        activity.bytes_read();
        activity.bytes_read();
        assert_eq!(activity.state().head_started, Some(t0 + 25 * MS));
    }

    #[test]
    fn the_preface_tells_http2_from_http1_even_a_byte_at_a_time() {
        let h2 = Activity::new(Instant::now());
        for byte in b"PRI * HTTP/2.0" {
            h2.first_read(std::slice::from_ref(byte));
        }
        assert!(h2.state().http2 && h2.first_bytes_seen());
        let h1 = Activity::new(Instant::now());
        h1.first_read(b"PO");
        assert!(!h1.first_bytes_seen());
        h1.first_read(b"ST /v1/models HTTP/1.1\r\n");
        assert!(!h1.state().http2 && h1.first_bytes_seen());
    }
}
