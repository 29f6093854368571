//! Guest SDK for ABI 2.0: build a guest for major 2.
//!
//! ABI 2.0 is ABI 1.1 under the import module `wasihost_v2` with one breaking change: `log`
//! takes typed arguments, `log(level: i32, msg_ptr: i32, msg_len: i32) -> i32`, and the
//! message crosses as raw UTF-8 instead of a CBOR `[level, message]` array. Every other entry
//! keeps its v1 request, response, limits and price. A v2 guest must import nothing from
//! `wasihost_v1` (the host refuses a module whose imports disagree with its marker's major),
//! so it depends on this crate, not on `wasihost-guest`'s wrappers:
//!
//! ```ignore
//! use wasihost_guest_v2::{self as sdk, Value};
//!
//! sdk::guest! {
//!     id: "org.example.hello2",
//!     version: "0.1.0",
//!     abi: "2.0",
//!     features: ["log", "clock"],
//!     commands: { "hello" => hello }
//! }
//!
//! fn hello(_: Value) -> sdk::Result<Value> {
//!     sdk::log::info("starting");                  // wasihost_v2.log, no CBOR
//!     let now = sdk::clock::now_monotonic()?;     // wasihost_v2.clock_now (carried over)
//!     Ok(Value::from(now))
//! }
//! ```
//!
//! Migrating a v1 guest: depend on `wasihost-guest-v2` instead of `wasihost-guest`, invoke
//! `wasihost_guest_v2::guest!` with `abi: "2.0",`, set the manifest's `abi = "2.0"`, and call
//! the host through this crate: [`log`], [`clock`], [`random`], and [`call`] for any other
//! entry (by its v1 descriptor in [`abi`]; the carried entries keep their v1 shapes).
//!
//! Why a crate of its own, not a cargo feature or a module of `wasihost-guest`: a feature
//! turns on for every member of a workspace (cargo unifies features), and a module would share
//! `wasihost-guest`'s runtime code, whose inlining, and so the bytes of every v1 guest, would
//! change. Here the runtime (`guest.rs`: exports, dispatch, handshake, block ownership) and the
//! call helpers (`host.rs`) are the same source files compiled a second time, so that their
//! panic hook ends a call through this crate's [`abort`] (`wasihost_v2.abort`), and a v1 guest
//! stays byte for byte what it was.

#![warn(missing_docs)]

pub use wasihost_guest::{__wasihost_abi_version, abi, cbor, import, Error, Result, Status, Value};

/// The runtime of a v2 guest: exports, dispatch, handshake and block ownership (the source of
/// `wasihost_guest::guest`, compiled in this crate). [`guest!`] expands on it. A v2 guest asks
/// what start-up granted with [`is_granted`] and [`welcome`].
#[path = "../../src/guest.rs"]
pub mod guest;

#[allow(dead_code)] // helpers of the v1 wrappers this crate does not call
#[path = "../../src/host.rs"]
mod host;

pub use guest::{is_granted, welcome, Readiness, Welcome};

use crate::abi::{HostFn, ABORT, CLOCK_NOW, RANDOM_BYTES, RANDOM_MAX_BYTES};
use crate::cbor::Value as CborValue;

/// Emits the `wasihost_abi` custom section ([`guest!`] does); a v2 guest declares `2.0`.
#[macro_export]
macro_rules! abi_marker {
    () => {
        compile_error!("a wasihost-guest-v2 guest declares abi: \"2.0\"");
    };
    ($version:literal) => {
        const _: () = $crate::check_abi_version($version);
        #[doc(hidden)]
        #[link_section = "wasihost_abi"]
        #[used]
        static __WASIHOST_ABI_MARKER: [u8; $version.len()] =
            $crate::import::marker::<{ $version.len() }>($version);
    };
}

/// Fails the build (in a `const`) unless `version` is the one this crate builds for.
#[doc(hidden)]
pub const fn check_abi_version(version: &str) {
    let (v, want) = (version.as_bytes(), ABI_VERSION.as_bytes());
    if v.len() != want.len() {
        panic!("wasihost-guest-v2: abi must be \"2.0\"");
    }
    let mut i = 0;
    while i < v.len() {
        if v[i] != want[i] {
            panic!("wasihost-guest-v2: abi must be \"2.0\"");
        }
        i += 1;
    }
}

/// The ABI version a `guest! { abi: "2.0", .. }` declares.
pub const ABI_VERSION: &str = "2.0";
/// Import module of every host function of major 2.
pub const IMPORT_MODULE: &str = "wasihost_v2";

