//! The protobuf codec of the generated service (set in `build.rs` with `codec_path`):
//! tonic's own, except that a body that is not a valid message of its RPC is
//! `INVALID_ARGUMENT` (on the server: the client sent bad input) instead of tonic's
//! `INTERNAL`. It lives here, beside the generated code that names it, so the server and
//! the client share it.

use std::marker::PhantomData;

use prost::Message;
use tonic::{
    Code, Status,
    codec::{BufferSettings, Codec, DecodeBuf, Decoder},
};
use tonic_prost::{ProstCodec, ProstDecoder};

/// [`ProstCodec`] with undecodable messages reported as `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct StrictCodec<T, U> {
    _types: PhantomData<(T, U)>,
}

impl<T, U> Default for StrictCodec<T, U> {
    fn default() -> Self {
        Self { _types: PhantomData }
    }
}

impl<T, U> Codec for StrictCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = tonic_prost::ProstEncoder<T>;
    type Decoder = StrictDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictDecoder { inner: ProstCodec::<T, U>::default().decoder() }
    }
}

/// Decodes like tonic's prost decoder; see [`StrictCodec`].
#[derive(Debug)]
pub struct StrictDecoder<U> {
    inner: ProstDecoder<U>,
}

impl<U: Message + Default + Send + 'static> Decoder for StrictDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.inner.decode(buf).map_err(|status| match status.code() {
            Code::Internal => Status::invalid_argument(format!(
                "the request body is not a valid message of this RPC ({})",
                status.message()
            )),
            _ => status,
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.inner.buffer_settings()
    }
}
