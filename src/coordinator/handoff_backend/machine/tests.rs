//! One instance driven by hand over a store answered in the test (`test_harness.rs`).

use std::time::Duration;

use super::test_harness::{Harness, SESSION, commands, handoff_under_way, lose, reply, txn_rev};
use crate::coordinator::handoff_backend::leader_groups::LeaderGroup;
use crate::coordinator::machine::io::{Call, Effect, EndReason, Input, LeaseState, Replied};
use crate::coordinator::machine::observe::Observation;
use crate::coordinator::{CoordinatorError, causes::EndOfStream};
use crate::mutation::{Mutation, with_mutation};
use crate::proto::v1::assignment_command::Command;
use crate::store::{Compare, Op, Txn};

#[test]
fn a_register_is_written_with_a_compare_and_answered_with_its_snapshot() {
    let mut h = Harness::new();
    h.register(1, 11, "a");
    let effects = h.take();
    assert!(matches!(reply(&effects, 1), Some(Ok(Replied::Registered))), "{effects:?}");
    let key = h.keys.consumer("t", "a");
    let (txn, _) =
        h.store.txns.iter().find(|(t, _)| t.ops.iter().any(|op| op.key() == key)).expect("written");
    assert!(txn.compares.contains(&Compare::ModRevision(key.clone(), 0)), "{txn:?}");
    assert!(matches!(&txn.ops[0], Op::Put { session: Some(s), .. } if *s == SESSION), "bound to the lease");
    let first = commands(&effects, 11);
    assert!(
        matches!(first.first(), Some(Command::Assignment(u)) if u.assigned.is_empty() && u.unassigned.is_empty()),
        "the first message is the (empty) snapshot: {first:?}"
    );
}

#[test]
fn a_ready_commits_and_the_new_owner_hears_assigned_before_the_old_owner_hears_its_release() {
    let mut h = Harness::new();
    let partition = handoff_under_way(&mut h);
    let ready = Call::PartitionReady { consumer: "b".into(), topic: "t".into(), partition };
    h.input(Input::Call { call: 3, body: ready });
    let effects = h.take();
    assert!(matches!(reply(&effects, 3), Some(Ok(Replied::Applied))), "{effects:?}");
    let (txn, ok) = h.store.txns.last().expect("written");
    assert!(ok);
    assert!(txn.compares.contains(&Compare::ModRevision(
        h.keys.handoff("t", partition),
        txn_rev(txn, &h.keys.handoff("t", partition))
    )));
    let order: Vec<(u64, &Command)> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Command { stream, command } => command.command.as_ref().map(|c| (*stream, c)),
            _ => None,
        })
        .collect();
    let assigned = order.iter().position(|(s, c)| {
        *s == 12 && matches!(c, Command::Assignment(u) if u.assigned.iter().any(|p| p.partition == partition))
    });
    let released = order.iter().position(|(s, c)| *s == 11 && matches!(c, Command::Release(_)));
    assert!(assigned.is_some() && released.is_some(), "{order:?}");
    assert!(assigned < released, "the new owner hears first: {order:?}");
}

#[test]
fn without_its_handoff_compare_a_ready_writes_unguarded() {
    let mut h = Harness::new();
    let partition = handoff_under_way(&mut h);
    let ready = Call::PartitionReady { consumer: "b".into(), topic: "t".into(), partition };
    with_mutation(Mutation::HandoffCompareDropped, || h.input(Input::Call { call: 3, body: ready }));
    let (txn, _) = h.store.txns.last().expect("written");
    assert_eq!(
        txn_rev(txn, &h.keys.handoff("t", partition)),
        -1,
        "the mutation reaches the machine: {txn:?}"
    );
}

