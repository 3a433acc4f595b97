//! Server-sent event streams: one JSON-RPC message per event, keep-alive comments between.

use std::convert::Infallible;
use std::time::Duration;

use axum::http::HeaderValue;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};

use crate::AppState;

/// One message as one event.
pub(crate) fn event(message: Vec<u8>) -> Result<Event, Infallible> {
    // serde_json writes UTF-8 without raw newlines, so one message is one `data:` line.
    Ok(Event::default().data(String::from_utf8(message).unwrap_or_default()))
}

/// The response that streams `events`, with a keep-alive comment whenever the stream is
/// quiet for the configured interval, and unbuffered by proxies that honour
/// `X-Accel-Buffering`.
pub(crate) fn sse(
    state: &AppState,
    events: impl futures_util::Stream<Item = Result<Event, Infallible>> + Send + 'static,
) -> Response {
    // From a second (a shorter interval would send comments without pause) to a day (the
    // keep-alive's timer adds the interval to the clock after every event, and one near
    // `Duration::MAX` would overflow it; a day is as good as never here).
    let interval = state
        .config
        .keep_alive
        .clamp(Duration::from_secs(1), Duration::from_secs(86_400));
    let mut res = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(interval).text(""))
        .into_response();
    res.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    res
}
