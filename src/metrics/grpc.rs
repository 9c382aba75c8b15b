//! gRPC call metrics: calls by method and status code, and why `Register` streams end.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use futures::{Stream, StreamExt};
use tonic::{Code, Status};

use crate::coordinator::{CoordinatorError, ErrorCode};

use super::{
    Metrics,
    labels::{GrpcLabels, ReasonLabels},
};

/// The canonical upper-case name of a gRPC status code (`OK`, `NOT_FOUND`, ...).
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Why a stream ended with `error`: the coordinators say why they end a stream
/// ([`StreamEnd`]); no message text is read.
pub fn end_reason(error: &CoordinatorError) -> &'static str {
    match error {
        CoordinatorError::StreamEnded(why, _) => why.as_str(),
        other => match other.code() {
            ErrorCode::Aborted => "replaced",
            ErrorCode::Unavailable => "unavailable",
            _ => "error",
        },
    }
}

impl Metrics {
    /// Counts one finished call of `method` with the outcome `result`.
    pub fn observe_grpc<T>(&self, method: &'static str, result: &Result<T, Status>) {
        let code = match result {
            Ok(_) => Code::Ok,
            Err(status) => status.code(),
        };
        self.grpc_calls.get_or_create(&GrpcLabels { method, code: code_name(code) }).inc();
    }

    /// Counts one ended `Register` stream.
    pub fn observe_stream_end(&self, reason: &'static str) {
        self.streams_ended.get_or_create(&ReasonLabels { reason }).inc();
    }
}

/// A `Register` response stream (the coordinator's, before its errors become statuses)
/// that records why it ended: a clean end (`drained`), an error item ([`end_reason`]), or
/// the client going away (`client_gone`: dropped before either).
pub struct MeteredStream<S> {
    inner: S,
    metrics: Arc<Metrics>,
    ended: bool,
}

impl<S> MeteredStream<S> {
    /// Meters `inner` into `metrics`.
    pub fn new(inner: S, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics, ended: false }
    }
}

impl<S, T> Stream for MeteredStream<S>
where
    S: Stream<Item = Result<T, CoordinatorError>> + Unpin,
{
    type Item = Result<T, CoordinatorError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let item = self.inner.poll_next_unpin(cx);
        if !self.ended {
            let reason = match &item {
                Poll::Ready(None) => Some("drained"),
                Poll::Ready(Some(Err(error))) => Some(end_reason(error)),
                _ => None,
            };
            if let Some(reason) = reason {
                self.ended = true;
                self.metrics.observe_stream_end(reason);
            }
        }
        item
    }
}

impl<S> Drop for MeteredStream<S> {
    fn drop(&mut self) {
        if !self.ended {
            self.metrics.observe_stream_end("client_gone");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::StreamEnd;

    #[test]
    fn stream_ends_are_told_apart_by_kind_not_by_message() {
        let ended = |why, text: &str| end_reason(&CoordinatorError::StreamEnded(why, text.into()));
        // The fenced end's message mentions neither "expired" nor "shutting down".
        assert_eq!(ended(StreamEnd::Fenced, "lost contact with its store"), "fenced");
        assert_eq!(ended(StreamEnd::Shutdown, "x"), "shutdown");
        assert_eq!(ended(StreamEnd::Expired, "x"), "expired");
        assert_eq!(ended(StreamEnd::Crashed, "x"), "crashed");
        // A message alone decides nothing.
        assert_eq!(end_reason(&CoordinatorError::Unavailable("session expired".into())), "unavailable");
        assert_eq!(end_reason(&CoordinatorError::Aborted("replaced".into())), "replaced");
        assert_eq!(end_reason(&CoordinatorError::ResourceExhausted("slow".into())), "error");
    }
}
