//! The protobuf codec of every revis.v1 service: prost's, except that a
//! request that does not decode is INVALID_ARGUMENT naming what was wrong
//! (tonic's own codec calls it INTERNAL, which reads as a server bug).
//!
//! The generated clients use this codec too. A reply that does not decode
//! stays INTERNAL: that is the other side's fault (a version skew, a broken
//! node), and callers such as the dispatcher may try elsewhere, which they
//! never do for INVALID_ARGUMENT.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, DecodeBuf, Decoder};
use tonic::{Code, Status};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// prost's codec with a clear status for undecodable messages.
#[derive(Debug, Clone)]
pub struct Codec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec(PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ClearDecoder<U>;

    fn encoder(&mut self) -> ProstEncoder<T> {
        ProstCodec::<T, U>::default().encoder()
    }

    fn decoder(&mut self) -> ClearDecoder<U> {
        ClearDecoder(ProstCodec::<T, U>::default().decoder())
    }
}

/// prost's decoder; a request that fails to decode is INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct ClearDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for ClearDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|s| clear(s, &short_name::<U>()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

/// A decode failure of a `name` message: INVALID_ARGUMENT for a request
/// (servers decode requests; clients decode replies and events, whose
/// failures stay as they are).
fn clear(s: Status, name: &str) -> Status {
    match s.code() {
        Code::Internal if name.ends_with("Request") => Status::invalid_argument(format!("not a valid {name} message: {}", s.message())),
        _ => s,
    }
}

/// `revis_proto::v1::GenerateRequest` → `revis.v1.GenerateRequest`.
fn short_name<U>() -> String {
    let full = std::any::type_name::<U>();
    format!("revis.v1.{}", full.rsplit("::").next().unwrap_or(full))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1 as pb;

    #[test]
    fn names_are_the_protobuf_names() {
        assert_eq!(short_name::<pb::GenerateRequest>(), "revis.v1.GenerateRequest");
    }

    #[test]
    fn a_broken_request_is_invalid_argument_and_a_broken_reply_stays_internal() {
        let broken = || Status::internal("failed to decode Protobuf message: invalid wire type");
        let s = clear(broken(), &short_name::<pb::GenerateRequest>());
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        assert_eq!(s.message(), "not a valid revis.v1.GenerateRequest message: failed to decode Protobuf message: invalid wire type");
        for reply in [short_name::<pb::GenerateEvent>(), short_name::<pb::StatusResponse>(), short_name::<pb::PairingEvent>()] {
            assert_eq!(clear(broken(), &reply).code(), Code::Internal, "{reply}");
        }
        let too_big = Status::out_of_range("message too large");
        assert_eq!(clear(too_big, "revis.v1.GenerateRequest").code(), Code::OutOfRange);
    }
}
