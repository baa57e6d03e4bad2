//! Kept-alive HTTP/1.1 connections to one host, shared by the clients the
//! tool runs: the forwarder's destination (`forward.rs`) and the
//! authority (`authority.rs`). A request takes an idle connection that is
//! still ready, or opens one; the caller gives it back once it read the
//! answer to its end ([`Pool::put_back`]), and drops it otherwise (its
//! socket closes at once, so a body not read is not read on in the
//! background).

use std::sync::Mutex;

/// The most a connection buffers from the socket, in bytes (hyper's
/// `max_buf_size`, whose default is 408 KiB): an answer's head must fit,
/// and no more of a long body than this is read ahead of its reader.
pub(crate) const READ_BUFFER: usize = 16 * 1024;

/// One open connection.
pub(crate) struct Connection<B> {
    /// Its request half.
    sender: hyper::client::conn::http1::SendRequest<B>,
    /// The task that reads and writes its socket. Aborted when the
    /// connection is dropped, which closes the socket at once.
    driver: tokio::task::AbortHandle,
    /// Whether it was kept alive from an earlier request: the host may
    /// have closed it meanwhile without saying so.
    reused: bool,
}

impl<B> Drop for Connection<B> {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// The kept-alive connections to one `host:port`.
pub(crate) struct Pool<B> {
    /// `host:port` to connect to.
    address: String,
    /// Connections not in use. A std mutex: held to take or put one back.
    idle: Mutex<Vec<Connection<B>>>,
}

impl<B> Pool<B>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// No connection yet to `address` (`host:port`).
    pub(crate) fn new(address: String) -> Self {
        Self {
            address,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// `host:port` (what a test checks a URL was read into).
    #[cfg(test)]
    pub(crate) fn address(&self) -> &str {
        &self.address
    }

    /// A ready connection: an idle one, or a new one.
    ///
    /// # Errors
    /// Why a new one could not be opened, in words.
    async fn connection(&self) -> Result<Connection<B>, String> {
        loop {
            let idle = self
                .idle
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .pop();
            match idle {
                Some(mut connection) => {
                    if connection.sender.ready().await.is_ok() {
                        connection.reused = true;
                        return Ok(connection);
                    }
                }
                None => break,
            }
        }
        self.connect().await
    }

    /// A new connection.
    ///
    /// # Errors
    /// Why it could not be opened, in words.
    async fn connect(&self) -> Result<Connection<B>, String> {
        let stream = tokio::net::TcpStream::connect(&self.address)
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", self.address))?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = hyper::client::conn::http1::Builder::new()
            .max_buf_size(READ_BUFFER)
            .handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP handshake: {e}"))?;
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        })
        .abort_handle();
        Ok(Connection {
            sender,
            driver,
            reused: false,
        })
    }

    /// Gives back a connection whose answer was read to its end.
    pub(crate) fn put_back(&self, connection: Connection<B>) {
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(connection);
    }

    /// Sends the request `make` builds until its answer's head: the answer
    /// and the connection it came on.
    ///
    /// A kept-alive connection that ends before any answer (the host
    /// closed it after its last answer without `Connection: close`, and
    /// the request crossed that close) is not a failure: the request is
    /// built and sent again at once on a new connection, as HTTP clients
    /// do for requests they may repeat (RFC 9112 §9.3.1). A new connection
    /// that fails is a failure.
    ///
    /// # Errors
    /// `make`'s error, or why no answer came, in words.
    pub(crate) async fn send(
        &self,
        make: impl Fn() -> Result<http::Request<B>, String>,
    ) -> Result<(Connection<B>, http::Response<hyper::body::Incoming>), String> {
        let mut connection = self.connection().await?;
        let error = match connection.sender.send_request(make()?).await {
            Ok(response) => return Ok((connection, response)),
            Err(e) => e,
        };
        if !(connection.reused && ended_before_answer(&error)) {
            return Err(format!("no answer: {error}"));
        }
        tracing::debug!(
            error = %error,
            address = %self.address,
            "a kept-alive connection ended before any answer; sending again on a new one"
        );
        drop(connection);
        let mut connection = self.connect().await?;
        match connection.sender.send_request(make()?).await {
            Ok(response) => Ok((connection, response)),
            Err(e) => Err(format!("no answer: {e}")),
        }
    }
}

/// Whether `error` says a connection ended before an answer came on it:
/// closed or reset by the peer, or closed before the request was written
/// (not an answer that does not parse, nor a request that cannot be
/// written).
fn ended_before_answer(error: &hyper::Error) -> bool {
    error.is_canceled()
        || error.is_incomplete_message()
        || error.is_closed()
        || std::error::Error::source(error).is_some_and(|s| s.is::<std::io::Error>())
}
