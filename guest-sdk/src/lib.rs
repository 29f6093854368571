#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod abi;
pub mod cbor;
pub mod clock;
pub mod events;
pub mod files;
pub mod guest;
pub mod http;
pub mod import;
pub mod jobs;
pub mod log;
#[cfg(feature = "native")]
pub mod native;
pub mod random;
pub mod secrets;
pub mod storage;

mod abort;
mod host;

pub use abi::{Error, Result, Status};
pub use abort::{abort, MAX_MESSAGE_BYTES as ABORT_MAX_MESSAGE_BYTES};
pub use cbor::Value;

#[cfg(all(feature = "native", target_arch = "wasm32"))]
compile_error!("the `native` feature builds a host executable: build it for the host's target, not wasm32");

/// The raw host imports, for guests that must control the exact bytes and pointers (tests of
/// the host's checks). Prefer the safe wrappers in the modules ([`log`], [`clock`],
/// [`random`], [`secrets`], [`events`], [`files`], ...) and [`abort()`].
/// the host's checks). Prefer the safe wrappers in [`log`], [`clock`], [`random`], [`http`]
/// and [`abort()`].
/// the host's checks). Prefer the safe wrappers in [`log`], [`clock`], [`random`],
/// [`storage`] and [`abort()`].
///
/// Each has the ABI's signature `(req_ptr, req_len, resp_ptr, resp_cap) -> i32`: a return
/// `>= 0` is the number of response bytes written, `< 0` is `-status`
/// ([`Status::from_return`] decodes it). Off wasm they are stand-ins returning
/// `-UNSUPPORTED`.
pub mod raw {
    pub use crate::abort::raw_abort as abort;
    pub use crate::clock::raw_clock_now as clock_now;
    pub use crate::events::raw_events_subscribe as events_subscribe;
    pub use crate::events::raw_events_unsubscribe as events_unsubscribe;
    pub use crate::files::raw_file_close as file_close;
    pub use crate::files::raw_file_open as file_open;
    pub use crate::files::raw_file_read as file_read;
    pub use crate::files::raw_file_temp as file_temp;
    pub use crate::files::raw_file_write as file_write;
    pub use crate::http::raw_http_request as http_request;
    pub use crate::jobs::raw_jobs_cancel as jobs_cancel;
    pub use crate::jobs::raw_jobs_schedule as jobs_schedule;
    pub use crate::log::raw_log as log;
    pub use crate::random::raw_random_bytes as random_bytes;
    pub use crate::secrets::raw_secret_hmac as secret_hmac;
    pub use crate::storage::raw_storage_cas as storage_cas;
    pub use crate::storage::raw_storage_delete as storage_delete;
    pub use crate::storage::raw_storage_get as storage_get;
    pub use crate::storage::raw_storage_list as storage_list;
    pub use crate::storage::raw_storage_put as storage_put;
}
