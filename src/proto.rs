//! The generated wire contract (`proto/kafka_assigner/v1/service.proto`).
#![allow(missing_docs, clippy::all)]

/// `kafka_assigner.v1`: messages, client and server.
pub mod v1 {
    tonic::include_proto!("kafka_assigner.v1");
}

/// Encoded file descriptor set, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("kafka_assigner_descriptor");
