//! Capability `files` (ABI 1.1): files under the mounts the operator granted, and temporary
//! files, through handles. The guest names a mount and a relative path, never a host path.
//!
//! ```no_run
//! use wasihost_guest::files::{File, Mode};
//!
//! let mut config = File::open("data", "config/app.toml", Mode::Read)?;
//! let text = config.read_to_end()?;
//!
//! let mut out = File::open("data", "reports/today.txt", Mode::Write)?; // created, truncated
//! out.write_all(&text)?;
//! out.close()?; // or let it drop
//!
//! let mut scratch = File::temp()?; // private, removed when closed or after its time bound
//! scratch.write_all(b"intermediate")?;
//! let back = scratch.read_at(0, 12)?;
//! # Ok::<(), wasihost_guest::Error>(())
//! ```
//!
//! A guest using this module declares `abi: "1.1"` in [`guest!`](crate::guest!) and `files` in
//! its features. Each read or write moves at most [`MAX_IO_BYTES`]; [`File::read_to_end`] and
//! [`File::write_all`] make as many calls as they need. Statuses the host answers are the
//! error's status: `DENIED` (a mount not granted, a write to a read-only mount or handle, a path
//! leaving the mount), `NOT_FOUND` (no such file, an unknown or expired handle),
//! `QUOTA_EXCEEDED` (too many open handles, the extension's write quota, a file's size bound),
//! `INVALID_ARGUMENT` (a malformed path or request).

