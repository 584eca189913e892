//! Compiles the protos with protox (pure Rust, no protoc) and keeps the encoded descriptor
//! set for gRPC server reflection.

use std::path::PathBuf;

use prost::Message;

const PROTOS: [&str; 2] = ["specd/v1/generation.proto", "specd/v1/nodes.proto"];
/// Compiled for the transport benchmark but kept out of the reflection descriptors.
const BENCH_PROTO: &str = "specd/bench/echo.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(PROTOS, ["."])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("specd_descriptor.bin"), descriptors.encode_to_vec())?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    println!("cargo:rerun-if-changed={BENCH_PROTO}");
    tonic_prost_build::configure().compile_fds(protox::compile([BENCH_PROTO], ["."])?)?;
    Ok(())
}
