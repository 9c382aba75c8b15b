//! Compiles the wire contract into Rust: the repository's
//! `proto/kafka_assigner/v1/service.proto` and its companion `epochs.proto` (same package),
//! read in place (one copy of the contract, and of the generated code: the server crate
//! uses this crate's).
//!
//! No system `protoc` is needed: an explicit `PROTOC` wins (the workspace's
//! `.cargo/config.toml` points it at `tools/protoc`, which finds the same binary for
//! etcd-client's build script), otherwise the binary shipped by `protoc-bin-vendored`.

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = match env::var_os("PROTOC") {
        Some(path) => PathBuf::from(path),
        None => protoc_bin_vendored::protoc_bin_path()?,
    };
    let proto_root = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let service = proto_root.join("kafka_assigner/v1/service.proto");
    let epochs = proto_root.join("kafka_assigner/v1/epochs.proto");
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Undecodable messages are INVALID_ARGUMENT, not tonic's INTERNAL (src/proto/codec.rs).
        .codec_path("crate::proto::codec::StrictCodec")
        .file_descriptor_set_path(out_dir.join("kafka_assigner_descriptor.bin"))
        .compile_with_config(config, &[&service, &epochs], &[&proto_root])?;
    println!("cargo:rerun-if-changed={}", proto_root.display());
    println!("cargo:rerun-if-env-changed=PROTOC");
    Ok(())
}
