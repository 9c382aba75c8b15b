//! One assigner served with [`ServerOptions`] (TLS, identity binding, limits), and gRPC
//! clients for it: plain, TLS, mTLS with a given certificate, or through a TCP proxy that
//! can freeze (a peer that vanished without closing its connection).

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use kafka_assigner::metrics::Metrics;
use kafka_assigner::proto::v1::kafka_assigner_client::KafkaAssignerClient;
use kafka_assigner::server::{AssignerServer, ServerOptions};
use kafka_assigner::store::{LeaseStore, MemoryStore, PrefixSnapshot};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use super::assigner::{Backend, TestCoordinator, json, test_config};
use super::certs::Pem;

/// An assigner over one store with the given server options.
pub struct Secured {
    /// The running server.
    pub server: AssignerServer,
    /// The coordinator it serves.
    pub coordinator: TestCoordinator,
    /// The store (for fingerprints).
    pub store: Arc<dyn LeaseStore>,
    /// The key prefix.
    pub prefix: String,
}

impl Secured {
    /// Serves a fresh memory store (topics from [`test_config`]).
    pub async fn memory(options: ServerOptions) -> Secured {
        Self::on(Arc::new(MemoryStore::new()), Backend::Memory, "/secure/".into(), options).await
    }

    /// Serves `store` under `prefix`.
    pub async fn on(
        store: Arc<dyn LeaseStore>,
        backend: Backend,
        prefix: String,
        options: ServerOptions,
    ) -> Secured {
        let mut config = test_config(backend, &prefix);
        config.instance_id = "secure-0".into();
        let metrics = Arc::new(Metrics::new());
        let coordinator = TestCoordinator::start(store.clone(), config, metrics.clone())
            .await
            .unwrap_or_else(|e| panic!("coordinator: {e}"));
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let server = AssignerServer::start_with(coordinator.served(), metrics, any, any, options)
            .await
            .unwrap_or_else(|e| panic!("serve: {e}"));
        let secured = Secured { server, coordinator, store, prefix };
        secured.settled().await;
        secured
    }

    /// Waits (at most 10 s) until the instance has done what it does once at start: it is
    /// ready, leads, and its instance record is stored. A fingerprint taken before would
    /// change without any call.
    async fn settled(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let status = self.coordinator.status().await;
            let stored = self.store.get_prefix(&format!("{}instances/", self.prefix)).await;
            let recorded = stored.is_ok_and(|s| !s.kvs.is_empty());
            if status.ready && status.leader.is_some() && recorded {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "the instance did not settle: {status:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What a refused call must not change: every stored record (and the revision) and
    /// the status view.
    pub async fn fingerprint(&self) -> (PrefixSnapshot, String) {
        let stored = self.store.get_prefix(&self.prefix).await.unwrap_or_else(|e| panic!("store: {e}"));
        (stored, json(&self.coordinator.status().await))
    }

    /// A plaintext client.
    pub async fn plain(&self) -> KafkaAssignerClient<Channel> {
        let url = format!("http://{}", self.server.grpc_addr);
        KafkaAssignerClient::connect(url.clone()).await.unwrap_or_else(|e| panic!("connect {url}: {e}"))
    }

    /// A TLS client trusting `ca` and presenting `identity` (mTLS) if given.
    pub async fn tls(
        &self,
        ca: &str,
        identity: Option<&Pem>,
    ) -> Result<KafkaAssignerClient<Channel>, String> {
        tls_client(self.server.grpc_addr, ca, identity).await
    }

    /// Stops the server and the coordinator.
    pub async fn stop(self) {
        self.server.stop().await;
    }
}

/// A TLS client of `addr` (server name `localhost`) trusting `ca`.
pub async fn tls_client(
    addr: SocketAddr,
    ca: &str,
    identity: Option<&Pem>,
) -> Result<KafkaAssignerClient<Channel>, String> {
    tls_channel(addr, ca, identity).await.map(KafkaAssignerClient::new)
}

/// A TLS connection to `addr` (server name `localhost`) trusting `ca`.
pub async fn tls_channel(addr: SocketAddr, ca: &str, identity: Option<&Pem>) -> Result<Channel, String> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)).domain_name("localhost");
    if let Some(pem) = identity {
        tls = tls.identity(Identity::from_pem(&pem.cert, &pem.key));
    }
    let channel = Channel::from_shared(format!("https://{addr}"))
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| kafka_assigner::store::etcd_tls::error_chain(&e))?;
    Ok(channel)
}

/// A TCP proxy to `target` whose connections stop forwarding (both ways, without closing)
/// once frozen: a peer that disappeared without a FIN, as after a node's power loss.
pub struct FreezingProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    frozen: Arc<AtomicBool>,
}

impl FreezingProxy {
    /// Starts forwarding to `target`.
    pub async fn start(target: SocketAddr) -> FreezingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("proxy bind: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("proxy addr: {e}"));
        let frozen = Arc::new(AtomicBool::new(false));
        let flag = frozen.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(target).await else { continue };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(pump(client_read, server_write, flag.clone()));
                tokio::spawn(pump(server_read, client_write, flag.clone()));
            }
        });
        FreezingProxy { addr, frozen }
    }

    /// From now on nothing is forwarded and nothing is closed.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if frozen.load(Ordering::SeqCst) {
            // Keep both halves open forever, forwarding nothing.
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
