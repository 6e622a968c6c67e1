//! The protobuf codec of every revis.v1 service: prost's, except that a
//! message that does not decode is INVALID_ARGUMENT naming what was wrong
//! (tonic's own codec calls it INTERNAL, which reads as a server bug).

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

/// prost's decoder; a decode failure becomes INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct ClearDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for ClearDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|s| match s.code() {
            Code::Internal => Status::invalid_argument(format!("not a valid {} message: {}", short_name::<U>(), s.message())),
            _ => s,
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
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
}
