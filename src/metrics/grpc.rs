//! gRPC call metrics: calls by method and status code, and why `Register` streams end.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use futures::{Stream, StreamExt};
use tonic::{Code, Status};

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

/// A `Register` response stream (before its errors become statuses) that records why it
/// ended: a clean end (`drained`), an error item (the label `reason` gives it), or the
/// client going away (`client_gone`: dropped before either).
pub struct MeteredStream<S, E> {
    inner: S,
    metrics: Arc<Metrics>,
    reason: fn(&E) -> &'static str,
    ended: bool,
}

impl<S, E> MeteredStream<S, E> {
    /// Meters `inner` into `metrics`; `reason` names why an error item ended it.
    pub fn new(inner: S, metrics: Arc<Metrics>, reason: fn(&E) -> &'static str) -> Self {
        Self { inner, metrics, reason, ended: false }
    }
}

impl<S, T, E> Stream for MeteredStream<S, E>
where
    S: Stream<Item = Result<T, E>> + Unpin,
{
    type Item = Result<T, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let item = self.inner.poll_next_unpin(cx);
        if !self.ended {
            let reason = match &item {
                Poll::Ready(None) => Some("drained"),
                Poll::Ready(Some(Err(error))) => Some((self.reason)(error)),
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

impl<S, E> Drop for MeteredStream<S, E> {
    fn drop(&mut self) {
        if !self.ended {
            self.metrics.observe_stream_end("client_gone");
        }
    }
}
