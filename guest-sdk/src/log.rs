//! Capability `log`: append records to the extension's bounded log.
//!
//! ```no_run
//! use wasihost_guest::log;
//!
//! log::info("starting");                       // errors ignored, message truncated
//! match log::write(log::Level::Warn, "disk almost full") {
//!     Ok(()) => {}
//!     Err(e) if e.status() == wasihost_guest::Status::QUOTA_EXCEEDED => { /* dropped */ }
//!     Err(e) => return Err(e),
//! }
//! # Ok::<(), wasihost_guest::Error>(())
//! ```
//!
//! The host keeps a bounded log per extension: once it is full, records are dropped and
//! `write` returns `QUOTA_EXCEEDED`. Without the `log` grant the module is refused at
//! admission, so declare `log` in the manifest's capabilities.

use crate::abi::{Result, LOG};
use crate::host;

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "wasihost_v1")]
extern "C" {
    /// Raw import `wasihost_v1.log`: request `[level, message]`, response `null`.
    ///
    /// # Safety
    /// Both ranges must lie in linear memory and must not overlap, or the host traps the
    /// guest with class `protocol`.
    #[link_name = "log"]
    pub fn raw_log(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;
}

/// Stand-in for the raw import off wasm (native unit tests): always `-UNSUPPORTED`.
///
/// # Safety
/// Always safe; `unsafe` only to match the wasm declaration.
#[cfg(not(target_arch = "wasm32"))]
pub unsafe extern "C" fn raw_log(_req_ptr: i32, _req_len: i32, _resp_ptr: i32, _resp_cap: i32) -> i32 {
    -(crate::Status::UNSUPPORTED.code() as i32)
}

/// Severity of a record; the numbers are the ABI's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Level {
    /// 0
    Trace = 0,
    /// 1
    Debug = 1,
    /// 2
    Info = 2,
    /// 3
    Warn = 3,
    /// 4
    Error = 4,
}

impl Level {
    /// The level with ABI number `n` (0..=4).
    pub fn from_u64(n: u64) -> Option<Level> {
        Some(match n {
            0 => Level::Trace,
            1 => Level::Debug,
            2 => Level::Info,
            3 => Level::Warn,
            4 => Level::Error,
            _ => return None,
        })
    }
}

/// Longest message that fits one request (4096 bytes less the array, level and text heads).
pub const MAX_MESSAGE_BYTES: usize = LOG.max_request_bytes - 5;

/// Appends one record. A message over [`MAX_MESSAGE_BYTES`] fails with `PAYLOAD_TOO_LARGE`;
/// a full log with `QUOTA_EXCEEDED`.
pub fn write(level: Level, message: &str) -> Result<()> {
    let mut request = Vec::with_capacity(message.len() + 5);
    request.push(0x82); // array of 2
    request.push(level as u8); // uint 0..=4
    host::push_text(&mut request, message);
    host::call(&LOG, &request, LOG.max_response_bytes, |a, b, c, d| unsafe { raw_log(a, b, c, d) })?;
    Ok(())
}

fn quiet(level: Level, message: &str) {
    let _ = write(level, host::truncate(message, MAX_MESSAGE_BYTES));
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