#[test]
fn a_fenced_lease_ends_the_streams_and_refuses_calls() {
    let mut h = Harness::new();
    let partition = handoff_under_way(&mut h);
    h.input(Input::Lease(LeaseState::Fenced(SESSION)));
    let effects = h.take();
    for stream in [11, 12] {
        let ended = effects.iter().any(|e| {
            matches!(e, Effect::EndStream { stream: s, reason: EndReason::Disconnected, error: Some(CoordinatorError::StreamEnded(EndOfStream::Fenced(_))) } if *s == stream)
        });
        assert!(ended, "stream {stream} ends fenced: {effects:?}");
    }
    assert!(effects.iter().any(|e| matches!(e, Effect::Ready(false))), "not ready: {effects:?}");
    let ready = Call::PartitionReady { consumer: "b".into(), topic: "t".into(), partition };
    h.input(Input::Call { call: 3, body: ready });
    let effects = h.take();
    assert!(matches!(reply(&effects, 3), Some(Err(CoordinatorError::NoSession(_)))), "{effects:?}");
}

#[test]
fn with_self_fencing_skipped_a_fenced_lease_leaves_the_streams_open() {
    let mut h = Harness::new();
    handoff_under_way(&mut h);
    with_mutation(Mutation::SelfFenceSkipped, || h.input(Input::Lease(LeaseState::Fenced(SESSION))));
    let effects = h.take();
    assert!(!effects.iter().any(|e| matches!(e, Effect::EndStream { .. })), "{effects:?}");
}

#[test]
fn a_leader_campaigns_on_absence_and_every_plan_batch_compares_its_fence() {
    let mut h = Harness::new();
    let leader = h.keys.leader(LeaderGroup::ONLY);
    let campaign =
        h.store.txns.iter().find(|(t, _)| t.ops.iter().any(|op| op.key() == leader)).expect("campaigned");
    assert_eq!(campaign.0.compares, vec![Compare::CreateRevision(leader.clone(), 0)]);
    assert!(h.take().iter().any(|e| matches!(e, Effect::Leading(true))));
    let fence = h.store.kvs.get(&leader).expect("the key").create_revision;
    handoff_under_way(&mut h);
    let plans: Vec<&Txn> = h
        .store
        .txns
        .iter()
        .map(|(t, _)| t)
        .filter(|t| {
            t.ops
                .iter()
                .any(|op| op.key().starts_with("/k/assignments/") || op.key().starts_with("/k/handoffs/"))
        })
        .collect();
    assert!(plans.len() >= 2, "the direct assignment and the handoff were planned: {plans:?}");
    for plan in plans {
        assert_eq!(plan.compares.first(), Some(&Compare::CreateRevision(leader.clone(), fence)), "{plan:?}");
    }
}

#[test]
fn without_its_fence_the_leaders_plan_is_unguarded() {
    let mut h = Harness::new();
    h.register(1, 11, "a");
    let leader = h.keys.leader(LeaderGroup::ONLY);
    with_mutation(Mutation::LeaderUnfenced, || h.advance(Duration::from_millis(400)));
    let (plan, _) = h.store.txns.last().expect("planned");
    assert!(plan.ops.iter().any(|op| op.key().starts_with("/k/assignments/")), "{plan:?}");
    assert!(
        !plan.compares.iter().any(|c| matches!(c, Compare::CreateRevision(k, _) if *k == leader)),
        "{plan:?}"
    );
}

#[test]
fn a_stream_that_closes_keeps_its_registration_for_the_ttl_then_it_is_deleted() {
    let mut h = Harness::new();
    h.register(1, 11, "a");
    h.input(Input::StreamClosed { stream: 11 });
    let key = h.keys.consumer("t", "a");
    h.advance(Duration::from_secs(5));
    assert!(h.store.kvs.contains_key(&key), "kept within the TTL");
    h.advance(Duration::from_secs(6));
    assert!(!h.store.kvs.contains_key(&key), "deleted after the TTL");
}

#[test]
fn the_same_inputs_give_the_same_effects() {
    let trace = || {
        let mut h = Harness::new();
        handoff_under_way(&mut h);
        format!("{:?}", h.store.txns)
    };
    assert_eq!(trace(), trace());
}

#[test]
fn a_register_whose_caller_went_away_writes_nothing() {
    let mut h = Harness::new();
    h.input(Input::StreamClosed { stream: 11 });
    h.register(1, 11, "a");
    let effects = h.take();
    assert!(matches!(reply(&effects, 1), Some(Err(CoordinatorError::Abandoned { .. }))), "{effects:?}");
    assert!(!h.store.kvs.contains_key(&h.keys.consumer("t", "a")), "nothing written");
}

