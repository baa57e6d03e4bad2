//! An HTTP server on loopback for the tests that play a destination, an
//! authority or a collector: `app` served in a thread with a runtime of its
//! own, so that it answers whatever the test's own runtime is doing.

use std::net::SocketAddr;
use tokio::sync::oneshot;

/// Serves `app` on `127.0.0.1` at a free port: the address it listens on,
/// and a sender whose drop (or send) stops the server.
pub fn serve(app: axum::Router) -> (SocketAddr, oneshot::Sender<()>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop, stopped) = oneshot::channel::<()>();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            tokio::select! {
                served = async { axum::serve(listener, app).await } => served.unwrap(),
                _ = stopped => {}
            }
        });
    });
    (rx.recv().unwrap(), stop)
}
