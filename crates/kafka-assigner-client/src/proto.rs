//! The generated wire contract (`proto/kafka_assigner/v1/service.proto`): messages, the
//! client, and the server trait the assigner implements.

pub mod codec;

/// `kafka_assigner.v1`: messages, client and server.
#[allow(missing_docs, clippy::all)]
pub mod v1 {
    tonic::include_proto!("kafka_assigner.v1");
}

/// Encoded file descriptor set, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("kafka_assigner_descriptor");

/// Response header of `Register`: how long, in milliseconds, the server keeps a consumer's
/// session after its stream is gone (the coordinator's session TTL; absent when sessions
/// never expire). The wire contract has no field for it, so it rides in the metadata.
pub const SESSION_TTL_HEADER: &str = "x-kafka-assigner-session-ttl-ms";

/// Request header of `Register`: a number the client's process draws once at start (never
/// 0), the same on every `Register` it sends. A registration that replaces one sent with the
/// same number is the same process reconnecting; any other is a new incarnation of the
/// name, whose epochs the assigner raises so that an older process's writes are fenced
/// (docs/design.md §10). A client that sends none is always a new incarnation.
pub const INCARNATION_HEADER: &str = "x-kafka-assigner-incarnation";
