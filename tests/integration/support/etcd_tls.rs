//! A real etcd for one test with TLS, client-certificate auth and users/roles enabled, as
//! production clusters run it.
//!
//! * Certificates come from a fresh [`TestCa`]: the server's (127.0.0.1 / localhost), a
//!   `root` client certificate (with `--client-cert-auth`, etcd takes the CN as the user:
//!   this is the harness's admin connection) and an `assigner` one for the store.
//! * After the first start, users and roles are set up as an operator would: `root` (role
//!   `root`) and `assigner` (password, role `assigner` with read/write on every key), then
//!   auth is enabled. The store connects with the `assigner` certificate **and** password,
//!   so it gets an auth token, which etcd expires after `--auth-token-ttl` of disuse.
//! * `KAT_ETCD_TLS=1` makes every [`super::EtcdServer::start`] one of these, so the
//!   existing etcd scenario tests run over TLS unchanged (see docs/layout.md, "Tests").

use std::{path::PathBuf, time::Duration};

use etcd_client::{Certificate, Client, ConnectOptions, GetOptions, Identity, Permission, TlsOptions};
use kafka_assigner::store::{EtcdSecurity, EtcdStore, EtcdStoreConfig};

use super::certs::{Leaf, Pem, TestCa};
use super::etcd::{MemberSpec, Process, exited, find_etcd, free_ports, log_tail, spawn};

/// The store user's password.
pub const ASSIGNER_PASSWORD: &str = "assigner-secret";
const START_DEADLINE: Duration = Duration::from_secs(15);

