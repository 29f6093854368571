//! Capability `events` (ABI 1.1): subscribe to event classes the application publishes, and
//! read the events the host delivers to your event command.
//!
//! ```no_run
//! use wasihost_guest::{events, Error, Value};
//!
//! // In any command: start receiving "orders.created" (and, with a pattern, "orders.<...>").
//! events::subscribe("orders.created")?;
//! events::subscribe("orders.*")?;
//!
//! // The command the manifest's [events] table names receives each event as its input.
//! fn on_event(input: Value) -> Result<Value, Error> {
//!     let event = events::Event::from_input(&input)?;
//!     if event.dropped + event.missed > 0 { /* this consumer fell behind */ }
//!     let _ = (event.class, event.payload, event.key);
//!     Ok(Value::Null)
//! }
//! # Ok::<(), Error>(())
//! ```
//!
//! A class is `[a-z][a-z0-9_.-]*` of at most 128 bytes; a pattern `P.*` names every class
//! beginning with `P.`. Subscribing to a class the manifest's `[events] classes` (narrowed by
//! the operator's grant) does not cover fails with `DENIED`; a malformed class with
//! `INVALID_ARGUMENT`; more than 32 subscriptions with `QUOTA_EXCEEDED`. Subscriptions last
//! as long as the extension (across instance restarts). The guest declares `abi: "1.1"` in
//! [`guest!`](crate::guest!) and `abi = "1.1"` in its manifest.

use crate::abi::{Error, Result, EVENTS_SUBSCRIBE, EVENTS_UNSUBSCRIBE};
use crate::cbor::Value;
use crate::host;

/// Longest event class or pattern, in bytes.
pub const MAX_CLASS_BYTES: usize = 128;

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "wasihost_v1")]
extern "C" {
    /// Raw import `wasihost_v1.events_subscribe`: request text (a class or `P.*`), response
    /// `null`.
    ///
    /// # Safety
    /// Both ranges must lie in linear memory and must not overlap, or the host traps the
    /// guest with class `protocol`.
    #[link_name = "events_subscribe"]
    pub fn raw_events_subscribe(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;

    /// Raw import `wasihost_v1.events_unsubscribe`: request text, response bool.
    ///
    /// # Safety
    /// As for [`raw_events_subscribe`].
    #[link_name = "events_unsubscribe"]
    pub fn raw_events_unsubscribe(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;
}

/// Stand-in for the raw import off wasm (native unit tests): always `-UNSUPPORTED`.
///
/// # Safety
/// Always safe; `unsafe` only to match the wasm declaration.
#[cfg(not(target_arch = "wasm32"))]
pub unsafe extern "C" fn raw_events_subscribe(_req_ptr: i32, _req_len: i32, _resp_ptr: i32, _resp_cap: i32) -> i32 {
    -(crate::Status::UNSUPPORTED.code() as i32)
}

/// Stand-in for the raw import off wasm (native unit tests): always `-UNSUPPORTED`.
///
/// # Safety
/// Always safe; `unsafe` only to match the wasm declaration.
#[cfg(not(target_arch = "wasm32"))]
pub unsafe extern "C" fn raw_events_unsubscribe(_req_ptr: i32, _req_len: i32, _resp_ptr: i32, _resp_cap: i32) -> i32 {
    -(crate::Status::UNSUPPORTED.code() as i32)
}

fn class_request(class: &str) -> Vec<u8> {
    let mut request = Vec::with_capacity(class.len() + 2);
    host::push_text(&mut request, class);
    request
}

/// Subscribes to `class` (an event class, or a pattern `P.*`). Subscribing twice is a no-op.
pub fn subscribe(class: &str) -> Result<()> {
    let request = class_request(class);
    host::call(&EVENTS_SUBSCRIBE, &request, EVENTS_SUBSCRIBE.max_response_bytes, |a, b, c, d| unsafe {
        raw_events_subscribe(a, b, c, d)
    })?;
    Ok(())
}

/// Unsubscribes from `class` (exactly as subscribed); its queued events are dropped. Returns
/// whether a subscription was removed.
pub fn unsubscribe(class: &str) -> Result<bool> {
    let request = class_request(class);
    let response = host::call(&EVENTS_UNSUBSCRIBE, &request, EVENTS_UNSUBSCRIBE.max_response_bytes, |a, b, c, d| unsafe {
        raw_events_unsubscribe(a, b, c, d)
    })?;
    match host::decode(&EVENTS_UNSUBSCRIBE, &response)? {
        Value::Bool(removed) => Ok(removed),
        _ => Err(host::host_protocol(&EVENTS_UNSUBSCRIBE, "did not return a bool")),
    }
}

/// One delivered event, as the host passes it to the event command.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// The event's class (`orders.created`).
    pub class: String,
    /// What the application published with it.
    pub payload: Value,
    /// The coalescing key it was published with, if any.
    pub key: Option<String>,
    /// The application marked it critical: never dropped or coalesced.
    pub critical: bool,
    /// The subscription (class or pattern) it arrived through.
    pub subscription: String,
    /// Events of this subscription dropped (queue full) since the previous delivery.
    pub dropped: u64,
    /// Events this subscription refused while paused since the previous delivery.
    pub missed: u64,
    /// Queued events replaced by a newer one of the same class and key since the previous
    /// delivery.
    pub coalesced: u64,
}

impl Event {
    /// Reads the event command's input; an input that is not a delivered event is an error of
    /// class `not_an_event` (someone called the command by hand).
    pub fn from_input(input: &Value) -> Result<Event> {
        fn bad(what: &'static str) -> Error {
            Error::new("not_an_event", what)
        }
        let text = |name: &'static str| -> Result<String> {
            match input.get(name) {
                Some(Value::Text(s)) => Ok(s.clone()),
                _ => Err(bad("missing or mistyped text field")),
            }
        };
        let count = |name: &'static str| -> Result<u64> {
            input.get(name).and_then(Value::as_u64).ok_or_else(|| bad("missing or mistyped count"))
        };
        let key = match input.get("key") {
            None | Some(Value::Null) => None,
            Some(Value::Text(s)) => Some(s.clone()),
            Some(_) => return Err(bad("mistyped key")),
        };
        Ok(Event {
            class: text("class")?,
            payload: input.get("payload").cloned().unwrap_or(Value::Null),
            key,
            critical: input.get("critical").and_then(Value::as_bool).unwrap_or(false),
            subscription: text("subscription")?,
            dropped: count("dropped")?,
            missed: count("missed")?,
            coalesced: count("coalesced")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_a_delivery() {
        let input = Value::map(vec![
            ("class", Value::from("orders.created")),
            ("payload", Value::from(7u64)),
            ("key", Value::Null),
            ("critical", Value::Bool(true)),
            ("subscription", Value::from("orders.*")),
            ("dropped", Value::from(1u64)),
            ("missed", Value::from(0u64)),
            ("coalesced", Value::from(2u64)),
        ]);
        let event = Event::from_input(&input).unwrap();
        assert_eq!(event.class, "orders.created");
        assert_eq!(event.payload, Value::Int(7));
        assert_eq!(event.key, None);
        assert!(event.critical);
        assert_eq!((event.dropped, event.missed, event.coalesced), (1, 0, 2));
        assert_eq!(Event::from_input(&Value::Null).unwrap_err().class(), "not_an_event");
    }

    #[test]
    fn off_wasm_the_imports_are_unsupported() {
        assert_eq!(subscribe("a").unwrap_err().status(), crate::Status::UNSUPPORTED);
        assert_eq!(unsubscribe("a").unwrap_err().status(), crate::Status::UNSUPPORTED);
    }
}
