//! Capability `secrets` (ABI 1.1): use a secret the operator granted without ever reading it.
//!
//! The guest names a secret; the host signs with it. The secret's bytes never enter the
//! guest's memory.
//!
//! ```no_run
//! let mac = wasihost_guest::secrets::hmac_sha256("signing-key", b"order 42")?;
//! assert_eq!(mac.len(), 32);
//! # Ok::<(), wasihost_guest::Error>(())
//! ```
//!
//! Statuses: `DENIED` if the operator did not grant this name (or revoked it), `NOT_FOUND` if
//! the host's store lacks it, `UNAVAILABLE` if the store holds it unsafely. A guest built with
//! this module declares `abi: "1.1"` in [`guest!`](crate::guest!).

use crate::abi::{Result, SECRET_HMAC};
use crate::cbor::Value;
use crate::host;

/// Largest data [`hmac_sha256`] signs in one call.
pub const MAX_HMAC_DATA_BYTES: usize = 16 * 1024;

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "wasihost_v1")]
extern "C" {
    /// Raw import `wasihost_v1.secret_hmac`: request `[name: text, data: bytes]`, response
    /// the 32-byte HMAC-SHA256 as a CBOR byte string.
    ///
    /// # Safety
    /// Both ranges must lie in linear memory and must not overlap, or the host traps the
    /// guest with class `protocol`.
    #[link_name = "secret_hmac"]
    pub fn raw_secret_hmac(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;
}

/// Stand-in for the raw import off wasm (native unit tests): always `-UNSUPPORTED`.
///
/// # Safety
/// Always safe; `unsafe` only to match the wasm declaration.
#[cfg(not(target_arch = "wasm32"))]
pub unsafe extern "C" fn raw_secret_hmac(_req_ptr: i32, _req_len: i32, _resp_ptr: i32, _resp_cap: i32) -> i32 {
    -(crate::Status::UNSUPPORTED.code() as i32)
}

/// HMAC-SHA256 of `data` under the secret `name`, computed by the host.
pub fn hmac_sha256(name: &str, data: &[u8]) -> Result<[u8; 32]> {
    if data.len() > MAX_HMAC_DATA_BYTES {
        return Err(crate::Error::from_status(crate::Status::PAYLOAD_TOO_LARGE));
    }
    let mut request = Vec::with_capacity(name.len() + data.len() + 8);
    host::push_head(&mut request, 4, 2);
    host::push_text(&mut request, name);
    host::push_head(&mut request, 2, data.len() as u64);
    request.extend_from_slice(data);
    let response = host::call(&SECRET_HMAC, &request, SECRET_HMAC.max_response_bytes, |a, b, c, d| unsafe {
        raw_secret_hmac(a, b, c, d)
    })?;
    match host::decode(&SECRET_HMAC, &response)? {
        Value::Bytes(mac) if mac.len() == 32 => {
            let mut out = [0u8; 32];
            out.copy_from_slice(&mac);
            Ok(out)
        }
        _ => Err(host::host_protocol(&SECRET_HMAC, "did not return 32 bytes")),
    }
}
