//! A TCP proxy on loopback that a test controls, to cut one client off from a server (an
//! assigner instance from etcd) while everyone else keeps it.
//!
//! * [`Proxy::restore`]: forward (the start state).
//! * [`Proxy::cut`]: reset every open connection now (RST both ways, like a crashed
//!   middlebox). New connections follow the mode.
//! * [`Proxy::refuse`]: reset every new connection at once (the client sees the peer
//!   refusing or resetting, quickly).
//! * [`Proxy::hold`]: accept new connections but send nothing anywhere until the mode
//!   changes (a SYN that got through to a stalled peer); open connections keep working.
//! * [`Proxy::blackhole`]: a network partition: nothing moves on open or new connections,
//!   nothing is reset, until the mode changes; then held bytes flow on.
//! * [`Proxy::partition`]: [`cut`](Proxy::cut) + [`refuse`](Proxy::refuse): the server is
//!   unreachable, and the client knows at once.
//!
//! Sockets are set to zero linger, so every close the proxy makes is a reset, never a
//! lingering half-open connection.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream, tcp::OwnedReadHalf, tcp::OwnedWriteHalf},
    sync::watch,
    task::JoinHandle,
};

/// What the proxy does with traffic (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward everything.
    Forward,
    /// Reset new connections at once.
    Refuse,
    /// Accept new connections, forward nothing on them until the mode changes.
    Hold,
    /// Forward nothing on any connection, reset nothing.
    Blackhole,
}

/// A controllable TCP proxy (see the module docs). Dropping it stops it and resets every
/// connection.
pub struct Proxy {
    addr: SocketAddr,
    target: SocketAddr,
    mode: watch::Sender<Mode>,
    /// Bumped by [`cut`](Self::cut): connections opened before it end.
    cuts: watch::Sender<u64>,
    open: Arc<AtomicUsize>,
    accepted: Arc<AtomicUsize>,
    listener: JoinHandle<()>,
}

impl Proxy {
    /// A proxy on a free loopback port, forwarding to `target`.
    ///
    /// # Panics
    /// If no loopback port can be bound.
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener =
            TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("proxy cannot bind: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("proxy local_addr: {e}"));
        let (mode, _) = watch::channel(Mode::Forward);
        let (cuts, _) = watch::channel(0u64);
        let open = Arc::new(AtomicUsize::new(0));
        let accepted = Arc::new(AtomicUsize::new(0));
        let context = Context { target, mode: mode.subscribe(), cuts: cuts.subscribe(), open: open.clone() };
        let counter = accepted.clone();
        let listener = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                context.open.fetch_add(1, Ordering::SeqCst);
                // The connection belongs to the cut generation current when it was accepted.
                let generation = *context.cuts.borrow();
                let context = context.clone();
                tokio::spawn(async move { context.serve(client, generation).await });
            }
        });
        Proxy { addr, target, mode, cuts, open, accepted, listener }
    }

    /// A proxy in front of `url` (`http://127.0.0.1:port`, as etcd endpoints are written).
    pub async fn in_front_of(url: &str) -> Proxy {
        let authority = url.trim_start_matches("http://").trim_end_matches('/');
        let target: SocketAddr = authority.parse().unwrap_or_else(|e| panic!("proxy target {url}: {e}"));
        Proxy::start(target).await
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://` + [`addr`](Self::addr).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Where it forwards to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// Connections open right now (accepted and not yet ended).
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn accepted_connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }

    /// Resets every open connection now.
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }

    /// Resets new connections at once.
    pub fn refuse(&self) {
        self.mode.send_replace(Mode::Refuse);
    }

    /// Holds new connections (nothing forwarded) until the mode changes.
    pub fn hold(&self) {
        self.mode.send_replace(Mode::Hold);
    }

    /// Forwards nothing, resets nothing, until the mode changes.
    pub fn blackhole(&self) {
        self.mode.send_replace(Mode::Blackhole);
    }

    /// Resets open connections and refuses new ones: the target is unreachable.
    pub fn partition(&self) {
        self.refuse();
        self.cut();
    }

    /// Forwards again (held connections and held bytes go on).
    pub fn restore(&self) {
        self.mode.send_replace(Mode::Forward);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.listener.abort();
        self.cut();
    }
}

/// What every connection task needs.
#[derive(Clone)]
struct Context {
    target: SocketAddr,
    mode: watch::Receiver<Mode>,
    cuts: watch::Receiver<u64>,
    open: Arc<AtomicUsize>,
}

/// Counts a connection as open while it lives.
struct OpenGuard(Arc<AtomicUsize>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Context {
    async fn serve(self, client: TcpStream, generation: u64) {
        let Context { target, mut mode, mut cuts, open } = self;
        let _guard = OpenGuard(open);
        // Every close we make is a reset.
        let _ = client.set_zero_linger();
        let cut = async move {
            let _ = cuts.wait_for(|g| *g != generation).await;
        };
        tokio::pin!(cut);
        // Wait for a mode that lets the connection through.
        loop {
            let now = *mode.borrow_and_update();
            match now {
                Mode::Forward => break,
                Mode::Refuse => return,
                Mode::Hold | Mode::Blackhole => {
                    tokio::select! {
                        changed = mode.changed() => if changed.is_err() { return },
                        () = &mut cut => return,
                    }
                }
            }
        }
        let upstream = tokio::select! {
            upstream = TcpStream::connect(target) => upstream,
            () = &mut cut => return,
        };
        let Ok(upstream) = upstream else { return };
        let _ = upstream.set_zero_linger();
        let (client_read, client_write) = client.into_split();
        let (upstream_read, upstream_write) = upstream.into_split();
        let up = pump(client_read, upstream_write, mode.clone());
        let down = pump(upstream_read, client_write, mode);
        tokio::select! {
            () = &mut cut => {}
            _ = async { tokio::join!(up, down) } => {}
        }
        // Dropping the halves resets both sockets (zero linger).
    }
}

/// Copies `from` → `to`, holding bytes while the proxy is a black hole; half-closes `to`
/// when `from` ends.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut mode: watch::Receiver<Mode>) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if mode.wait_for(|m| *m != Mode::Blackhole).await.is_err() {
            return;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}