/// Declares the raw `wasihost_v2` imports of the cbor entries carried over from v1, each with
/// the same off-wasm stand-in as the v1 ones.
macro_rules! carried_imports {
    ($($name:ident),* $(,)?) => {
        /// The raw `wasihost_v2` imports. The cbor entries keep the v1 signature
        /// `(req_ptr, req_len, resp_ptr, resp_cap) -> i32`; `log` is the native
        /// `(level, msg_ptr, msg_len) -> i32`. Off wasm they are stand-ins returning
        /// `-UNSUPPORTED`.
        pub mod raw {
            #[cfg(target_arch = "wasm32")]
            #[link(wasm_import_module = "wasihost_v2")]
            extern "C" {
                $(
                    /// Raw import (carried over from v1 unchanged).
                    ///
                    /// # Safety
                    /// Both ranges must lie in linear memory and must not overlap, or the host
                    /// traps the guest with class `protocol`.
                    pub fn $name(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;
                )*
                /// Raw import `wasihost_v2.log`: append `msg_len` bytes of UTF-8 at `msg_ptr`
                /// at `level` (0..=4). Returns 0, or `-status`.
                ///
                /// # Safety
                /// The message range must lie in linear memory, or the host traps the guest
                /// with class `protocol`.
                pub fn log(level: i32, msg_ptr: i32, msg_len: i32) -> i32;
            }

            $(
                /// Stand-in for the raw import off wasm (native unit tests): always
                /// `-UNSUPPORTED`.
                ///
                /// # Safety
                /// Always safe; `unsafe` only to match the wasm declaration.
                #[cfg(not(target_arch = "wasm32"))]
                pub unsafe extern "C" fn $name(_req_ptr: i32, _req_len: i32, _resp_ptr: i32, _resp_cap: i32) -> i32 {
                    -(crate::Status::UNSUPPORTED.code() as i32)
                }
            )*

            /// Stand-in for the raw import off wasm (native unit tests): always `-UNSUPPORTED`.
            ///
            /// # Safety
            /// Always safe; `unsafe` only to match the wasm declaration.
            #[cfg(not(target_arch = "wasm32"))]
            pub unsafe extern "C" fn log(_level: i32, _msg_ptr: i32, _msg_len: i32) -> i32 {
                -(crate::Status::UNSUPPORTED.code() as i32)
            }
        }
    };
}

carried_imports!(
    abort,
    clock_now,
    random_bytes,
    storage_get,
    storage_put,
    storage_delete,
    storage_list,
    storage_cas,
    secret_hmac,
    http_request,
    file_open,
    file_temp,
    file_read,
    file_write,
    file_close,
    events_subscribe,
    events_unsubscribe,
    jobs_schedule,
    jobs_cancel,
);

/// A raw cbor-convention import: `(req_ptr, req_len, resp_ptr, resp_cap) -> written or -status`.
pub type RawImport = unsafe extern "C" fn(i32, i32, i32, i32) -> i32;

/// Calls a carried-over cbor entry through its `wasihost_v2` raw import: encodes `request`,
/// retries once with the entry's `max_response_bytes` on `BUFFER_TOO_SMALL`, decodes the
/// response within the entry's bounds. `entry` is the v1 descriptor ([`abi`]): the carried
/// entries keep their v1 shapes and limits.
///
/// ```no_run
/// use wasihost_guest_v2::{abi, call, raw, Value};
/// let found = call(&abi::STORAGE_GET, raw::storage_get, &Value::map([("key", Value::from("k"))]));
/// # let _ = found;
/// ```
pub fn call(entry: &HostFn, raw: RawImport, request: &CborValue) -> Result<CborValue> {
    let body = cbor::encode(request).map_err(|_| Error::invalid_input("request is not encodable"))?;
    let response = host::call(entry, &body, entry.max_response_bytes, |a, b, c, d| unsafe { raw(a, b, c, d) })?;
    host::decode(entry, &response)
}

/// `log` of ABI 2.0: typed arguments, the message as raw UTF-8.
pub mod log {
    use crate::abi::{Error, Result, Status};

    pub use wasihost_guest::log::Level;

    /// Longest message one record takes: the entry's `max_request_bytes` (4096), all of it
    /// message bytes (v1 spent 5 of them on CBOR heads).
    pub const MAX_MESSAGE_BYTES: usize = 4096;

    /// Appends one record. A message over [`MAX_MESSAGE_BYTES`] fails with
    /// `PAYLOAD_TOO_LARGE` (without a host call); a full log with `QUOTA_EXCEEDED`.
    pub fn write(level: Level, message: &str) -> Result<()> {
        if message.len() > MAX_MESSAGE_BYTES {
            return Err(Error::from_status(Status::PAYLOAD_TOO_LARGE));
        }
        // SAFETY: the message lies in memory for the duration of the call.
        let ret = unsafe { super::raw::log(level as i32, message.as_ptr() as usize as i32, message.len() as i32) };
        match Status::from_return(ret) {
            Ok(_) => Ok(()),
            Err(status) => Err(Error::from_status(status)),
        }
    }

    fn quiet(level: Level, message: &str) {
        let _ = write(level, crate::host::truncate(message, MAX_MESSAGE_BYTES));
    }

    /// Logs at level trace, truncating to [`MAX_MESSAGE_BYTES`] and ignoring errors.
    pub fn trace(message: &str) {
        quiet(Level::Trace, message)
    }

    /// Logs at level debug, truncating to [`MAX_MESSAGE_BYTES`] and ignoring errors.
    pub fn debug(message: &str) {
        quiet(Level::Debug, message)
    }

    /// Logs at level info, truncating to [`MAX_MESSAGE_BYTES`] and ignoring errors.
    pub fn info(message: &str) {
        quiet(Level::Info, message)
    }

    /// Logs at level warn, truncating to [`MAX_MESSAGE_BYTES`] and ignoring errors.
    pub fn warn(message: &str) {
        quiet(Level::Warn, message)
    }

    /// Logs at level error, truncating to [`MAX_MESSAGE_BYTES`] and ignoring errors.
    pub fn error(message: &str) {
        quiet(Level::Error, message)
    }
}

/// `clock_now` through `wasihost_v2` (carried over from v1 unchanged).
pub mod clock {
    use super::CLOCK_NOW;
    use crate::abi::Result;
    use crate::cbor::Value;
    use crate::host;

    pub use wasihost_guest::clock::Clock;

    /// Reads `clock`.
    pub fn now(clock: Clock) -> Result<u64> {
        let request: &[u8] = match clock {
            Clock::Realtime => b"\x68realtime",
            Clock::Monotonic => b"\x69monotonic",
        };
        let response = host::call(&CLOCK_NOW, request, CLOCK_NOW.max_response_bytes, |a, b, c, d| unsafe {
            super::raw::clock_now(a, b, c, d)
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
}

/// `random_bytes` through `wasihost_v2` (carried over from v1 unchanged).
pub mod random {
    use super::{RANDOM_BYTES, RANDOM_MAX_BYTES};
    use crate::abi::Result;
    use crate::cbor::Value;
    use crate::host;

    /// Fills `buf` with random bytes, 4096 per host call.
    pub fn fill(buf: &mut [u8]) -> Result<()> {
        for chunk in buf.chunks_mut(RANDOM_MAX_BYTES) {
            let mut request = Vec::with_capacity(5);
            host::push_head(&mut request, 0, chunk.len() as u64);
            let response = host::call(&RANDOM_BYTES, &request, chunk.len() + 3, |a, b, c, d| unsafe {
                super::raw::random_bytes(a, b, c, d)
            })?;
            match host::decode(&RANDOM_BYTES, &response)? {
                Value::Bytes(bytes) if bytes.len() == chunk.len() => chunk.copy_from_slice(&bytes),
                _ => return Err(host::host_protocol(&RANDOM_BYTES, "did not return the bytes asked for")),
            }
        }
        Ok(())
    }

    /// `n` random bytes.
    pub fn bytes(n: usize) -> Result<Vec<u8>> {
        let mut out = vec![0u8; n];
        fill(&mut out)?;
        Ok(out)
    }
}

/// Ends the current call as a guest panic (class `panic`) through `wasihost_v2.abort`,
/// recording `message` (truncated at a character boundary) in the extension's log. The panic
/// hook of a v2 guest calls it, so `panic!` has the same effect.
pub fn abort(message: &str) -> ! {
    let message = host::truncate(message, wasihost_guest::ABORT_MAX_MESSAGE_BYTES);
    let mut request = Vec::with_capacity(message.len() + 3);
    host::push_text(&mut request, message);
    let ptr = request.as_ptr() as usize;
    debug_assert!(request.len() <= ABORT.max_request_bytes);
    // SAFETY: the request lies in memory; the response range is empty and starts just past
    // the request, so it overlaps nothing.
    unsafe {
        raw::abort(ptr as i32, request.len() as i32, (ptr + request.len()) as i32, 0);
    }
    // Not reached under a conforming host.
    #[cfg(target_arch = "wasm32")]
    core::arch::wasm32::unreachable();
    #[cfg(not(target_arch = "wasm32"))]
    std::process::abort();
}