#[test]
fn a_registration_the_store_lost_is_written_again_only_where_none_is() {
    let mut h = Harness::new();
    h.register(1, 11, "a");
    let key = h.keys.consumer("t", "a");
    let before = h.store.kvs.get(&key).map(|kv| kv.value.clone());
    h.take();
    lose(&mut h, &key);
    let (rebind, ok) = h.store.txns.last().expect("written again");
    assert!(ok);
    assert_eq!(rebind.compares, vec![Compare::ModRevision(key.clone(), 0)], "compare on absence");
    assert_eq!(h.store.kvs.get(&key).map(|kv| kv.value.clone()), before, "the same registration");
    assert!(!h.take().iter().any(|e| matches!(e, Effect::EndStream { .. })), "the stream goes on");
    with_mutation(Mutation::RebindCompareDropped, || lose(&mut h, &key));
    let (rebind, _) = h.store.txns.last().expect("written again");
    assert!(rebind.compares.is_empty(), "the mutation reaches the machine: {rebind:?}");
}

#[test]
fn a_delete_the_store_could_not_take_is_tried_again_once_it_answers() {
    let mut h = Harness::new();
    h.register(1, 11, "a");
    h.input(Input::StreamClosed { stream: 11 });
    let key = h.keys.consumer("t", "a");
    h.store.down = true;
    h.advance(Duration::from_secs(11));
    assert!(h.store.kvs.contains_key(&key), "the store did not answer");
    h.store.down = false;
    h.advance(Duration::from_millis(60));
    assert!(!h.store.kvs.contains_key(&key), "deleted once it answers, without waiting another TTL");
}

#[test]
fn a_ready_is_applied_and_told_ahead_of_a_lagging_watch_and_only_once() {
    let mut h = Harness::new();
    let partition = handoff_under_way(&mut h);
    h.store.lagging = Some(Vec::new());
    // Someone else's write the watch has not brought yet.
    let elsewhere = Txn::new().then(Op::put("/k/topics/other", b"{}".to_vec()));
    let (_, batch) = h.store.txn(&elsewhere);
    h.store.lagging.as_mut().expect("lagging").extend(batch);
    let ready = Call::PartitionReady { consumer: "b".into(), topic: "t".into(), partition };
    h.input(Input::Call { call: 3, body: ready });
    let owns = |c: &Command| matches!(c, Command::Assignment(u) if u.assigned.iter().any(|p| p.partition == partition));
    let told = h.take();
    assert_eq!(commands(&told, 12).iter().filter(|c| owns(c)).count(), 1, "told at once: {told:?}");
    let Some(watch) = h.store.watch else { panic!("watching") };
    for batch in h.store.lagging.take().expect("lagging") {
        let effects = h.instance.step(h.now, Input::Watched { watch, batch });
        h.run(effects);
    }
    let later = h.take();
    assert!(!commands(&later, 12).iter().any(owns), "not told again when the watch catches up: {later:?}");
}

#[test]
fn a_deregister_that_wants_a_drain_drains_when_another_can_take_over() {
    let mut h = Harness::new();
    handoff_under_way(&mut h);
    h.input(Input::Call { call: 5, body: Call::Deregister { consumer: "a".into(), wants_drain: true } });
    let effects = h.take();
    let drain = crate::proto::v1::DeregisterAction::WaitForDrain;
    assert!(
        matches!(reply(&effects, 5), Some(Ok(Replied::Deregistered(action))) if *action == drain),
        "{effects:?}"
    );
    let stored = h.store.kvs.get(&h.keys.consumer("t", "a")).expect("still registered");
    let record: crate::coordinator::handoff_backend::records::ConsumerRecord =
        crate::coordinator::handoff_backend::records::decode(&stored.key, &stored.value).expect("a record");
    assert_eq!(record.status, crate::handoff::ConsumerStatus::Draining);
    h.input(Input::Call { call: 6, body: Call::Deregister { consumer: "nobody".into(), wants_drain: true } });
    let effects = h.take();
    assert!(matches!(reply(&effects, 6), Some(Err(CoordinatorError::UnknownConsumer(_)))), "{effects:?}");
}

