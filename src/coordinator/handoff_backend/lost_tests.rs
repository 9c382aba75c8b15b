//! A registration the store lost while its stream is open (the instance lease expired
//! early, `shared/rebind.rs`), on the memory store (paused time): it is written again as it
//! was (a draining consumer still drains), and the consumer's calls meanwhile are refused
//! as passing, not as final. And a release that waited out its bound is counted.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use tonic::Code;

use crate::coordinator::handoff_backend::records::{ConsumerRecord, Keys};
use crate::coordinator::shared::records::decode;
use crate::coordinator::{
    CommandStream, ConsumerGroupCoordinator, CoordinatorError, HandoffConfig, HandoffCoordinator,
};
use crate::handoff::ConsumerStatus;
use crate::metrics::Metrics;
use crate::proto::v1::{DeregisterAction, assignment_command::Command};
use crate::store::{FaultyStore, KeyValue, LeaseStore, MemoryStore, SessionId};

/// How long (virtual time) a condition may take.
const WITHIN: Duration = Duration::from_secs(10);

async fn next(stream: &mut CommandStream) -> Option<Command> {
    let item = tokio::time::timeout(WITHIN, stream.next()).await.expect("a command in time")?;
    Some(item.expect("not an error").command.expect("a command"))
}

/// A coordinator on `store` for a 2-partition topic `t`, draining on `Deregister`; `a`
/// owns both partitions and `b` has its snapshot.
async fn a_owns_all(store: Arc<dyn LeaseStore>) -> (HandoffCoordinator, CommandStream, CommandStream) {
    let config = HandoffConfig {
        topic_partitions: [("t".to_string(), 2)].into(),
        lease_ttl: Duration::from_secs(3),
        reconcile_interval: Duration::from_millis(100),
        drain_policy: crate::drain::DrainPolicy::Drain,
        ..HandoffConfig::default()
    };
    let coordinator =
        HandoffCoordinator::start(store, config, Arc::new(Metrics::new())).await.expect("starts");
    let mut a = coordinator.register("a", "t").await.expect("a registers");
    let mut owned = 0;
    while owned < 2 {
        if let Some(Command::Assignment(update)) = next(&mut a).await {
            owned += update.assigned.len();
        }
    }
    let mut b = coordinator.register("b", "t").await.expect("b registers");
    next(&mut b).await.expect("b's snapshot");
    (coordinator, a, b)
}

/// The first warm `stream` is told.
async fn warmed(stream: &mut CommandStream) -> u32 {
    loop {
        if let Some(Command::Warm(warm)) = next(stream).await {
            return warm.partition.expect("a partition").partition;
        }
    }
}

/// `consumer`'s stored registration record.
async fn stored(store: &dyn LeaseStore, consumer: &str) -> Option<KeyValue> {
    let key = Keys::new(&HandoffConfig::default().prefix).consumer("t", consumer);
    store.get(&key).await.expect("reads")
}

