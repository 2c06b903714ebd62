//! What bounds the gRPC listener's connections, each of which holds a file descriptor: at most
//! `grpc_max_connections` at once (one more is accepted and closed at once, so the kernel's
//! queue does not fill and the client learns it at once), and a plain connection must send the
//! HTTP/2 preface within `grpc_first_bytes_within` (a TLS one, finish its handshake: see
//! [`super::grpc_tls`]). Without them, silent connections piled up until `accept` failed on
//! every listener, `/check` included.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tonic::transport::server::Connected;

/// What every HTTP/2 client sends first.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// How often a connection that sent part of the preface is looked at again.
const PARTIAL_PREFACE_PAUSE: Duration = Duration::from_millis(20);
/// Connections past their preface waiting for the server to take them.
const QUEUE: usize = 64;
/// At most one warning about the cap this often.
const CAP_WARNING_EVERY: Duration = Duration::from_secs(60);

/// An accepted connection and its place under the cap, freed when the connection closes.
pub struct Admitted {
    pub stream: std::net::TcpStream,
    pub place: OwnedSemaphorePermit,
}

/// The cap on one listener's connections.
pub struct Cap {
    places: Arc<Semaphore>,
    max: u32,
    last_warning: Option<Instant>,
}

impl Cap {
    pub fn new(max: u32) -> Cap {
        Cap {
            places: Arc::new(Semaphore::new(usize::try_from(max).unwrap_or(usize::MAX))),
            max,
            last_warning: None,
        }
    }

    /// `stream` with its place, or `None` (the stream dropped, so closed) at the cap.
    pub fn admit(&mut self, stream: std::net::TcpStream) -> Option<Admitted> {
        match Arc::clone(&self.places).try_acquire_owned() {
            Ok(place) => Some(Admitted { stream, place }),
            Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => {
                if self
                    .last_warning
                    .is_none_or(|at| at.elapsed() >= CAP_WARNING_EVERY)
                {
                    log::warn!(
                        "gRPC listener: {} connections open (grpc_max_connections): closing new \
                         ones at once until some close",
                        self.max
                    );
                    self.last_warning = Some(Instant::now());
                }
                None
            }
        }
    }
}

/// A connection served to the end, holding its place under the cap until it closes.
pub struct Placed<S> {
    inner: S,
    _place: OwnedSemaphorePermit,
}

impl<S> Placed<S> {
    pub fn new(inner: S, place: OwnedSemaphorePermit) -> Placed<S> {
        Placed {
            inner,
            _place: place,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Placed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Placed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: Connected> Connected for Placed<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// The plain connections of `accepted` that sent the HTTP/2 preface within `within`, each
/// waited for in a task of its own (a silent client holds back no other); the rest are closed.
pub fn prefaced(
    mut accepted: mpsc::Receiver<Admitted>,
    within: Duration,
) -> mpsc::Receiver<io::Result<Placed<TcpStream>>> {
    let (ready, incoming) = mpsc::channel(QUEUE);
    tokio::spawn(async move {
        loop {
            let admitted = tokio::select! {
                next = accepted.recv() => match next {
                    Some(admitted) => admitted,
                    None => return,
                },
                () = ready.closed() => return,
            };
            let stream = match TcpStream::from_std(admitted.stream) {
                Ok(stream) => stream,
                Err(error) => {
                    log::warn!("gRPC listener: cannot take a connection: {error}");
                    continue;
                }
            };
            let (ready, place) = (ready.clone(), admitted.place);
            tokio::spawn(async move {
                match tokio::time::timeout(within, preface_sent(&stream)).await {
                    Ok(true) => {
                        let _ = ready.send(Ok(Placed::new(stream, place))).await;
                    }
                    // Any client can cause this: debug, not warn.
                    Ok(false) => log::debug!("gRPC connection closed before its preface"),
                    Err(_) => log::debug!("gRPC connection sent no preface in {within:?}"),
                }
            });
        }
    });
    incoming
}

/// Waits until `stream` holds the whole preface, or anything that is not one (HTTP/2 then
/// answers it); false when the client closed first.
async fn preface_sent(stream: &TcpStream) -> bool {
    let mut first = [0u8; PREFACE.len()];
    loop {
        let Ok(read) = stream.peek(&mut first).await else {
            return false;
        };
        if read == 0 {
            return false;
        }
        if read == PREFACE.len() || first[..read] != PREFACE[..read] {
            return true;
        }
        // Part of it: peek would answer again at once with the same bytes.
        tokio::time::sleep(PARTIAL_PREFACE_PAUSE).await;
    }
}
