//! `Register` for the fleet backend: the member record.
//!
//! The shared registration ([`crate::coordinator::shared::register`]) binds the member
//! record, and every lease the consumer holds, to the instance lease; a reconnect moves
//! them to its new registration in one transaction (`registrar.rs` names the leases as the
//! records bound to the registration). Beside each stream runs its claim step
//! (`claim.rs`).

use super::Fleet;
use super::records::MemberRecord;
use crate::coordinator::shared::records::RECORD_VERSION;
use crate::store::SessionId;

/// The member record of `consumer`'s registration with id `registration` on this
/// instance, with what the Kubernetes view knows of it at this moment (from memory: never
/// waits on the API). Unlike the leader, claiming reads only the stored info, so that
/// every instance computes the same quotas.
pub(super) fn member_record(
    inner: &Fleet,
    consumer: &str,
    registration: SessionId,
    incarnation: u64,
) -> MemberRecord {
    let info = inner.config.view.as_ref().and_then(|view| view.info(consumer)).unwrap_or_default();
    member_record_of(inner.core.instance_id(), registration, incarnation, info)
}

/// The member record of the registration `registration` held by `instance`, sent by the
/// client process `incarnation`, with what placement knows of the consumer (pure).
pub(super) fn member_record_of(
    instance: &str,
    registration: SessionId,
    incarnation: u64,
    info: crate::assignment::ConsumerInfo,
) -> MemberRecord {
    MemberRecord {
        v: RECORD_VERSION,
        session: registration.0,
        instance: instance.to_string(),
        leaving: false,
        info,
        incarnation,
    }
}