use crate::abi::{HostFn, Result, FILE_CLOSE, FILE_OPEN, FILE_READ, FILE_TEMP, FILE_WRITE};
use crate::cbor::Value;
use crate::host;

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "wasihost_v1")]
extern "C" {
    /// Raw import `wasihost_v1.file_open`: request `[mount, path, mode]`, response uint handle.
    ///
    /// # Safety
    /// Both ranges must lie in linear memory and must not overlap, or the host traps the
    /// guest with class `protocol`.
    #[link_name = "file_open"]
    pub fn raw_file_open(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;
    /// Raw import `wasihost_v1.file_temp`: request `null`, response uint handle.
    ///
    /// # Safety
    /// As [`raw_file_open`].
    #[link_name = "file_temp"]
    pub fn raw_file_temp(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;
    /// Raw import `wasihost_v1.file_read`: request `[handle, offset | null, length]`, response
    /// bytes.
    ///
    /// # Safety
    /// As [`raw_file_open`].
    #[link_name = "file_read"]
    pub fn raw_file_read(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;
    /// Raw import `wasihost_v1.file_write`: request `[handle, offset | null, data]`, response
    /// uint bytes written.
    ///
    /// # Safety
    /// As [`raw_file_open`].
    #[link_name = "file_write"]
    pub fn raw_file_write(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;
    /// Raw import `wasihost_v1.file_close`: request uint handle, response `null`.
    ///
    /// # Safety
    /// As [`raw_file_open`].
    #[link_name = "file_close"]
    pub fn raw_file_close(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;
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

stand_in!(raw_file_open, raw_file_temp, raw_file_read, raw_file_write, raw_file_close);

/// Most bytes one read or write call moves (the ABI's bound).
pub const MAX_IO_BYTES: usize = 32768;

/// What a handle may do, as [`File::open`] asks for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// `"r"`: read an existing file.
    Read,
    /// `"w"`: write a file, created if missing and truncated if not (a writable mount only).
    Write,
    /// `"rw"`: read and write an existing file (a writable mount only).
    ReadWrite,
    /// `"a"`: append to a file, created if missing (a writable mount only).
    Append,
}

impl Mode {
    /// The ABI's text for the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Read => "r",
            Mode::Write => "w",
            Mode::ReadWrite => "rw",
            Mode::Append => "a",
        }
    }
}

/// An open file handle of this extension; closed when dropped.
#[derive(Debug)]
pub struct File {
    handle: u64,
    open: bool,
}

fn uint_response(entry: &HostFn, response: &[u8]) -> Result<u64> {
    match host::decode(entry, response)? {
        Value::Int(n) if n >= 0 && n <= u64::MAX as i128 => Ok(n as u64),
        _ => Err(host::host_protocol(entry, "did not return a uint")),
    }
}

fn push_offset(request: &mut Vec<u8>, offset: Option<u64>) {
    match offset {
        Some(at) => host::push_head(request, 0, at),
        None => request.push(0xf6), // null: the handle's position
    }
}

impl File {
    /// Opens `path` (relative, `/`-separated) under the granted mount `mount`.
    pub fn open(mount: &str, path: &str, mode: Mode) -> Result<File> {
        let mut request = Vec::with_capacity(mount.len() + path.len() + 12);
        request.push(0x83); // array of 3
        host::push_text(&mut request, mount);
        host::push_text(&mut request, path);
        host::push_text(&mut request, mode.as_str());
        let response = host::call(&FILE_OPEN, &request, FILE_OPEN.max_response_bytes, |a, b, c, d| unsafe {
            raw_file_open(a, b, c, d)
        })?;
        Ok(File::from_handle(uint_response(&FILE_OPEN, &response)?))
    }

    /// A new, empty, read-write temporary file, removed when closed, when the extension
    /// closes, or when the host's time bound for it passes (then the handle answers
    /// `NOT_FOUND`).
    pub fn temp() -> Result<File> {
        let response = host::call(&FILE_TEMP, &[0xf6], FILE_TEMP.max_response_bytes, |a, b, c, d| unsafe {
            raw_file_temp(a, b, c, d)
        })?;
        Ok(File::from_handle(uint_response(&FILE_TEMP, &response)?))
    }

    /// Takes ownership of a handle number (one kept with [`File::into_handle`] across
    /// commands: the host keeps handles as long as the extension).
    pub fn from_handle(handle: u64) -> File {
        File { handle, open: true }
    }

    /// The handle number.
    pub fn handle(&self) -> u64 {
        self.handle
    }

    /// Gives the handle number up without closing it.
    pub fn into_handle(mut self) -> u64 {
        self.open = false;
        self.handle
    }

    fn read_from(&self, offset: Option<u64>, max: usize) -> Result<Vec<u8>> {
        let n = max.min(MAX_IO_BYTES);
        let mut request = Vec::with_capacity(24);
        request.push(0x83);
        host::push_head(&mut request, 0, self.handle);
        push_offset(&mut request, offset);
        host::push_head(&mut request, 0, n as u64);
        // A byte string head is at most 3 bytes for n <= 32768.
        let response = host::call(&FILE_READ, &request, n + 3, |a, b, c, d| unsafe { raw_file_read(a, b, c, d) })?;
        match host::decode(&FILE_READ, &response)? {
            Value::Bytes(bytes) if bytes.len() <= n => Ok(bytes),
            _ => Err(host::host_protocol(&FILE_READ, "did not return the bytes asked for")),
        }
    }

    /// Reads at most `max` bytes (and at most [`MAX_IO_BYTES`]) at the handle's position,
    /// which moves past them; empty at the end of the file.
    pub fn read(&mut self, max: usize) -> Result<Vec<u8>> {
        self.read_from(None, max)
    }

    /// Reads at most `max` bytes at `offset`; the handle's position does not move.
    pub fn read_at(&self, offset: u64, max: usize) -> Result<Vec<u8>> {
        self.read_from(Some(offset), max)
    }

    /// Reads from the handle's position to the end of the file.
    pub fn read_to_end(&mut self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            let chunk = self.read(MAX_IO_BYTES)?;
            if chunk.is_empty() {
                return Ok(out);
            }
            out.extend_from_slice(&chunk);
        }
    }

    fn write_to(&self, offset: Option<u64>, data: &[u8]) -> Result<usize> {
        let data = &data[..data.len().min(MAX_IO_BYTES)];
        let mut request = Vec::with_capacity(data.len() + 24);
        request.push(0x83);
        host::push_head(&mut request, 0, self.handle);
        push_offset(&mut request, offset);
        host::push_head(&mut request, 2, data.len() as u64);
        request.extend_from_slice(data);
        let response = host::call(&FILE_WRITE, &request, FILE_WRITE.max_response_bytes, |a, b, c, d| unsafe {
            raw_file_write(a, b, c, d)
        })?;
        let written = uint_response(&FILE_WRITE, &response)?;
        if written > data.len() as u64 {
            return Err(host::host_protocol(&FILE_WRITE, "wrote more than it was given"));
        }
        Ok(written as usize)
    }

    /// Writes at most [`MAX_IO_BYTES`] of `data` at the handle's position (at the end for
    /// [`Mode::Append`]), which moves past them; returns how many were written.
    pub fn write(&mut self, data: &[u8]) -> Result<usize> {
        self.write_to(None, data)
    }

    /// Writes at most [`MAX_IO_BYTES`] of `data` at `offset` (not on an append handle); the
    /// handle's position does not move.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<usize> {
        self.write_to(Some(offset), data)
    }

    /// Writes all of `data` at the handle's position, in as many calls as it takes.
    pub fn write_all(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            let n = self.write(data)?;
            if n == 0 {
                return Err(host::host_protocol(&FILE_WRITE, "wrote nothing"));
            }
            data = &data[n..];
        }
        Ok(())
    }

    /// Closes the handle (a temporary file is removed), reporting the host's answer; dropping
    /// the file closes it too, ignoring errors.
    pub fn close(mut self) -> Result<()> {
        self.open = false;
        close_handle(self.handle)
    }
}

fn close_handle(handle: u64) -> Result<()> {
    let mut request = Vec::with_capacity(9);
    host::push_head(&mut request, 0, handle);
    host::call(&FILE_CLOSE, &request, FILE_CLOSE.max_response_bytes, |a, b, c, d| unsafe {
        raw_file_close(a, b, c, d)
    })?;
    Ok(())
}

impl Drop for File {
    fn drop(&mut self) {
        if self.open {
            let _ = close_handle(self.handle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Status;

    #[test]
    fn off_wasm_every_call_is_unsupported() {
        let err = File::open("data", "a.txt", Mode::Read).unwrap_err();
        assert_eq!(err.status(), Status::UNSUPPORTED);
        assert_eq!(File::temp().unwrap_err().status(), Status::UNSUPPORTED);
        let mut f = File::from_handle(7);
        assert_eq!(f.read(10).unwrap_err().status(), Status::UNSUPPORTED);
        assert_eq!(f.write(b"x").unwrap_err().status(), Status::UNSUPPORTED);
        assert_eq!(f.into_handle(), 7);
    }

    #[test]
    fn modes_are_the_abis_text() {
        let all = [Mode::Read, Mode::Write, Mode::ReadWrite, Mode::Append];
        assert_eq!(all.map(Mode::as_str), ["r", "w", "rw", "a"]);
    }
}