/// Whether `KAT_ETCD_TLS` asks for TLS etcd everywhere.
pub fn requested() -> bool {
    std::env::var("KAT_ETCD_TLS").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// One TLS etcd (see the module docs).
pub struct TlsEtcd {
    /// The CA that signed everything (its dir holds the PEM files).
    pub ca: TestCa,
    /// The CA file.
    pub ca_file: PathBuf,
    /// The `assigner` client certificate and key files.
    pub client: (PathBuf, PathBuf),
    root: Pem,
    binary: PathBuf,
    data_dir: PathBuf,
    log: PathBuf,
    client_port: u16,
    peer_port: u16,
    token_ttl: Duration,
    process: Option<Process>,
}

impl TlsEtcd {
    /// Starts one with etcd's default token TTL (300 s).
    pub async fn start() -> TlsEtcd {
        Self::start_with_token_ttl(Duration::from_secs(300)).await
    }

    /// Starts one whose auth tokens expire after `token_ttl` unused (whole seconds).
    pub async fn start_with_token_ttl(token_ttl: Duration) -> TlsEtcd {
        let mut failures = Vec::new();
        for attempt in 1..=5 {
            // A port can be taken between our probe and etcd's bind: then all afresh.
            let mut etcd = Self::prepare(token_ttl);
            match etcd.launch().await {
                Ok(()) => {
                    etcd.enable_auth().await;
                    return etcd;
                }
                Err(error) => failures.push(format!("attempt {attempt}: {error}")),
            }
        }
        panic!("TLS etcd did not start:\n{}", failures.join("\n"));
    }

    /// A CA, certificates and ports; nothing running yet.
    fn prepare(token_ttl: Duration) -> TlsEtcd {
        let ca = TestCa::new("kat-etcd-ca");
        let ca_file = ca.write_ca("ca");
        ca.issue(Leaf::Server).write(ca.dir.path(), "server");
        let client = ca.issue(Leaf::ClientCn("assigner")).write(ca.dir.path(), "assigner");
        let root = ca.issue(Leaf::ClientCn("root"));
        let (data_dir, log) = (ca.dir.path().join("data"), ca.dir.path().join("etcd.log"));
        let (client_port, peer_port) = free_ports();
        TlsEtcd {
            ca_file,
            client,
            root,
            binary: find_etcd(),
            data_dir,
            log,
            client_port,
            peer_port,
            token_ttl,
            process: None,
            ca,
        }
    }

    /// `https://127.0.0.1:port`.
    pub fn endpoints(&self) -> Vec<String> {
        vec![format!("https://127.0.0.1:{}", self.client_port)]
    }

    /// What the assigner uses: the CA, the `assigner` certificate, user and password.
    pub fn security(&self) -> EtcdSecurity {
        EtcdSecurity {
            ca: Some(self.ca_file.clone()),
            cert: Some(self.client.0.clone()),
            key: Some(self.client.1.clone()),
            username: Some("assigner".into()),
            password: Some(ASSIGNER_PASSWORD.into()),
        }
    }

    /// A store config for this server (2 s connect, 5 s request).
    pub fn store_config(&self) -> EtcdStoreConfig {
        let mut config = EtcdStoreConfig::new(self.endpoints())
            .with_connect_timeout(Duration::from_secs(2))
            .with_request_timeout(Duration::from_secs(5));
        config.security = self.security();
        config
    }

    /// A connected store.
    pub async fn store(&self) -> EtcdStore {
        EtcdStore::connect(self.store_config()).await.unwrap_or_else(|e| panic!("TLS etcd store: {e}"))
    }

    /// The admin client (`root` by its certificate's CN).
    pub async fn admin(&self) -> Result<Client, String> {
        let tls = TlsOptions::new()
            .ca_certificate(Certificate::from_pem(self.ca.cert_pem()))
            .identity(Identity::from_pem(&self.root.cert, &self.root.key));
        let options = ConnectOptions::new().with_connect_timeout(Duration::from_millis(500)).with_tls(tls);
        Client::connect(self.endpoints(), Some(options)).await.map_err(|e| format!("admin client: {e}"))
    }

    /// The running process (to signal it), if any.
    pub(super) fn process_mut(&mut self) -> Option<&mut Process> {
        self.process.as_mut()
    }

    /// Kills it (data kept).
    pub fn stop(&mut self) {
        if let Some(process) = self.process.take() {
            process.stop();
        }
    }

    /// Starts it again on the same ports and data.
    pub async fn restart(&mut self) {
        if self.process.is_none() {
            self.launch().await.unwrap_or_else(|e| panic!("TLS etcd did not restart: {e}"));
        }
    }

    async fn launch(&mut self) -> Result<(), String> {
        let dir = self.ca.dir.path();
        let extra_args = [
            format!("--cert-file={}", dir.join("server.crt").display()),
            format!("--key-file={}", dir.join("server.key").display()),
            format!("--trusted-ca-file={}", self.ca_file.display()),
            "--client-cert-auth".to_string(),
            format!("--auth-token-ttl={}", self.token_ttl.as_secs().max(1)),
            // The cheapest bcrypt: authenticating is on every test's start path.
            "--bcrypt-cost=4".to_string(),
        ];
        let initial_cluster = format!("test=http://127.0.0.1:{}", self.peer_port);
        let spec = MemberSpec {
            binary: &self.binary,
            name: "test",
            data_dir: &self.data_dir,
            log: &self.log,
            client_port: self.client_port,
            peer_port: self.peer_port,
            initial_cluster: &initial_cluster,
            client_scheme: "https",
            extra_args: &extra_args,
        };
        let (mut process, log_start) = spawn(&spec)?;
        let give_up = tokio::time::Instant::now() + START_DEADLINE;
        let mut last_error;
        loop {
            if let Some(reason) = exited(&mut process) {
                last_error = reason;
                break;
            }
            match self.admin().await {
                Ok(mut client) => {
                    let probe = client.get("kat-health", Some(GetOptions::new().with_count_only()));
                    match tokio::time::timeout(Duration::from_millis(500), probe).await {
                        Ok(Ok(_)) => {
                            self.process = Some(process);
                            return Ok(());
                        }
                        Ok(Err(e)) => last_error = e.to_string(),
                        Err(_) => last_error = "probe timed out".into(),
                    }
                }
                Err(e) => last_error = e,
            }
            if tokio::time::Instant::now() >= give_up {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        process.stop();
        Err(format!("{last_error}; etcd log:\n{}", log_tail(&self.log, log_start)))
    }

    /// Users `root` and `assigner` with their roles, then `auth enable` (what etcdctl does).
    async fn enable_auth(&self) {
        let mut admin = self.admin().await.unwrap_or_else(|e| panic!("{e}"));
        let fail = |what: &str, e: etcd_client::Error| -> ! { panic!("etcd auth setup, {what}: {e}") };
        admin.role_add("root").await.unwrap_or_else(|e| fail("role root", e));
        admin.user_add("root", "root-secret", None).await.unwrap_or_else(|e| fail("user root", e));
        admin.user_grant_role("root", "root").await.unwrap_or_else(|e| fail("grant root", e));
        admin.role_add("assigner").await.unwrap_or_else(|e| fail("role assigner", e));
        let everything = Permission::read_write(vec![0u8]).with_from_key();
        admin.role_grant_permission("assigner", everything).await.unwrap_or_else(|e| fail("permission", e));
        admin
            .user_add("assigner", ASSIGNER_PASSWORD, None)
            .await
            .unwrap_or_else(|e| fail("user assigner", e));
        admin.user_grant_role("assigner", "assigner").await.unwrap_or_else(|e| fail("grant assigner", e));
        admin.auth_enable().await.unwrap_or_else(|e| fail("auth enable", e));
    }
}

impl Drop for TlsEtcd {
    fn drop(&mut self) {
        self.stop();
    }
}
