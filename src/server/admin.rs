//! The admin HTTP server: `/live`, `/ready`, `/metrics` (Prometheus) and `/status`
//! (consumers, partitions and handoffs as JSON, and under `placement` how each topic is
//! placed: loads, shares and the shadow load plan, docs/design.md §11), and `/ui`: a live
//! page of the same document (static HTML and script, embedded in the binary, that polls
//! `/status`; it reads nothing `/status` does not give, so the admin port's rules for
//! `/status` are its rules too).

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::State,
    http::StatusCode,
    response::{Html, IntoResponse},
    routing::get,
};

use crate::coordinator::ConsumerGroupCoordinator;
use crate::metrics::Metrics;

/// The `/ui` page: no build step, the file is the page.
const UI_PAGE: &str = include_str!("ui.html");

#[derive(Clone)]
struct AdminState {
    coordinator: Arc<dyn ConsumerGroupCoordinator>,
    metrics: Arc<Metrics>,
}

/// The admin routes.
pub fn router(coordinator: Arc<dyn ConsumerGroupCoordinator>, metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/live", get(|| async { "ok\n" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics_text))
        .route("/status", get(status))
        .route("/ui", get(|| async { Html(UI_PAGE) }))
        .with_state(AdminState { coordinator, metrics })
}

async fn ready(State(state): State<AdminState>) -> impl IntoResponse {
    if *state.coordinator.readiness().borrow() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn metrics_text(State(state): State<AdminState>) -> impl IntoResponse {
    (
        [("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")],
        state
            .metrics
            .render_with_placement(&state.coordinator.status().await, &state.coordinator.placement().await),
    )
}

async fn status(State(state): State<AdminState>) -> impl IntoResponse {
    let view = state.coordinator.status().await;
    Json(crate::status::StatusDocument { view, placement: state.coordinator.placement().await })
}
