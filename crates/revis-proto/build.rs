//! Generates the revis.v1 messages, clients and servers from `proto/`.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read when it runs, not baked in when it is compiled: one compiled build
    // script may serve several checkouts that share a target directory.
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let proto = root.join("revis/v1/revis.proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("revis_v1_descriptor.bin"))
        .bytes(".revis.v1")
        // Undecodable messages are INVALID_ARGUMENT, not INTERNAL.
        .codec_path("crate::codec::Codec")
        .compile_protos(&[proto], &[root])?;
    Ok(())
}