#[test]
fn an_epoch_stream_gets_a_snapshot_then_another_when_ownership_changes() {
    let mut h = Harness::new();
    let partition = handoff_under_way(&mut h);
    let watch = Call::WatchEpochs { stream: 21, consumer: "a".into(), topic: "t".into() };
    h.input(Input::Call { call: 4, body: watch });
    let snapshots = |effects: &[Effect]| -> Vec<crate::coordinator::EpochsAt> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Epochs { stream: 21, epochs } => Some(epochs.clone()),
                _ => None,
            })
            .collect()
    };
    let effects = h.take();
    assert!(matches!(reply(&effects, 4), Some(Ok(Replied::WatchingEpochs))), "{effects:?}");
    let first = snapshots(&effects);
    assert_eq!(first.len(), 1, "{effects:?}");
    assert_eq!(first[0].partitions.len(), 2, "a owns both: {first:?}");
    assert!(first[0].partitions.iter().all(|p| p.epoch > 0 && !p.warming));
    let ready = Call::PartitionReady { consumer: "b".into(), topic: "t".into(), partition };
    h.input(Input::Call { call: 3, body: ready });
    let next = snapshots(&h.take());
    assert_eq!(next.len(), 1);
    assert!(
        next[0].partitions.iter().all(|p| p.partition != partition),
        "the moved partition is gone: {next:?}"
    );
    assert!(next[0].revision > first[0].revision);
}

