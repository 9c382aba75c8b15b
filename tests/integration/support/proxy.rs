//! A TCP proxy the test controls: it forwards loopback connections to a target until
//! [`TcpProxy::cut`], which closes every open connection (both sides) and refuses new
//! ones until [`TcpProxy::restore`], or [`TcpProxy::freeze`], which keeps the open
//! connections but forwards nothing more (a silently dead network path). Self-contained:
//! tokio only.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use tokio::{
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;

/// Whether connections pass, and the token that ends the current ones.
struct Gate {
    open: bool,
    generation: CancellationToken,
    frozen: CancellationToken,
}

/// A forwarding proxy on a free loopback port (see the module docs).
pub struct TcpProxy {
    /// Where it listens.
    pub addr: SocketAddr,
    gate: Arc<Mutex<Gate>>,
    accept: JoinHandle<()>,
}

impl TcpProxy {
    /// Starts forwarding to `target`.
    pub async fn start(target: SocketAddr) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
        let addr = listener.local_addr().expect("proxy address");
        let gate = Arc::new(Mutex::new(Gate {
            open: true,
            generation: CancellationToken::new(),
            frozen: CancellationToken::new(),
        }));
        let accept = tokio::spawn(accept_loop(listener, target, gate.clone()));
        TcpProxy { addr, gate, accept }
    }

    /// `http://{addr}`, for a gRPC client.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Gate> {
        self.gate.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Closes every forwarded connection and refuses new ones.
    pub fn cut(&self) {
        let mut gate = self.lock();
        gate.open = false;
        gate.generation.cancel();
        gate.generation = CancellationToken::new();
    }

    /// Stops forwarding on every open connection, keeping it open (nothing is closed, so
    /// only keepalives can tell), and refuses new ones.
    pub fn freeze(&self) {
        let mut gate = self.lock();
        gate.open = false;
        gate.frozen.cancel();
        gate.frozen = CancellationToken::new();
    }

    /// Lets new connections through again.
    pub fn restore(&self) {
        self.lock().open = true;
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.lock().generation.cancel();
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, gate: Arc<Mutex<Gate>>) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else { continue };
        let (cut, frozen) = {
            let gate = gate.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if !gate.open {
                // Refused: closing the accepted socket resets the client's attempt.
                drop(inbound);
                continue;
            }
            (gate.generation.clone(), gate.frozen.clone())
        };
        tokio::spawn(async move {
            let Ok(mut outbound) = TcpStream::connect(target).await else { return };
            let mut inbound = inbound;
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            tokio::select! {
                _ = cut.cancelled() => {}
                // Silent: hold both sockets open, move no byte, until cut.
                _ = frozen.cancelled() => cut.cancelled().await,
                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
            }
            // Both sockets drop here: each side sees its connection end.
        });
    }
}
