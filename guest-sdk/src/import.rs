//! Host functions an embedding application defines in its own namespace (for example
//! `myapp_v1.lookup`), called with a CBOR [`Value`] request and answering one.
//!
//! Declare them once per namespace with [`import!`](crate::import): it emits the raw imports
//! under the namespace's import module, the `wasihost_abi.<namespace>` section declaring which
//! version of the namespace the guest was built against, and one safe function per import.
//!
//! ```ignore
//! wasihost_guest::import! {
//!     namespace "myapp", version "1.0", module "myapp_v1" {
//!         /// Look a key up in the application's catalogue.
//!         fn lookup;
//!         fn remember;
//!     }
//! }
//!
//! let found = lookup(&Value::map([("key", Value::from("sku-1"))]))?;
//! ```
//!
//! A host function of the native convention (`convention="native"` on the host) takes and
//! answers integers, with no CBOR and no guest memory: the cheapest host call there is. List it
//! with its exact signature (`i32`/`i64` only, at most one result) and call it directly:
//!
//! ```no_run
//! wasihost_guest::import! {
//!     namespace "myapp", version "1.0", module "myapp_v1" {
//!         fn lookup;
//!         /// Add two numbers in the application (capability `myapp.math`).
//!         fn add(a: i64, b: i64) -> i64;
//!     }
//! }
//!
//! let three = add(1, 2);
//! # let _ = (three, lookup);
//! ```
//!
//! A native function has no status slot: a refusal (a capability withdrawn while the module
//! runs, a revocation) or a failure of the host function ends the guest's call, as a trap, with
//! the class `denied` or `host_error` reported to the host's caller. A function that needs an
//! answer the guest can act on says so in its result (for example a negative value).
//!
//! The module must match the version's major (`myapp_v1` for `1.x`); the host refuses a module
//! that imports a function newer than the declared minor, or whose capability it was not
//! granted, naming the import.

use crate::abi::{Error, HostFn, Result};
use crate::cbor::{self, Value};
use crate::host;

/// Most response bytes the SDK accepts from an embedder function: the host's own ceiling on
/// any embedder entry (`MAX_FUNCTION_PAYLOAD_BYTES`, 1 MiB).
pub const MAX_RESPONSE_BYTES: usize = 1 << 20;
/// The first response buffer offered; a larger answer costs one retry at the ceiling.
pub const FIRST_RESPONSE_CAP: usize = 4096;

/// A raw import's signature: `(req_ptr, req_len, resp_ptr, resp_cap) -> written or -status`.
pub type RawImport = unsafe extern "C" fn(i32, i32, i32, i32) -> i32;

/// Calls the embedder function `name` through its raw import with `request`: encodes it,
/// retries once with a larger buffer on `BUFFER_TOO_SMALL`, and decodes the response. A status
/// the host answers (`DENIED`, `NOT_FOUND`, `PAYLOAD_TOO_LARGE`, ...) is the error's status.
pub fn call(name: &'static str, raw: RawImport, request: &Value) -> Result<Value> {
    let entry = HostFn {
        name,
        capability: "",
        max_request_bytes: MAX_RESPONSE_BYTES,
        max_response_bytes: MAX_RESPONSE_BYTES,
        since: "",
    };
    let body = cbor::encode(request).map_err(|_| Error::invalid_input("request is not encodable"))?;
    let response = host::call(&entry, &body, FIRST_RESPONSE_CAP, |a, b, c, d| unsafe { raw(a, b, c, d) })?;
    host::decode(&entry, &response)
}

/// The bytes of a version text, as the marker section's content (used by [`import!`](crate::import)).
#[doc(hidden)]
pub const fn marker<const N: usize>(version: &str) -> [u8; N] {
    let bytes = version.as_bytes();
    let mut out = [0u8; N];
    let mut i = 0;
    while i < N {
        out[i] = bytes[i];
        i += 1;
    }
    out
}

/// Stand-in for an embedder import off wasm (native unit tests): always `-UNSUPPORTED`.
///
/// # Safety
/// Always safe; `unsafe` only to match the wasm declaration.
#[doc(hidden)]
pub unsafe extern "C" fn unsupported(_req_ptr: i32, _req_len: i32, _resp_ptr: i32, _resp_cap: i32) -> i32 {
    -(crate::Status::UNSUPPORTED.code() as i32)
}

