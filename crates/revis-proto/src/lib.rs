//! Generated code for the revis.v1 gRPC API (`proto/revis/v1/revis.proto`).
//!
//! `bytes` fields are `bytes::Bytes`, so large texts are not copied twice.
#![allow(clippy::all, missing_docs)]

pub mod v1 {
    tonic::include_proto!("revis.v1");

    /// The encoded `FileDescriptorSet`, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("revis_v1_descriptor");
}
