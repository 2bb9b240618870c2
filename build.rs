//! Generates the gRPC code of the Open Inference Protocol (`proto/grpc_predict_v2.proto`): the tonic server and
//! client of `inference.GRPCInferenceService` and the file descriptor set that server reflection serves.
//!
//! `protoc` comes from the `protoc-bin-vendored` crate unless `PROTOC` names one, so a fresh machine needs nothing
//! installed to build.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/grpc_predict_v2.proto";
    println!("cargo:rerun-if-changed={proto}");
    println!("cargo:rerun-if-env-changed=PROTOC");

    let protoc = match std::env::var_os("PROTOC") {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => protoc_bin_vendored::protoc_bin_path()?,
    };
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Tensor bytes stay `Bytes` (no copy into a Vec<u8> per tensor).
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .bytes(".inference.ModelInferResponse.raw_output_contents")
        .file_descriptor_set_path(out_dir.join("inference_descriptor.bin"))
        .compile_with_config(config, &[proto], &["proto"])?;
    Ok(())
}
