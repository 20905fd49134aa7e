//! Compiles `proto/` into Rust (tonic + prost) with protox: no system `protoc` is needed.
//! Also writes the encoded descriptor set, which the agent serves through gRPC reflection.
#![allow(clippy::disallowed_macros, reason = "a build script talks to cargo through stdout")]

use std::path::PathBuf;

use protox::prost::Message;

const PROTO_ROOT: &str = "proto";
const PROTOS: &[&str] = &["proto/spear/v1/agent.proto"];
/// File name in OUT_DIR; `src/agent/doors/grpc.rs` includes it with `include_bytes!`.
const DESCRIPTOR_SET: &str = "spear_descriptor.bin";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let fds = protox::compile(PROTOS, [PROTO_ROOT])?;
    std::fs::write(out_dir.join(DESCRIPTOR_SET), fds.encode_to_vec())?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(fds)?;
    Ok(())
}