/// Waits until `consumer`'s registration is stored again, bound to a session other than
/// `lost`; returns its record.
async fn written_again(store: &dyn LeaseStore, consumer: &str, lost: SessionId) -> ConsumerRecord {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        if let Some(kv) = stored(store, consumer).await
            && kv.session.is_some_and(|s| s != lost)
        {
            return decode(&kv.key, &kv.value).expect("decodes");
        }
        assert!(tokio::time::Instant::now() < deadline, "{consumer}'s registration was not written again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_draining_consumer_whose_registration_the_store_lost_still_drains() {
    let store = MemoryStore::new();
    let (coordinator, mut a, mut b) = a_owns_all(Arc::new(store.clone())).await;
    let coordinator = Arc::new(coordinator);
    assert_eq!(coordinator.deregister("a").await.expect("deregisters"), DeregisterAction::WaitForDrain);
    // The leader plans the drain on the draining record: the relay has seen it too.
    let first = warmed(&mut b).await;
    let lost = stored(&store, "a").await.expect("registered").session.expect("bound to the instance lease");
    store.revoke_session(lost).await.expect("the store expires the instance lease early");

    let record = written_again(&store, "a", lost).await;
    assert_eq!(record.status, ConsumerStatus::Draining, "written again as it was: {record:?}");
    // And the drain ends: `b` takes over what `a` held, `a`'s stream ends.
    let b_readies = tokio::spawn({
        let coordinator = coordinator.clone();
        async move {
            coordinator.partition_ready("b", "t", first).await.expect("ready");
            while let Some(command) = next(&mut b).await {
                if let Command::Warm(warm) = command {
                    let p = warm.partition.expect("a partition").partition;
                    coordinator.partition_ready("b", "t", p).await.expect("ready");
                }
            }
        }
    });
    while let Some(command) = next(&mut a).await {
        if let Command::Release(release) = command {
            let p = release.partition.expect("a partition").partition;
            coordinator.partition_released("a", "t", p).await.expect("released");
        }
    }
    b_readies.abort();
}

/// A `Deregister` answered while the mirror is behind the store (its watch hung, and
/// another write came first, so the call's own write cannot be applied in turn): the drain
/// is kept from the write itself, so a registration the store loses before the mirror
/// caught up is written again draining (the whole-cluster simulation's seed 19,891: a
/// session revoked meanwhile, then a re-read that never showed the drain).
#[tokio::test(start_paused = true)]
async fn a_drain_written_while_the_mirror_is_behind_is_kept_from_the_write() {
    use crate::coordinator::shared::registrar::Registrar;
    use crate::store::{Op, Txn};
    let memory = MemoryStore::new();
    let faulty = FaultyStore::new(Arc::new(memory.clone()), 1);
    let (coordinator, _a, _b) = a_owns_all(Arc::new(faulty.clone())).await;
    faulty.hush_watches();
    let elsewhere = format!("{}unrelated", HandoffConfig::default().prefix);
    memory.txn(Txn::new().then(Op::put(&elsewhere, b"x".to_vec()))).await.expect("a write");
    assert_eq!(coordinator.deregister("a").await.expect("deregisters"), DeregisterAction::WaitForDrain);

    let kv = stored(&memory, "a").await.expect("registered");
    let written: ConsumerRecord = decode(&kv.key, &kv.value).expect("decodes");
    assert_eq!(written.status, ConsumerStatus::Draining);
    let key = ("t".to_string(), "a".to_string(), SessionId(written.session));
    let kept =
        coordinator.backend().core().streams().with(&key, |s| s.kept.as_ref().map(|k| (k.0, k.1.clone())));
    let Some(Some((at, record))) = kept else { panic!("a's stream keeps no record: {kept:?}") };
    assert_eq!(at, kv.mod_revision);
    let kept: ConsumerRecord = decode(&kv.key, &record).expect("decodes");
    assert_eq!(kept.status, ConsumerStatus::Draining, "{kept:?}");
}

/// An instance that cannot follow its store (its watch breaks and re-reads fail, while its
/// lease keeper still reaches the store) fences its streams and lets
/// its session lapse: the registrations bound to it do not outlive what it can act on (the
/// whole-cluster simulation's seed 28,483: a crashed consumer's registration, on an instance
/// whose own connection was cut while its lease keeper's was not, stayed for the whole cut).
/// Once it follows again it takes a new session and admits consumers.
#[tokio::test(start_paused = true)]
async fn an_instance_that_cannot_follow_its_store_lets_its_session_lapse() {
    use crate::coordinator::causes::{EndOfStream, Fence};
    let memory = MemoryStore::new();
    let faulty = FaultyStore::new(Arc::new(memory.clone()), 1);
    let (coordinator, mut a, _b) = a_owns_all(Arc::new(faulty.clone())).await;
    let lost = stored(&memory, "a").await.expect("registered").session.expect("bound to the instance lease");
    faulty.cut_reads();
    let ended = loop {
        match tokio::time::timeout(WITHIN, a.next()).await.expect("a's stream ends in time") {
            Some(Ok(_)) => continue,
            other => break other,
        }
    };
    let fenced = matches!(
        ended,
        Some(Err(CoordinatorError::StreamEnded(EndOfStream::Fenced(Fence::CannotFollow { .. }))))
    );
    assert!(fenced, "{ended:?}");
    let deadline = tokio::time::Instant::now() + WITHIN;
    while stored(&memory, "a").await.is_some_and(|kv| kv.session == Some(lost)) {
        assert!(tokio::time::Instant::now() < deadline, "a's registration outlives what its instance can do");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    faulty.restore_reads();
    let deadline = tokio::time::Instant::now() + WITHIN;
    let mut c = loop {
        match coordinator.register("c", "t").await {
            Ok(stream) => break stream,
            Err(error) => assert!(tokio::time::Instant::now() < deadline, "not serving again: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    next(&mut c).await.expect("c's snapshot");
    let session = stored(&memory, "c").await.expect("registered").session;
    assert!(session.is_some_and(|s| s != lost), "on a new session: {session:?}");
}

#[tokio::test(start_paused = true)]
async fn calls_while_a_lost_registration_is_written_again_are_refused_as_passing() {
    let memory = MemoryStore::new();
    let faulty = FaultyStore::new(Arc::new(memory.clone()), 1);
    let (coordinator, _a, mut b) = a_owns_all(Arc::new(faulty.clone())).await;
    // A second consumer makes the leader move a partition to `b`.
    let p = warmed(&mut b).await;
    let lost = stored(&memory, "b").await.expect("registered").session.expect("bound to the instance lease");
    // No new lease for now: the lost registrations stay lost.
    faulty.refuse_grants(true);
    memory.revoke_session(lost).await.expect("the store expires the instance lease early");

    let error = coordinator.partition_ready("b", "t", p).await.expect_err("b is not registered now");
    assert!(matches!(error, CoordinatorError::RegistrationLost { .. }), "{error:?}");
    assert_eq!(crate::server::status::code_of(&error), Code::Unavailable, "retried by the client");

    // Once it is written again, the same call goes through.
    faulty.refuse_grants(false);
    written_again(&memory, "b", lost).await;
    let deadline = tokio::time::Instant::now() + WITHIN;
    while let Err(error) = coordinator.partition_ready("b", "t", p).await {
        assert!(tokio::time::Instant::now() < deadline, "still refused: {error}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The new owner does not read its stream: the old owner's release waits out its bound
/// for the new owner's `assigned` to be taken, then goes, and that is counted.
#[tokio::test(start_paused = true)]
async fn a_release_that_waited_out_its_bound_for_the_new_owner_is_counted() {
    let config = HandoffConfig {
        topic_partitions: [("t".to_string(), 2)].into(),
        lease_ttl: Duration::from_secs(3),
        reconcile_interval: Duration::from_millis(100),
        ..HandoffConfig::default()
    };
    let metrics = Arc::new(Metrics::new());
    let store = Arc::new(MemoryStore::new());
    let coordinator = HandoffCoordinator::start(store, config, metrics.clone()).await.expect("starts");
    let mut a = coordinator.register("a", "t").await.expect("a registers");
    let mut owned = 0;
    while owned < 2 {
        if let Some(Command::Assignment(update)) = next(&mut a).await {
            owned += update.assigned.len();
        }
    }
    let mut b = coordinator.register("b", "t").await.expect("b registers");
    let p = warmed(&mut b).await;
    // From now on b reads nothing: its `assigned` stays in its channel.
    coordinator.partition_ready("b", "t", p).await.expect("ready");
    loop {
        if let Some(Command::Release(_)) = next(&mut a).await {
            break;
        }
    }
    let counted = "kafka_assigner_losses_waited_out_total 1";
    assert!(metrics.encode().lines().any(|line| line == counted), "{}", metrics.encode());
}
