//! Commands onto the wire: one place that builds `AssignmentCommand`s for every backend.

use crate::handoff::Command;
use crate::proto::v1::{
    AssignmentCommand, AssignmentUpdate, ReleasePartition, TopicPartition, WarmPartition, assignment_command,
};

fn tp(topic: &str, partition: u32) -> TopicPartition {
    TopicPartition { topic: topic.to_string(), partition }
}

/// Converts a pure command for a consumer of `topic` into the wire message.
pub(crate) fn to_wire(topic: &str, command: Command) -> AssignmentCommand {
    let command = match command {
        Command::Assignment { assigned, unassigned } => {
            assignment_command::Command::Assignment(AssignmentUpdate {
                assigned: assigned.into_iter().map(|p| tp(topic, p)).collect(),
                unassigned: unassigned.into_iter().map(|p| tp(topic, p)).collect(),
            })
        }
        Command::Warm { partition, current_owner } => assignment_command::Command::Warm(WarmPartition {
            partition: Some(tp(topic, partition)),
            current_owner,
        }),
        Command::Release { partition, new_owner } => assignment_command::Command::Release(ReleasePartition {
            partition: Some(tp(topic, partition)),
            new_owner,
        }),
    };
    AssignmentCommand { command: Some(command) }
}

/// An `AssignmentUpdate` for `topic` (the only command the fleet and static backends send).
pub(crate) fn update(
    topic: &str,
    assigned: impl IntoIterator<Item = u32>,
    unassigned: impl IntoIterator<Item = u32>,
) -> AssignmentCommand {
    let assigned = assigned.into_iter().collect();
    let unassigned = unassigned.into_iter().collect();
    to_wire(topic, Command::Assignment { assigned, unassigned })
}
