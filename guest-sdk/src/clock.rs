//! Capability `clock`: read the wall clock or the monotonic clock, in nanoseconds.
//!
//! ```no_run
//! let start = wasihost_guest::clock::now_monotonic()?;
//! let wall = wasihost_guest::clock::now_realtime()?; // ns since the Unix epoch
//! # Ok::<(), wasihost_guest::Error>(())
//! ```
//!
//! The host coarsens both clocks to the resolution its policy grants, so two reads may be
//! equal. Without the `clock` grant the module is refused at admission.

use crate::abi::{Result, CLOCK_NOW};
use crate::cbor::Value;
use crate::host;

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "wasihost_v1")]
extern "C" {
    /// Raw import `wasihost_v1.clock_now`: request text `"realtime"` or `"monotonic"`,
    /// response uint nanoseconds.
    ///
    /// # Safety
    /// Both ranges must lie in linear memory and must not overlap, or the host traps the
    /// guest with class `protocol`.
    #[link_name = "clock_now"]
    pub fn raw_clock_now(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;
}

/// Stand-in for the raw import off wasm (native unit tests): always `-UNSUPPORTED`.
///
/// # Safety
/// Always safe; `unsafe` only to match the wasm declaration.
#[cfg(not(target_arch = "wasm32"))]
pub unsafe extern "C" fn raw_clock_now(_req_ptr: i32, _req_len: i32, _resp_ptr: i32, _resp_cap: i32) -> i32 {
    -(crate::Status::UNSUPPORTED.code() as i32)
}

/// Which clock to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    /// Nanoseconds since the Unix epoch.
    Realtime,
    /// Nanoseconds since an arbitrary start; never goes backwards.
    Monotonic,
}

/// Reads `clock`.
pub fn now(clock: Clock) -> Result<u64> {
    let request: &[u8] = match clock {
        Clock::Realtime => b"\x68realtime",
        Clock::Monotonic => b"\x69monotonic",
    };
    let response = host::call(&CLOCK_NOW, request, CLOCK_NOW.max_response_bytes, |a, b, c, d| unsafe {
        raw_clock_now(a, b, c, d)
    })?;
    match host::decode(&CLOCK_NOW, &response)? {
        Value::Int(ns) if ns >= 0 && ns <= u64::MAX as i128 => Ok(ns as u64),
        _ => Err(host::host_protocol(&CLOCK_NOW, "did not return a uint")),
    }
}

/// Nanoseconds since the Unix epoch.
pub fn now_realtime() -> Result<u64> {
    now(Clock::Realtime)
}

/// Nanoseconds of the monotonic clock.
pub fn now_monotonic() -> Result<u64> {
    now(Clock::Monotonic)
}
