//! Compiles the wire contract (`proto/kafka_assigner/v1/service.proto`) into Rust.
//!
//! No system `protoc` is needed: an explicit `PROTOC` wins, otherwise the binary shipped
//! by the `protoc-bin-vendored` crate is used. (`.cargo/config.toml` points `PROTOC` at
//! `tools/protoc`, which finds the same binary for etcd-client's build script.)

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = match env::var_os("PROTOC") {
        Some(path) => PathBuf::from(path),
        None => protoc_bin_vendored::protoc_bin_path()?,
    };
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Undecodable requests are INVALID_ARGUMENT, not tonic's INTERNAL (src/server/codec.rs).
        .codec_path("crate::server::codec::StrictCodec")
        .file_descriptor_set_path(out_dir.join("kafka_assigner_descriptor.bin"))
        .compile_with_config(config, &["proto/kafka_assigner/v1/service.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-env-changed=PROTOC");
    Ok(())
}
