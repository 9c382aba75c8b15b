//! Many consumers' calls multiplexed over one HTTP/2 connection, as a pooling proxy (Envoy,
//! a service mesh sidecar) or the scale benchmark sends them: a burst of small unary calls
//! must all reach the service, none refused by the transport.
//!
//! h2 (0.4.16 and later) closes a connection with GOAWAY `ENHANCE_YOUR_CALM`
//! ("too_many_data_frames") when the small DATA frames it holds unread exceed a budget of
//! half the connection window. Each unary request is one small DATA frame that waits
//! unread until its handler task runs, so with hyper's 1 MiB default window a burst of
//! about 2,200 calls on one connection used to kill the connection, every call in flight
//! on it and the consumers' streams (`RESOURCE_EXHAUSTED` "h2 protocol error"). See
//! `kafka_assigner::server::limits::HTTP2_CONNECTION_WINDOW`.

use std::error::Error as _;

use kafka_assigner::proto::v1::{PartitionReleasedRequest, TopicPartition};
use kafka_assigner::server::ServerOptions;
use tokio::task::JoinSet;

use crate::support::assigner::{PROMPT, TOPIC, TestConsumer};
use crate::support::secure::Secured;

/// Calls in the burst: well over the ~2,200 small frames the old budget held, well under
/// the streams one connection may open (`HTTP2_MAX_CONCURRENT_STREAMS`).
const BURST: u32 = 10_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_small_calls_on_one_connection_is_answered_by_the_service() {
    let served = Secured::memory(ServerOptions::default()).await;
    // One connection for everything: the consumer's stream and every call.
    let client = served.plain().await;
    let mut consumer = TestConsumer::register(client.clone(), "burst", TOPIC).await.expect("Register");
    consumer.next(PROMPT, "the snapshot").await;

    let mut calls = JoinSet::new();
    for i in 0..BURST {
        let mut client = client.clone();
        calls.spawn(async move {
            let partition = Some(TopicPartition { topic: TOPIC.into(), partition: i % 4 });
            let request = PartitionReleasedRequest { consumer_name: "burst".into(), partition };
            client.partition_released(request).await.map(drop)
        });
    }
    // Every call ends: the service answers, or (the bug) the transport fails it.
    let (mut transport_failures, mut kinds) = (0, std::collections::BTreeSet::new());
    let all = tokio::time::timeout(PROMPT * 4, async {
        while let Some(joined) = calls.join_next().await {
            // A status the server sent has no source; one the client made from a transport
            // error (GOAWAY, reset, broken connection) carries it.
            if let Err(status) = joined.expect("call task")
                && let Some(error) = status.source()
            {
                transport_failures += 1;
                kinds.insert(format!("{:?} {error:?}", status.code()));
            }
        }
    })
    .await;
    assert!(all.is_ok(), "the burst of {BURST} calls did not end within {:?}", PROMPT * 4);
    assert_eq!(
        transport_failures, 0,
        "{transport_failures} of {BURST} calls failed in the transport: {kinds:#?}"
    );

    // The connection survived: the consumer's stream is still open.
    consumer.poll_now();
    assert!(consumer.ended.is_none(), "the consumer's stream ended: {:?}", consumer.ended);
    served.stop().await;
}
