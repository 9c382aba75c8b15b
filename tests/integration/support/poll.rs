//! Waiting for a value (not only a condition, as [`super::wait_until`]) with a deadline.

use std::{future::Future, time::Duration};

/// Polls `f` every [`super::POLL_INTERVAL`] until it gives a value; panics with `what`
/// after `deadline`.
pub async fn poll<T>(deadline: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    poll_async(deadline, what, || std::future::ready(f())).await
}

/// [`poll`] with an async `f`.
pub async fn poll_async<T, F, Fut>(deadline: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let give_up = tokio::time::Instant::now() + deadline;
    loop {
        if let Some(value) = f().await {
            return value;
        }
        if tokio::time::Instant::now() >= give_up {
            panic!("timed out after {deadline:?} waiting until {what}");
        }
        tokio::time::sleep(super::POLL_INTERVAL).await;
    }
}