/// What the step observed among `effects` (for metrics and logs).
fn observed(effects: &[Effect]) -> Vec<Observation> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Observe(o) => Some(o.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn the_step_observes_what_the_loop_records() {
    let mut h = Harness::new();
    h.register(1, 11, "a");
    h.advance(Duration::from_millis(400)); // the first joins settle, then the plan
    h.register(2, 12, "b");
    h.advance(Duration::from_millis(10));
    let effects = h.take();
    let partition = commands(&effects, 12)
        .iter()
        .find_map(|c| match c {
            Command::Warm(w) => w.partition.as_ref().map(|p| p.partition),
            _ => None,
        })
        .expect("b warms a partition");
    let seen = observed(&effects);
    assert!(seen.contains(&Observation::LeaderGroups { groups: 1 }), "{seen:?}");
    assert!(seen.contains(&Observation::Leadership { group: 0, won: true, led: 1 }), "{seen:?}");
    assert!(seen.iter().any(|o| matches!(o, Observation::Planned { partitions } if *partitions > 0)));
    let reports: Vec<&crate::handoff::PlanReport> = seen
        .iter()
        .filter_map(|o| match o {
            Observation::Written { report: Some(report), .. } => Some(report),
            _ => None,
        })
        .collect();
    let direct: usize = reports.iter().map(|r| r.assigned_directly.len()).sum();
    let started: Vec<u32> = reports.iter().flat_map(|r| r.started.iter().map(|(p, _, _)| *p)).collect();
    assert_eq!((direct, started), (2, vec![partition]), "{seen:?}");

    let ready = Call::PartitionReady { consumer: "b".into(), topic: "t".into(), partition };
    h.input(Input::Call { call: 3, body: ready });
    let seen = observed(&h.take());
    let flipped = seen.iter().find_map(|o| match o {
        Observation::Ready { partition: p, consumer, warm_since, at, .. }
            if *p == partition && consumer == "b" =>
        {
            Some((*warm_since, *at))
        }
        _ => None,
    });
    assert!(matches!(flipped, Some((Some(since), at)) if since <= at), "with its warm's start: {seen:?}");
    let sent =
        |o: &Observation| matches!(o, Observation::ReleaseSent { partition: p, .. } if *p == partition);
    assert!(seen.iter().any(sent), "the old owner's release was sent: {seen:?}");

    let released = Call::PartitionReleased { consumer: "a".into(), topic: "t".into(), partition };
    h.input(Input::Call { call: 4, body: released });
    let seen = observed(&h.take());
    let done = |o: &Observation| matches!(o, Observation::Released { partition: p, consumer, .. } if *p == partition && consumer == "a");
    assert!(seen.iter().any(done), "{seen:?}");
}

/// Whether `commands` tell their consumer to warm a partition.
fn warms(commands: &[Command]) -> bool {
    commands.iter().any(|c| matches!(c, Command::Warm(_)))
}

#[test]
fn a_measured_planning_time_holds_the_next_look_back() {
    let mut h = Harness::new();
    // Paced as the production driver paces it: no stated cost, the measure told.
    h.instance.pacing = super::leader::Pacing::new(0, true);
    h.register(1, 11, "a");
    h.advance(Duration::from_millis(400)); // the first joins settle, then the plan
    let a = commands(&h.take(), 11);
    assert!(a.iter().any(|c| matches!(c, Command::Assignment(u) if u.assigned.len() == 2)), "{a:?}");
    // The step that planned took 50 ms: the leader looks again only after PLAN_PACE × that.
    h.input(Input::PlanningTook { took: Duration::from_millis(50) });
    h.register(2, 12, "b");
    h.advance(Duration::from_millis(150));
    let b = commands(&h.take(), 12);
    assert!(!warms(&b), "no plan within 4 × 50 ms of the last: {b:?}");
    h.run_for(Duration::from_millis(60));
    let b = commands(&h.take(), 12);
    assert!(warms(&b), "planned once the budget allows: {b:?}");
}

#[test]
fn a_look_held_back_by_the_budget_is_woken_for_when_the_budget_allows_not_before() {
    let mut h = Harness::new();
    h.instance.pacing = super::leader::Pacing::new(0, true);
    h.register(1, 11, "a");
    h.advance(Duration::from_millis(400));
    // Longer than the leader's reconcile interval and its arrivals' settling.
    h.input(Input::PlanningTook { took: Duration::from_secs(2) });
    let budget = Duration::from_secs(2) * crate::coordinator::handoff_backend::leader::PLAN_PACE;
    h.register(2, 12, "b");
    // The leader's own time to look comes first and finds the look held back; woken for
    // it again unchanged, the instance would say no timer at all and never plan.
    h.run_for(budget - Duration::from_millis(100));
    assert!(!warms(&commands(&h.take(), 12)), "no plan before the budget allows");
    h.run_for(Duration::from_millis(200));
    assert!(warms(&commands(&h.take(), 12)), "planned once the budget allows");
}

#[test]
fn with_measured_planning_time_the_leader_groups_plan_in_turn() {
    // Two topics of two different groups, both led here.
    let groups: Vec<LeaderGroup> = LeaderGroup::all(2).collect();
    let pick = |g: &LeaderGroup| {
        ["t", "u", "v", "w", "x", "y"].into_iter().find(|t| g.plans(t)).expect("a topic of each group")
    };
    let (first, second) = (pick(&groups[0]), pick(&groups[1]));
    let mut h = super::test_harness::Harness::configured(1, Default::default(), None, |config| {
        config.leader_groups = 2;
        config.topic_partitions = [(first.to_string(), 2), (second.to_string(), 2)].into_iter().collect();
    });
    h.instance.pacing = super::leader::Pacing::new(0, true);
    for (call, (topic, consumer)) in [(first, "a"), (second, "b")].into_iter().enumerate() {
        let call = call as u64 + 1;
        let body = Call::Register {
            stream: 10 + call,
            consumer: consumer.into(),
            topic: topic.into(),
            incarnation: 0,
        };
        h.input(Input::Call { call, body });
    }
    let mut planned = Vec::new();
    for _ in 0..50 {
        h.advance(Duration::from_millis(20));
        planned.extend(observed(&h.take()).into_iter().filter_map(|o| match o {
            Observation::Planned { partitions } => Some(partitions),
            _ => None,
        }));
    }
    // Each step that planned planned one group's topic: the other waited for the measure.
    assert!(planned.len() >= 2, "both groups planned: {planned:?}");
    assert!(planned.iter().all(|p| *p == 2), "one group's topic per planning step: {planned:?}");
}
