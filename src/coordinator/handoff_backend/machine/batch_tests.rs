//! Batching in the machine (`machine/batching.rs`): what is decided while batches are in
//! flight is written in one transaction, and a batch that lost a compare leaves each of its
//! writers to decide again alone.

use super::test_harness::{Harness, reply};
use crate::coordinator::machine::io::{Call, Effect, Input, Replied, StoreReply, StoreRequest};
use crate::coordinator::shared::batch::BATCHES_IN_FLIGHT;
use crate::store::{Op, Txn};

/// The transactions among `effects`, with their request ids.
fn txns(effects: &[Effect]) -> Vec<(u64, Txn)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Store { request, op: StoreRequest::Txn(txn) } => Some((*request, txn.clone())),
            _ => None,
        })
        .collect()
}

/// `Register`s of `names` stepped in, one call each, with no store answer in between.
fn registers(h: &mut Harness, names: &[&str], first_call: u64) -> Vec<Effect> {
    let mut effects = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let call = first_call + i as u64;
        let body = Call::Register {
            stream: 100 + call,
            consumer: (*name).into(),
            topic: "t".into(),
            incarnation: 0,
        };
        effects.extend(h.instance.step(h.now, Input::Call { call, body }));
    }
    effects
}

/// How many consumer records `txn` writes.
fn records_written(h: &Harness, txn: &Txn) -> usize {
    let prefix = h.keys.consumer("t", "");
    txn.ops.iter().filter(|op| matches!(op, Op::Put { key, .. } if key.starts_with(&prefix))).count()
}

#[test]
fn registrations_decided_while_batches_are_in_flight_are_written_in_one_transaction() {
    let mut h = Harness::new();
    h.register(1, 11, "a"); // the topic's record is stored and followed
    let names = ["b", "c", "d", "e", "f", "g", "h", "i", "j", "k"];
    let sent = txns(&registers(&mut h, &names, 2));
    assert_eq!(sent.len(), BATCHES_IN_FLIGHT, "one transaction each while fewer are in flight: {sent:?}");
    assert!(sent.iter().all(|(_, txn)| records_written(&h, txn) == 1));
    // The first answer frees a place: everything decided meanwhile goes in one batch.
    let (request, txn) = sent[0].clone();
    let (outcome, _) = h.store.txn(&txn);
    let after = h.instance.step(h.now, Input::StoreAnswer { request, answer: Ok(StoreReply::Txn(outcome)) });
    let next = txns(&after);
    assert_eq!(next.len(), 1, "{next:?}");
    assert_eq!(records_written(&h, &next[0].1), names.len() - BATCHES_IN_FLIGHT);
    // Every registration is answered once its batch is written.
    let mut effects = after;
    for (request, txn) in sent[1..].iter().chain(&next) {
        let (outcome, _) = h.store.txn(txn);
        let answer = Ok(StoreReply::Txn(outcome));
        effects.extend(h.instance.step(h.now, Input::StoreAnswer { request: *request, answer }));
    }
    for call in 2..2 + names.len() as u64 {
        assert!(matches!(reply(&effects, call), Some(Ok(Replied::Registered))), "call {call}: {effects:?}");
    }
}

#[test]
fn a_batch_that_lost_a_compare_leaves_each_registration_to_decide_again_alone() {
    let mut h = Harness::new();
    h.register(1, 11, "a");
    let names = ["b", "c", "d", "e", "f", "g"];
    let sent = txns(&registers(&mut h, &names, 2));
    // The four alone are answered: the two decided meanwhile go in one batch, and one of
    // them ("f") is registered elsewhere before it is written.
    let mut effects = Vec::new();
    for (request, txn) in &sent {
        let (outcome, _) = h.store.txn(txn);
        let answer = Ok(StoreReply::Txn(outcome));
        effects.extend(h.instance.step(h.now, Input::StoreAnswer { request: *request, answer }));
    }
    let batch = txns(&effects);
    assert_eq!(batch.len(), 1, "{batch:?}");
    assert_eq!(records_written(&h, &batch[0].1), 2);
    let elsewhere = h.keys.consumer("t", "f");
    let _ = h.store.txn(&Txn::new().then(Op::put(&elsewhere, "by another instance")));
    // The batch loses as a whole; each writer reads its record and writes alone, and both
    // are registered: the one registered elsewhere replaces that registration.
    let lost = h.store.txn(&batch[0].1).0;
    assert!(!lost.succeeded);
    let tried = h.store.txns.len();
    h.input(Input::StoreAnswer { request: batch[0].0, answer: Ok(StoreReply::Txn(lost)) });
    let effects = h.take();
    for call in [6, 7] {
        assert!(matches!(reply(&effects, call), Some(Ok(Replied::Registered))), "call {call}: {effects:?}");
    }
    for name in ["f", "g"] {
        let key = h.keys.consumer("t", name);
        let alone = h.store.txns[tried..].iter().filter(|(txn, ok)| {
            *ok && records_written(&h, txn) == 1 && txn.ops.iter().any(|op| op.key() == key)
        });
        assert_eq!(alone.count(), 1, "{name} written alone after the batch lost: {:?}", h.store.txns);
    }
}

#[test]
fn the_registrations_of_a_new_topic_write_its_record_once_then_share_a_batch() {
    let mut h = Harness::new();
    let names = ["a", "b", "c", "d", "e"];
    let sent = txns(&registers(&mut h, &names, 1));
    let topic = h.keys.topic("t");
    assert_eq!(sent.len(), 1, "one write of the topic's record for all of them: {sent:?}");
    assert!(sent[0].1.ops.iter().all(|op| op.key() == topic), "{sent:?}");
    let (request, txn) = sent[0].clone();
    let (outcome, _) = h.store.txn(&txn);
    let after = h.instance.step(h.now, Input::StoreAnswer { request, answer: Ok(StoreReply::Txn(outcome)) });
    let next = txns(&after);
    assert_eq!(next.len(), 1, "{next:?}");
    assert_eq!(records_written(&h, &next[0].1), names.len(), "the waiters join the leader's batch");
}
