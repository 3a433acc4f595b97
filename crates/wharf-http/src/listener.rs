//! A listener that stops accepting without resetting anyone the kernel already let in.
//!
//! Closing a listening socket resets every connection still queued in its backlog: a proxy
//! that opened one of them and wrote a request reads a reset, and since a POST may have been
//! acted on, it does not retry it. [`DrainingListener`] closes in order instead: it accepts
//! whatever is queued (straight from the kernel, not from the reactor's possibly stale
//! readiness), hands those connections to the server, and only then closes the socket, after
//! which a connection attempt is refused outright and the proxy safely tries another replica.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// A TCP listener for [`serve`](crate::serve) (or `axum::serve`) that can be closed in order
/// (see the module docs).
#[derive(Debug)]
pub struct DrainingListener {
    inner: Option<TcpListener>,
    local: SocketAddr,
    /// Connections taken from the backlog at closing, still to hand over.
    queued: VecDeque<(TcpStream, SocketAddr)>,
    close: CancellationToken,
    closed: CancellationToken,
}

/// Closes a [`DrainingListener`].
#[derive(Debug, Clone)]
pub struct Closer {
    close: CancellationToken,
    closed: CancellationToken,
}

impl Closer {
    /// Stops accepting: what the kernel queued is handed to the server, then the socket
    /// closes. Resolves once the server has taken every queued connection and `settle` has
    /// passed: graceful shutdown closes a connection whose request it has not
    /// started reading as idle (a reset for the proxy that just wrote one), so the connections
    /// accepted last get that long to be read before it begins.
    pub async fn close(&self, settle: std::time::Duration) {
        self.close.cancel();
        self.closed.cancelled().await;
        tokio::time::sleep(settle).await;
    }
}

impl DrainingListener {
    /// Wraps `listener`.
    pub fn new(listener: TcpListener) -> io::Result<(Self, Closer)> {
        let local = listener.local_addr()?;
        let (close, closed) = (CancellationToken::new(), CancellationToken::new());
        let closer = Closer {
            close: close.clone(),
            closed: closed.clone(),
        };
        Ok((
            DrainingListener {
                inner: Some(listener),
                local,
                queued: VecDeque::new(),
                close,
                closed,
            },
            closer,
        ))
    }

    /// Takes every connection the kernel has queued, then closes the socket.
    fn drain_backlog(&mut self) {
        let Some(listener) = self.inner.take() else {
            return;
        };
        // The std listener asks the kernel itself; it stays non-blocking.
        let Ok(listener) = listener.into_std() else {
            return;
        };
        loop {
            match listener.accept() {
                Ok((stream, addr)) => {
                    let converted = stream
                        .set_nonblocking(true)
                        .and_then(|()| TcpStream::from_std(stream));
                    if let Ok(stream) = converted {
                        self.queued.push_back((stream, addr));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // A connection that failed while queued: the next one may be fine.
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
                Err(_) => break,
            }
        }
        tracing::debug!(queued = self.queued.len(), "listener closed");
    }
}

impl axum::serve::Listener for DrainingListener {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            if let Some(next) = self.queued.pop_front() {
                return next;
            }
            let Some(listener) = &self.inner else {
                // Everything handed over: the server may shut down now.
                self.closed.cancel();
                return std::future::pending().await;
            };
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(next) => return next,
                    // Too many open files and the like: wait a little rather than spin.
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                },
                () = self.close.cancelled() => self.drain_backlog(),
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::serve::Listener as _;

    /// Connections the kernel accepted before the close are handed over, not reset; after
    /// it, connecting is refused.
    #[tokio::test]
    async fn closing_hands_over_the_backlog_then_refuses() {
        let (mut listener, closer) =
            DrainingListener::new(TcpListener::bind("127.0.0.1:0").await.unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        // Three clients connect; nothing has accepted them yet (they wait in the backlog).
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(TcpStream::connect(addr).await.unwrap());
        }
        let closing = tokio::spawn({
            let closer = closer.clone();
            async move { closer.close(std::time::Duration::ZERO).await }
        });
        let mut handed = 0;
        while !closing.is_finished() {
            tokio::select! {
                _ = listener.accept() => handed += 1,
                () = tokio::time::sleep(std::time::Duration::from_millis(20)) => {}
            }
        }
        assert_eq!(handed, 3, "every queued connection was handed over");
        assert_eq!(
            TcpStream::connect(addr).await.err().map(|e| e.kind()),
            Some(io::ErrorKind::ConnectionRefused)
        );
    }
}
