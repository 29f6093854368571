//! Capability `storage` (ABI 1.1): a durable key-value store of the extension's own.
//!
//! ```no_run
//! use wasihost_guest::storage;
//!
//! storage::put("settings/theme", b"dark")?;
//! assert_eq!(storage::get("settings/theme")?, Some(b"dark".to_vec()));
//!
//! // Page through every key under a prefix, 100 at a time.
//! let mut after: Option<String> = None;
//! loop {
//!     let (keys, next) = storage::list("settings/", after.as_deref(), storage::MAX_PAGE_KEYS)?;
//!     for key in &keys { /* ... */ }
//!     match next { Some(last) => after = Some(last), None => break }
//! }
//!
//! // Increment a counter without losing a concurrent update: retry until the swap happens.
//! loop {
//!     let old = storage::get("counter")?;
//!     let n = old.as_deref().map_or(0, |b| b[0]) + 1;
//!     if storage::cas("counter", old.as_deref(), Some(&[n]))? { break; }
//! }
//! let existed = storage::delete("counter")?;
//! # let _ = existed;
//! # Ok::<(), wasihost_guest::Error>(())
//! ```
//!
//! Keys are text of 1 to [`MAX_KEY_BYTES`] bytes of UTF-8 without control characters; values
//! are at most [`MAX_VALUE_BYTES`] bytes. The host keeps each extension's keys apart (and,
//! when the operator names a tenant, each tenant's): no key reaches another namespace. A
//! write past the extension's quota (`storage_max_bytes`, `storage_max_objects` in the
//! manifest's `[resources]`) fails with `QUOTA_EXCEEDED` and changes nothing. A malformed key
//! gets `INVALID_ARGUMENT`. The guest must declare `abi: "1.1"` in `guest!`, and the
//! `storage` grant, or the module is refused at admission.

use crate::abi::{Result, Status, STORAGE_CAS, STORAGE_DELETE, STORAGE_GET, STORAGE_LIST, STORAGE_PUT};
use crate::cbor::Value;
use crate::host;

/// Longest key, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 256;
/// Longest value, in bytes.
pub const MAX_VALUE_BYTES: usize = 32768;
/// Most keys one [`list`] page holds.
pub const MAX_PAGE_KEYS: usize = 100;