/// Declares the embedder host functions of one namespace version; see [`import`](crate::import).
///
/// Two kinds of function may be listed, in any order:
/// - `fn lookup;`: a cbor-convention function, called as `lookup(&Value) -> Result<Value>`;
/// - `fn add(a: i64, b: i64) -> i64;`: a native-convention function (registered by the host with
///   `convention="native"`), integers in and at most one integer out, called directly as
///   `add(1, 2)`. Its types must be the host's exactly (`i32`/`i64`); the host refuses a module
///   whose import differs, naming it.
#[macro_export]
macro_rules! import {
    (namespace $ns:literal, version $ver:literal, module $module:literal {
        $($items:tt)*
    }) => {
        #[doc(hidden)]
        #[cfg(target_arch = "wasm32")]
        #[link_section = concat!("wasihost_abi.", $ns)]
        #[used]
        static __WASIHOST_NAMESPACE_MARKER: [u8; $ver.len()] =
            $crate::import::marker::<{ $ver.len() }>($ver);

        $crate::__wasihost_import_items! { $module; $($items)* }
    };
}

/// One item of [`import!`](crate::import) at a time (cbor or native), then the rest.
#[doc(hidden)]
#[macro_export]
macro_rules! __wasihost_import_items {
    ($module:literal;) => {};
    ($module:literal; $(#[$attr:meta])* fn $name:ident; $($rest:tt)*) => {
        $(#[$attr])*
        pub fn $name(request: &$crate::Value) -> $crate::Result<$crate::Value> {
            #[cfg(target_arch = "wasm32")]
            #[link(wasm_import_module = $module)]
            extern "C" {
                #[link_name = stringify!($name)]
                fn raw(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;
            }
            #[cfg(not(target_arch = "wasm32"))]
            use $crate::import::unsupported as raw;
            $crate::__wasihost_import_call!($module, stringify!($name), raw, request)
        }
        $crate::__wasihost_import_items! { $module; $($rest)* }
    };
    ($module:literal; $(#[$attr:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;
     $($rest:tt)*) => {
        $(#[$attr])*
        #[allow(clippy::too_many_arguments)]
        pub fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "wasm32")]
            #[link(wasm_import_module = $module)]
            extern "C" {
                #[link_name = stringify!($name)]
                fn raw($($arg: $ty),*) $(-> $ret)?;
            }
            // Off wasm there is no host to call (native unit tests): a native function has no
            // status through which to say so, and no value to make up.
            #[cfg(not(target_arch = "wasm32"))]
            #[allow(unused_variables)]
            unsafe fn raw($($arg: $ty),*) $(-> $ret)? {
                $crate::__wasihost_native_import!($module, $name, [$($arg),*] $(, $ret)?)
            }
            // Safety: integers only cross; the host checks the call and never touches memory.
            unsafe { raw($($arg),*) }
        }
        $crate::__wasihost_import_items! { $module; $($rest)* }
    };
}

/// [`call`] in a native plugin (feature `native`): the function `name` of import module
/// `module`, called over the channel.
#[cfg(feature = "native")]
pub fn call_in(module: &'static str, name: &'static str, request: &Value) -> Result<Value> {
    let entry = HostFn {
        name,
        capability: "",
        max_request_bytes: MAX_RESPONSE_BYTES,
        max_response_bytes: MAX_RESPONSE_BYTES,
        since: "",
    };
    let body = cbor::encode(request).map_err(|_| Error::invalid_input("request is not encodable"))?;
    let response = host::call_in(module, &entry, &body, FIRST_RESPONSE_CAP)?;
    host::decode(&entry, &response)
}

/// How [`import!`](crate::import)'s cbor functions call: through their raw import (a wasm
/// guest), or over the channel with their module (a native plugin, feature `native`).
#[cfg(not(feature = "native"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __wasihost_import_call {
    ($module:literal, $name:expr, $raw:ident, $request:ident) => {
        $crate::import::call($name, $raw, $request)
    };
}

/// How [`import!`](crate::import)'s cbor functions call (see the other definition).
#[cfg(feature = "native")]
#[doc(hidden)]
#[macro_export]
macro_rules! __wasihost_import_call {
    ($module:literal, $name:expr, $raw:ident, $request:ident) => {{
        let _ = $raw;
        $crate::import::call_in($module, $name, $request)
    }};
}

/// The body of a native-convention function off wasm: a panic in native unit tests, a host
/// call over the channel in a native plugin (feature `native`).
#[cfg(not(feature = "native"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __wasihost_native_import {
    ($module:literal, $name:ident, [$($arg:ident),*] $(, $ret:ty)?) => {
        panic!(concat!($module, ".", stringify!($name), " is a host import: only a wasm guest can call it"))
    };
}

/// The body of a native-convention function in a native plugin (see the other definition).
#[cfg(feature = "native")]
#[doc(hidden)]
#[macro_export]
macro_rules! __wasihost_native_import {
    ($module:literal, $name:ident, [$($arg:ident),*]) => {{
        $crate::native::call_native_import($module, stringify!($name), &[$($arg as i64),*]);
    }};
    ($module:literal, $name:ident, [$($arg:ident),*], $ret:ty) => {
        $crate::native::call_native_import($module, stringify!($name), &[$($arg as i64),*]) as $ret
    };
}
