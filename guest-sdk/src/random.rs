//! Capability `random`: random bytes from the host (the OS CSPRNG, or a seeded deterministic
//! source when the host's policy asks for reproducible runs).
//!
//! ```no_run
//! let mut key = [0u8; 32];
//! wasihost_guest::random::fill(&mut key)?;
//! let nonce = wasihost_guest::random::u64()?;
//! # Ok::<(), wasihost_guest::Error>(())
//! ```
//!
//! Each host call returns at most 4096 bytes; [`fill`] makes as many calls as it needs.
//! Without the `random` grant the module is refused at admission.

use crate::abi::{Result, RANDOM_BYTES, RANDOM_MAX_BYTES};
use crate::cbor::Value;
use crate::host;

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "wasihost_v1")]
extern "C" {
    /// Raw import `wasihost_v1.random_bytes`: request uint `n` (0..=4096), response `n`
    /// random bytes as a CBOR byte string.
    ///
    /// # Safety
    /// Both ranges must lie in linear memory and must not overlap, or the host traps the
    /// guest with class `protocol`.
    #[link_name = "random_bytes"]
    pub fn raw_random_bytes(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;
}

/// Stand-in for the raw import off wasm (native unit tests): always `-UNSUPPORTED`.
///
/// # Safety
/// Always safe; `unsafe` only to match the wasm declaration.
#[cfg(not(target_arch = "wasm32"))]
pub unsafe extern "C" fn raw_random_bytes(_req_ptr: i32, _req_len: i32, _resp_ptr: i32, _resp_cap: i32) -> i32 {
    -(crate::Status::UNSUPPORTED.code() as i32)
}

/// Fills `buf` with random bytes, 4096 per host call.
pub fn fill(buf: &mut [u8]) -> Result<()> {
    for chunk in buf.chunks_mut(RANDOM_MAX_BYTES) {
        let mut request = Vec::with_capacity(5);
        host::push_head(&mut request, 0, chunk.len() as u64);
        // A byte string head is at most 3 bytes for n <= 4096.
        let response = host::call(&RANDOM_BYTES, &request, chunk.len() + 3, |a, b, c, d| unsafe {
            raw_random_bytes(a, b, c, d)
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

/// A random `u64`.
pub fn u64() -> Result<u64> {
    let mut b = [0u8; 8];
    fill(&mut b)?;
    Ok(u64::from_le_bytes(b))
}
