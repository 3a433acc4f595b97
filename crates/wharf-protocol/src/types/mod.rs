//! Message types of 2026-07-28, one module per area of the specification.
//!
//! Optional members are `Option` and are left out when absent, so a value read from the wire
//! and written back is the same JSON.

mod capabilities;
mod client;
mod completion;
mod content;
mod discover;
mod legacy;
mod logging;
pub mod meta;
mod mrtr;
mod notifications;
mod prompts;
mod requests;
mod resources;
mod result;
mod subscriptions;
mod tools;
mod unique;

pub use capabilities::*;
pub use client::*;
pub use completion::*;
pub use content::*;
pub use discover::*;
pub use legacy::*;
pub use logging::*;
pub use mrtr::*;
pub use notifications::*;
pub use prompts::*;
pub use requests::*;
pub use resources::*;
pub use result::*;
pub use subscriptions::*;
pub use tools::*;

/// A JSON object (`_meta`, `experimental`, schemas…).
pub type JsonObject = serde_json::Map<String, serde_json::Value>;

/// Whether an optional number is left out when written: absent, or not finite (serde_json
/// writes NaN and infinities as `null`, which no schema takes where a number goes).
pub(crate) fn no_number(value: &Option<f64>) -> bool {
    !value.is_some_and(f64::is_finite)
}

/// Whether a priority (a hint from 0 to 1) is left out when written: absent, or outside
/// its range (NaN included).
pub(crate) fn no_priority(value: &Option<f64>) -> bool {
    !value.is_some_and(|p| (0.0..=1.0).contains(&p))
}
