//! `kafka_assigner::testing::InProcessAssigner` used the way a user's integration test
//! would: one call starts it, clients connect, dropping it stops it.

use kafka_assigner::client::{AssignerClient, ShutdownOutcome};
use kafka_assigner::testing::InProcessAssigner;

use crate::client::{Call, Recorder, wait_owned};
use crate::support::{assigner::PROMPT, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_test_with_an_in_process_assigner() {
    let assigner = InProcessAssigner::start(&[("payments", 4)]).await.expect("assigner starts");
    let (first, second) = (Recorder::new(), Recorder::new());
    let a = AssignerClient::start(assigner.client_config("worker-a", "payments"), first.clone(), None)
        .expect("client a");
    wait_owned(&mut a.owned(), "a owns the topic", |o| o.len() == 4).await;
    let b = AssignerClient::start(assigner.client_config("worker-b", "payments"), second.clone(), None)
        .expect("client b");
    let mut owned_b = b.owned();
    let got = wait_owned(&mut owned_b, "b owns half", |o| o.len() == 2).await;
    wait_owned(&mut a.owned(), "a keeps the other half", |o| o.len() == 2 && o.is_disjoint(&got)).await;
    for p in &got {
        assert!(second.kinds().contains(&Call::Warm(*p)), "b warmed {p} first: {:?}", second.kinds());
    }
    let status = assigner.status().await;
    assert_eq!(status.topics.len(), 1, "{status:?}");
    assert_eq!(a.shutdown().await.expect("a stops"), ShutdownOutcome::ShutdownNow);
    assert_eq!(b.shutdown().await.expect("b stops"), ShutdownOutcome::ShutdownNow);
    assert!(first.kinds().iter().all(|c| !matches!(c, Call::GateTimedOut(_))));

    let grpc: std::net::SocketAddr =
        assigner.grpc_url().trim_start_matches("http://").parse().expect("gRPC address");
    let admin = assigner.admin_addr();
    drop(assigner);
    wait_until(PROMPT, "the dropped assigner's ports are closed", || async move {
        tokio::net::TcpStream::connect(admin).await.is_err()
            && tokio::net::TcpStream::connect(grpc).await.is_err()
    })
    .await;
}
