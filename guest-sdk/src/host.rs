//! The one calling convention shared by every host function: encode, call, retry on
//! `BUFFER_TOO_SMALL`, decode.

use crate::abi::{Error, HostFn, Result, Status};
use crate::cbor::{self, Limits, Value};

/// Calls a raw import with `request`, offering `first_cap` bytes of response buffer first
/// and, on `BUFFER_TOO_SMALL`, once more with the entry's `max_response_bytes`.
///
/// Requests over the entry's `max_request_bytes` fail locally with `PAYLOAD_TOO_LARGE`,
/// without spending a host call.
#[cfg(not(feature = "native"))] pub(crate) fn call<F>(entry: &HostFn, request: &[u8], first_cap: usize, mut raw: F) -> Result<Vec<u8>>
where
    F: FnMut(i32, i32, i32, i32) -> i32,
{
    if request.len() > entry.max_request_bytes {
        return Err(Error::from_status(Status::PAYLOAD_TOO_LARGE));
    }
    let mut cap = first_cap.min(entry.max_response_bytes);
    loop {
        let mut buf: Vec<u8> = Vec::with_capacity(cap);
        let ret = raw(
            request.as_ptr() as usize as i32,
            request.len() as i32,
            buf.as_mut_ptr() as usize as i32,
            cap as i32,
        );
        match Status::from_return(ret) {
            Ok(written) if written <= cap => {
                // SAFETY: the host wrote `written` bytes at the buffer's start.
                unsafe { buf.set_len(written) };
                return Ok(buf);
            }
            Ok(_) => return Err(host_protocol(entry, "wrote past the response buffer")),
            Err(Status::BUFFER_TOO_SMALL) if cap < entry.max_response_bytes => {
                cap = entry.max_response_bytes;
            }
            Err(status) => return Err(Error::from_status(status)),
        }
    }
}

/// Decodes a host response within the entry's bounds.
pub(crate) fn decode(entry: &HostFn, response: &[u8]) -> Result<Value> {
    let limits = Limits {
        max_bytes: entry.max_response_bytes,
        ..Limits::DEFAULT
    };
    cbor::decode_with(response, &limits).map_err(|_| host_protocol(entry, "sent a malformed response"))
}

/// A host response the SDK cannot use (class `host_protocol`, status `INTERNAL`).
pub(crate) fn host_protocol(entry: &HostFn, what: &str) -> Error {
    Error::new("host_protocol", format!("host function {} {}", entry.name, what))
}

/// `s` cut to at most `max` bytes at a character boundary.
pub(crate) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Appends a CBOR text string (head and bytes).
pub(crate) fn push_text(out: &mut Vec<u8>, s: &str) {
    push_head(out, 3, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// Appends a CBOR head of major type `major` with argument `arg`, in the shortest form.
pub(crate) fn push_head(out: &mut Vec<u8>, major: u8, arg: u64) {
    let m = major << 5;
    if arg < 24 {
        out.push(m | arg as u8);
    } else if arg <= 0xff {
        out.extend_from_slice(&[m | 24, arg as u8]);
    } else if arg <= 0xffff {
        out.push(m | 25);
        out.extend_from_slice(&(arg as u16).to_be_bytes());
    } else if arg <= 0xffff_ffff {
        out.push(m | 26);
        out.extend_from_slice(&(arg as u32).to_be_bytes());
    } else {
        out.push(m | 27);
        out.extend_from_slice(&arg.to_be_bytes());
    }
}

/// [`call`] in a native plugin (feature `native`): the same checks and retry, each attempt a
/// host call over the channel (the raw import's stand-in is never called).
///
/// The wasm `call` above carries its `#[cfg]` on its own first line, and the native code is
/// appended here, so that no line of the wasm build moves: a module's panic locations carry
/// the SDK's line numbers, and `fixtures/build --check` compares the modules byte for byte.
#[cfg(feature = "native")]
pub(crate) fn call<F>(entry: &HostFn, request: &[u8], first_cap: usize, _raw: F) -> Result<Vec<u8>>
where
    F: FnMut(i32, i32, i32, i32) -> i32,
{
    call_in(crate::abi::IMPORT_MODULE, entry, request, first_cap)
}

/// [`call`] of an entry of import module `module` in a native plugin.
#[cfg(feature = "native")]
pub(crate) fn call_in(module: &str, entry: &HostFn, request: &[u8], first_cap: usize) -> Result<Vec<u8>> {
    if request.len() > entry.max_request_bytes {
        return Err(Error::from_status(Status::PAYLOAD_TOO_LARGE));
    }
    let mut cap = first_cap.min(entry.max_response_bytes);
    loop {
        match crate::native::host_call(module, entry.name, request, cap) {
            Ok(response) => return Ok(response),
            Err(Status::BUFFER_TOO_SMALL) if cap < entry.max_response_bytes => {
                cap = entry.max_response_bytes;
            }
            Err(status) => return Err(Error::from_status(status)),
        }
    }
}
