//! Capability `core` (always granted): end the current call as a guest panic.

use crate::abi::ABORT;
use crate::host;

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "wasihost_v1")]
extern "C" {
    /// Raw import `wasihost_v1.abort`: request text (the message, at most 1024 bytes of
    /// CBOR); never returns, the call traps with class `panic`.
    ///
    /// # Safety
    /// Both ranges must lie in linear memory, or the host traps with class `protocol`.
    #[link_name = "abort"]
    pub fn raw_abort(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;
}

/// Stand-in for the raw import off wasm (native unit tests): always `-UNSUPPORTED`.
///
/// # Safety
/// Always safe; `unsafe` only to match the wasm declaration.
#[cfg(not(target_arch = "wasm32"))]
pub unsafe extern "C" fn raw_abort(_req_ptr: i32, _req_len: i32, _resp_ptr: i32, _resp_cap: i32) -> i32 {
    -(crate::Status::UNSUPPORTED.code() as i32)
}

/// Longest message that fits the request (1024 bytes less a 3-byte text head).
pub const MAX_MESSAGE_BYTES: usize = ABORT.max_request_bytes - 3;

/// Ends the current call as a guest panic (failure class `panic`), recording `message`
/// (truncated to [`MAX_MESSAGE_BYTES`] at a character boundary) in the extension's log.
///
/// The instance is discarded afterwards; the next call runs in a fresh one. The SDK's
/// panic hook calls this, so `panic!` has the same effect.
#[cfg(not(feature = "native"))] pub fn abort(message: &str) -> ! {
    let message = host::truncate(message, MAX_MESSAGE_BYTES);
    let mut request = Vec::with_capacity(message.len() + 3);
    host::push_text(&mut request, message);
    let ptr = request.as_ptr() as usize;
    // SAFETY: the request lies in memory; the response range is empty and starts just past
    // the request, so it overlaps nothing.
    unsafe {
        raw_abort(ptr as i32, request.len() as i32, (ptr + request.len()) as i32, 0);
    }
    // Not reached under a conforming host.
    trap()
}

/// Traps immediately (`unreachable`), without calling the host.
#[cfg_attr(feature = "native", allow(dead_code))] pub(crate) fn trap() -> ! {
    #[cfg(target_arch = "wasm32")]
    core::arch::wasm32::unreachable();
    #[cfg(not(target_arch = "wasm32"))]
    std::process::abort();
}

/// Ends the current command as a guest panic (failure class `panic`) with `message`
/// (truncated to [`MAX_MESSAGE_BYTES`]): in a native plugin (feature `native`), the command
/// unwinds to the runtime, which reports the message through the host's `abort` and answers
/// the call's failure. The process serves the next call (the host decides whether to).
/// (Appended, with the wasm `abort`'s `#[cfg]` on its first line, so that no line of the wasm
/// build moves; see `host::call`.)
#[cfg(feature = "native")]
pub fn abort(message: &str) -> ! {
    crate::native::abort(host::truncate(message, MAX_MESSAGE_BYTES))
}