/// Response buffer offered first to [`get`]: most values are small, and a bigger one costs
/// one retry with the entry's whole limit.
const FIRST_GET_CAP: usize = 1024 + 3;

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "wasihost_v1")]
extern "C" {
    /// Raw import `wasihost_v1.storage_get`: request key text, response the value's bytes.
    ///
    /// # Safety
    /// Both ranges must lie in linear memory and must not overlap, or the host traps the
    /// guest with class `protocol`.
    #[link_name = "storage_get"]
    pub fn raw_storage_get(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;
    /// Raw import `wasihost_v1.storage_put`: request `[key, value]`, response `null`.
    ///
    /// # Safety
    /// As [`raw_storage_get`].
    #[link_name = "storage_put"]
    pub fn raw_storage_put(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;
    /// Raw import `wasihost_v1.storage_delete`: request key text, response bool.
    ///
    /// # Safety
    /// As [`raw_storage_get`].
    #[link_name = "storage_delete"]
    pub fn raw_storage_delete(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;
    /// Raw import `wasihost_v1.storage_list`: request `[prefix, after | null, limit]`,
    /// response `[[keys], next | null]`.
    ///
    /// # Safety
    /// As [`raw_storage_get`].
    #[link_name = "storage_list"]
    pub fn raw_storage_list(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;
    /// Raw import `wasihost_v1.storage_cas`: request `[key, expected | null, new | null]`,
    /// response bool.
    ///
    /// # Safety
    /// As [`raw_storage_get`].
    #[link_name = "storage_cas"]
    pub fn raw_storage_cas(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;
}

macro_rules! stand_in {
    ($($name:ident),*) => {$(
        /// Stand-in for the raw import off wasm (native unit tests): always `-UNSUPPORTED`.
        ///
        /// # Safety
        /// Always safe; `unsafe` only to match the wasm declaration.
        #[cfg(not(target_arch = "wasm32"))]
        pub unsafe extern "C" fn $name(_req_ptr: i32, _req_len: i32, _resp_ptr: i32, _resp_cap: i32) -> i32 {
            -(crate::Status::UNSUPPORTED.code() as i32)
        }
    )*};
}

stand_in!(raw_storage_get, raw_storage_put, raw_storage_delete, raw_storage_list, raw_storage_cas);

fn push_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    host::push_head(out, 2, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn push_opt_bytes(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        Some(b) => push_bytes(out, b),
        None => out.push(0xf6),
    }
}

/// The value stored under `key`, or `None` if there is none.
pub fn get(key: &str) -> Result<Option<Vec<u8>>> {
    let mut request = Vec::with_capacity(key.len() + 3);
    host::push_text(&mut request, key);
    let response = match host::call(&STORAGE_GET, &request, FIRST_GET_CAP, |a, b, c, d| unsafe {
        raw_storage_get(a, b, c, d)
    }) {
        Ok(response) => response,
        Err(e) if e.status() == Status::NOT_FOUND => return Ok(None),
        Err(e) => return Err(e),
    };
    match host::decode(&STORAGE_GET, &response)? {
        Value::Bytes(value) => Ok(Some(value)),
        _ => Err(host::host_protocol(&STORAGE_GET, "did not return bytes")),
    }
}

/// Stores `value` under `key`, replacing what was there, in one transaction.
pub fn put(key: &str, value: &[u8]) -> Result<()> {
    let mut request = Vec::with_capacity(key.len() + value.len() + 7);
    request.push(0x82); // array of 2
    host::push_text(&mut request, key);
    push_bytes(&mut request, value);
    host::call(&STORAGE_PUT, &request, STORAGE_PUT.max_response_bytes, |a, b, c, d| unsafe {
        raw_storage_put(a, b, c, d)
    })?;
    Ok(())
}

fn boolean(entry: &crate::abi::HostFn, response: &[u8]) -> Result<bool> {
    match host::decode(entry, response)? {
        Value::Bool(b) => Ok(b),
        _ => Err(host::host_protocol(entry, "did not return a bool")),
    }
}

/// Deletes `key`; `true` if it existed.
pub fn delete(key: &str) -> Result<bool> {
    let mut request = Vec::with_capacity(key.len() + 3);
    host::push_text(&mut request, key);
    let response = host::call(&STORAGE_DELETE, &request, STORAGE_DELETE.max_response_bytes, |a, b, c, d| unsafe {
        raw_storage_delete(a, b, c, d)
    })?;
    boolean(&STORAGE_DELETE, &response)
}

/// One page of at most `limit` (1..=[`MAX_PAGE_KEYS`]) keys starting with `prefix`, in byte
/// order, after the key `after` (the previous page's cursor). The second value is the cursor
/// of the next page, `None` when this page is the last.
pub fn list(prefix: &str, after: Option<&str>, limit: usize) -> Result<(Vec<String>, Option<String>)> {
    let mut request = Vec::with_capacity(prefix.len() + after.map_or(1, |a| a.len() + 3) + 8);
    request.push(0x83); // array of 3
    host::push_text(&mut request, prefix);
    match after {
        Some(a) => host::push_text(&mut request, a),
        None => request.push(0xf6),
    }
    host::push_head(&mut request, 0, limit as u64);
    let response = host::call(&STORAGE_LIST, &request, STORAGE_LIST.max_response_bytes, |a, b, c, d| unsafe {
        raw_storage_list(a, b, c, d)
    })?;
    let bad = || host::host_protocol(&STORAGE_LIST, "did not return [keys, next]");
    let page = host::decode(&STORAGE_LIST, &response)?;
    let items = page.as_array().ok_or_else(bad)?;
    if items.len() != 2 {
        return Err(bad());
    }
    let mut keys = Vec::new();
    for key in items[0].as_array().ok_or_else(bad)? {
        keys.push(key.as_str().ok_or_else(bad)?.to_string());
    }
    let next = match &items[1] {
        Value::Null => None,
        Value::Text(t) => Some(t.clone()),
        _ => return Err(bad()),
    };
    Ok((keys, next))
}

/// Compare-and-swap: if the value under `key` is `expected` (`None`: no value), make it `new`
/// (`None`: delete the key) and answer `true`; otherwise change nothing and answer `false`.
pub fn cas(key: &str, expected: Option<&[u8]>, new: Option<&[u8]>) -> Result<bool> {
    let size = key.len() + expected.map_or(0, |e| e.len()) + new.map_or(0, |n| n.len()) + 12;
    let mut request = Vec::with_capacity(size);
    request.push(0x83); // array of 3
    host::push_text(&mut request, key);
    push_opt_bytes(&mut request, expected);
    push_opt_bytes(&mut request, new);
    let response = host::call(&STORAGE_CAS, &request, STORAGE_CAS.max_response_bytes, |a, b, c, d| unsafe {
        raw_storage_cas(a, b, c, d)
    })?;
    boolean(&STORAGE_CAS, &response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_wasm_every_call_is_unsupported() {
        assert_eq!(put("k", b"v").unwrap_err().status(), Status::UNSUPPORTED);
        assert_eq!(get("k").unwrap_err().status(), Status::UNSUPPORTED);
        assert_eq!(delete("k").unwrap_err().status(), Status::UNSUPPORTED);
        assert_eq!(list("", None, 10).unwrap_err().status(), Status::UNSUPPORTED);
        assert_eq!(cas("k", None, Some(b"v")).unwrap_err().status(), Status::UNSUPPORTED);
    }

    #[test]
    fn a_request_over_the_limit_fails_locally() {
        let big = vec![0u8; MAX_VALUE_BYTES + 1024];
        assert_eq!(put("k", &big).unwrap_err().status(), Status::PAYLOAD_TOO_LARGE);
    }
}
