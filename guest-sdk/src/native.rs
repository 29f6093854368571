//! Native plugins (cargo feature `native`): the same guest source built as a host
//! executable that speaks the process runtime's channel instead of exporting
//! `wasihost_alloc` / `wasihost_call`.
//!
//! Under the feature, [`guest!`](crate::guest!) generates `fn main()`, which calls [`main`]:
//! the executable is started by a wasihost host (its launcher applies the operating system's
//! walls: this module applies none), with
//!
//! - file descriptor 0 its end of an `AF_UNIX` `SOCK_STREAM` socketpair, the **channel**;
//! - `argv[1]` the number of a second socket, the **control** socket: each byte the host sends
//!   on it interrupts the command in flight, and its end of file (the host is gone) ends the
//!   process; further arguments `NAME=VALUE` (the rlimits the launcher applied) are ignored;
//! - the environment variable `WASIHOST_CHILD_SECRET`, 32 bytes in hex, which the process
//!   echoes in its HELLO and removes from its environment at once, and optionally
//!   `WASIHOST_CHILD_WALLS`, the walls the launcher checked (a CBOR list of
//!   `[name, state, detail]` text triples, in hex), which the HELLO reports.
//!
//! The conversation is the one `wasihost/core/channel.py` defines (frames of a 4-byte
//! big-endian length and a CBOR array whose first item is the [`kind`]): HELLO; LOAD answered
//! by READY naming the registry entries it was given; START, then CALL after CALL, each
//! answered by DONE or FAIL; CAP_MEMORY and QUERY answered by VALUE. A command runs exactly as
//! `wasihost_call` runs it in a wasm guest (the same dispatch, handshake and response bytes).
//!
//! Host calls go to the host: every safe wrapper ([`log`](crate::log),
//! [`storage`](crate::storage), ..., and [`import!`](crate::import)'s functions) sends HOST
//! with the index of its entry in LOAD's list and waits for HOST_OK, HOST_STATUS or HOST_STOP,
//! so the host's own registry, grants, quotas and brokers serve it, as for a wasm guest in a
//! child. A function the list lacks answers `DENIED`. A native plugin has no guest memory: a
//! broker's MEM request is answered with the fault `gone` (its fuel questions with yes).
//! It counts no fuel (every answer claims 0): the host bounds it by wall time and CPU time.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, BufReader, Read, Write};
use std::os::unix::io::{FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::abi::{Status, ABORT, IMPORT_MODULE};
use crate::cbor::{self, Limits, Value};
use crate::guest::{self, Guest};
use crate::host;

/// The channel protocol's version, sent in HELLO.
pub const PROTOCOL_VERSION: u64 = 1;
/// The environment variable the per-child secret arrives in (hex), removed at start-up.
pub const SECRET_ENV: &str = "WASIHOST_CHILD_SECRET";
/// The environment variable the launcher's checked walls arrive in (hex of a CBOR list of
/// `[name, state, detail]`), removed at start-up; absent, HELLO reports no wall.
pub const WALLS_ENV: &str = "WASIHOST_CHILD_WALLS";
/// Longest frame either end sends (the host's `MAX_FRAME_BYTES`).
pub const MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;
/// Bytes of the per-child secret.
pub const SECRET_BYTES: usize = 32;

/// The message kinds: the first item of every frame (`wasihost.core.channel.Kind`).
pub mod kind {
    /// child -> host: `[HELLO, version, secret, pid, walls]`
    pub const HELLO: u64 = 1;
    /// host -> child: `[LOAD, settings, artifact, entries, limits, command_export]`
    pub const LOAD: u64 = 2;
    /// child -> host: `[READY, [[module, name], ...]]`
    pub const READY: u64 = 3;
    /// host -> child: `[START, fuel, seconds_left, caps]`
    pub const START: u64 = 4;
    /// host -> child: `[CALL, command, payload, max_output, may_keep_gil, fuel, seconds_left, caps]`
    pub const CALL: u64 = 5;
    /// host -> child: a WASI command (a native plugin has none)
    pub const RUN: u64 = 6;
    /// child -> host: `[DONE, status, body, fuel, exit_code, interrupted, tally]`
    pub const DONE: u64 = 7;
    /// child -> host: `[FAIL, class, message, fuel, exit_code, interrupted, tally]`
    pub const FAIL: u64 = 8;
    /// child -> host: `[HOST, index, request, response_cap, null]`
    pub const HOST: u64 = 9;
    /// host -> child: `[HOST_OK, body, answer, charge, moved]`
    pub const HOST_OK: u64 = 10;
    /// host -> child: `[HOST_STATUS, code, charge, moved]`
    pub const HOST_STATUS: u64 = 11;
    /// host -> child: `[HOST_STOP, kind, message, charge, moved]`
    pub const HOST_STOP: u64 = 12;
    /// host -> child: `[MEM, op, args, charge]`
    pub const MEM: u64 = 13;
    /// child -> host: `[MEM_OK, value, moved]`
    pub const MEM_OK: u64 = 14;
    /// child -> host: `[MEM_FAULT, kind, message]`
    pub const MEM_FAULT: u64 = 15;
    /// host -> child: `[CAP_MEMORY, bytes]`
    pub const CAP_MEMORY: u64 = 16;
    /// host -> child: `[QUERY, what]`
    pub const QUERY: u64 = 17;
    /// child -> host: `[VALUE, value]`
    pub const VALUE: u64 = 18;
}

/// The host's frames are trusted (the child runs with the host's code and gets only what it
/// sends), so they are decoded with room for everything a frame may carry.
const FRAME_LIMITS: Limits = Limits {
    max_bytes: MAX_FRAME_BYTES,
    max_depth: cbor::MAX_DEPTH,
    max_items: 1 << 20,
    max_string_bytes: MAX_FRAME_BYTES,
};

/// The most a tally may say of one key (the host refuses larger counts).
const MAX_TALLY: u64 = (1 << 24) - 1;

/// Set by the control socket's thread when the host interrupts: sticky, as an interrupted
/// wasm instance stays interrupted (the host enters it no more).
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// `true` once the host has interrupted this process (the control socket got a byte). A
/// handler that computes for long without host calls may poll it and return early; host
/// calls check it themselves.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// Runs the executable: reads its start-up arguments, says HELLO, serves the host until it
/// closes the channel, then exits. [`guest!`](crate::guest!) generates the `main` that calls
/// it. Started by hand (no control descriptor), it prints a usage line and exits with 2.
pub fn main(guest: &'static Guest) -> ! {
    let secret = take_env_hex(SECRET_ENV);
    let walls = take_env_hex(WALLS_ENV);
    let control = match std::env::args().nth(1).and_then(|a| a.parse::<RawFd>().ok()) {
        Some(fd) if fd > 2 => fd,
        _ => {
            eprintln!(
                "usage: {} CONTROL_FD [NAME=VALUE ...]: a wasihost native plugin ({} {}), started by a \
                 wasihost host with its channel on descriptor 0",
                std::env::args().next().unwrap_or_default(),
                guest.id,
                guest.version,
            );
            std::process::exit(2)
        }
    };
    let code = match serve(guest, secret.unwrap_or_default(), walls, control) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("wasihost native plugin {}: {}", guest.id, e);
            1
        }
    };
    std::process::exit(code)
}

/// The bytes of hex environment variable `name`, which is removed from the environment.
fn take_env_hex(name: &str) -> Option<Vec<u8>> {
    let value = std::env::var_os(name)?;
    std::env::remove_var(name);
    from_hex(value.to_str()?)
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    let text = text.as_bytes();
    if text.len() % 2 != 0 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    text.chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// The walls the launcher reported, if they are a list of text triples; else none.
fn walls_value(raw: Option<Vec<u8>>) -> Value {
    let walls = raw.and_then(|bytes| cbor::decode(&bytes).ok());
    let valid = |w: &Value| {
        w.as_array()
            .map_or(false, |t| t.len() == 3 && t.iter().all(|v| v.as_str().is_some()))
    };
    match walls {
        Some(Value::Array(items)) if items.len() <= 16 && items.iter().all(valid) => Value::Array(items),
        _ => Value::Array(Vec::new()),
    }
}

/// An error on the channel: the process ends (the host sees it gone).
#[derive(Debug)]
pub struct ChannelError(String);

impl fmt::Display for ChannelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<io::Error> for ChannelError {
    fn from(e: io::Error) -> ChannelError {
        ChannelError(format!("channel: {}", e))
    }
}

fn broken(what: impl Into<String>) -> ChannelError {
    ChannelError(what.into())
}

/// The child's end of the channel: frames in and out.
struct Channel {
    reader: BufReader<SpinningStream>,
    writer: UnixStream,
}

/// Attempts of a non-blocking read before a blocking one (about 0.3 µs each). The host
/// answers a host call in a few tens of microseconds; a process asleep in `read` takes about
/// as long again to be woken, so a short spin halves a host call's round trip. The host's
/// reader does the same (wasihost/engine/channel_io.py, SPIN_READS).
const SPIN_READS: u32 = 150;
/// After this many waits in a row that the spin did not catch, stop spinning (an idle
/// process, or a host that answers slowly, costs no CPU), and try again every SPIN_RETRY.
const SPIN_MISSES: u32 = 4;
const SPIN_RETRY: u32 = 16;
/// `MSG_DONTWAIT` (Linux): this read only, whatever the socket's own mode.
const MSG_DONTWAIT: i32 = 0x40;

extern "C" {
    fn recv(fd: i32, buf: *mut u8, len: usize, flags: i32) -> isize;
}

/// The channel's reading end: spins briefly on a non-blocking read before it blocks.
struct SpinningStream {
    stream: UnixStream,
    missed: u32,
}

impl Read for SpinningStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::unix::io::AsRawFd;
        let spin = self.missed < SPIN_MISSES || self.missed % SPIN_RETRY == 0;
        if spin && !buf.is_empty() {
            let fd = self.stream.as_raw_fd();
            for _ in 0..SPIN_READS {
                // SAFETY: `buf` is valid for `buf.len()` bytes; `fd` is this stream's.
                let n = unsafe { recv(fd, buf.as_mut_ptr(), buf.len(), MSG_DONTWAIT) };
                if n >= 0 {
                    self.missed = 0;
                    return Ok(n as usize);
                }
                let error = io::Error::last_os_error();
                if error.kind() != io::ErrorKind::WouldBlock && error.kind() != io::ErrorKind::Interrupted {
                    return Err(error);
                }
                std::hint::spin_loop();
            }
        }
        self.missed = self.missed.saturating_add(1);
        self.stream.read(buf)
    }
}

impl Channel {
    fn send(&mut self, message: Vec<Value>) -> Result<(), ChannelError> {
        let mut frame = vec![0u8; 4];
        cbor::encode_into(&Value::Array(message), &mut frame, &FRAME_LIMITS)
            .map_err(|e| broken(format!("a frame this process cannot encode: {}", e)))?;
        let length = (frame.len() - 4) as u32;
        frame[..4].copy_from_slice(&length.to_be_bytes());
        self.writer.write_all(&frame)?;
        Ok(())
    }

    /// The next message, or `None` at the end of the channel (the host closed it).
    fn receive(&mut self) -> Result<Option<Vec<Value>>, ChannelError> {
        let mut header = [0u8; 4];
        let mut got = 0;
        while got < header.len() {
            match self.reader.read(&mut header[got..]) {
                Ok(0) if got == 0 => return Ok(None),
                Ok(0) => return Err(broken("the channel closed inside a frame header")),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        let length = u32::from_be_bytes(header) as usize;
        if length == 0 || length > MAX_FRAME_BYTES {
            return Err(broken(format!("a frame of {} bytes", length)));
        }
        let mut body = vec![0u8; length];
        self.reader.read_exact(&mut body)?;
        match cbor::decode_with(&body, &FRAME_LIMITS) {
            Ok(Value::Array(items)) if !items.is_empty() && items[0].as_u64().is_some() => Ok(Some(items)),
            Ok(_) => Err(broken("a frame that is not a message")),
            Err(e) => Err(broken(format!("a frame that is not CBOR: {}", e))),
        }
    }
}

/// One registry entry of LOAD, as far as the native runtime needs it.
struct Entry {
    module: String,
    name: String,
    capability: String,
    max_request_bytes: usize,
    max_response_bytes: usize,
    /// The entry commits an effect (`log`): a response buffer smaller than its largest
    /// response is refused before the host runs it, so that the SDK's retry commits once.
    commits: bool,
    native: bool,
    /// What an ungranted native-convention call answers (its `denied_result`, else its
    /// `revoked_result`), if anything.
    denied: Option<i64>,
}

/// Why a host call ended the command: its failure class and message.
#[derive(Clone, Debug)]
struct Stop {
    class: String,
    message: String,
}

/// The payload an `abort` (or a stopped host call) unwinds with, past the panic hook.
struct Unwound;

/// The state of the serving thread.
struct Runtime {
    channel: Channel,
    entries: Vec<Entry>,
    /// A command is running (host calls are allowed), and until when.
    call: Option<Instant>,
    /// The capabilities granted when the running command began (START's and CALL's last
    /// item): the host checks its own grants again at each host call.
    caps: Vec<String>,
    /// A host call ended the command: every later one ends it the same way.
    stopped: Option<Stop>,
    /// An `abort()` or a panic's message.
    aborted: Option<String>,
    /// Negative statuses answered to host calls, and call-ending failures, by class: sent with
    /// each DONE or FAIL for the host's operator metrics, as a wasm child's engine counts them.
    statuses: BTreeMap<i64, u64>,
    failures: BTreeMap<String, u64>,
    /// Capabilities refused to the guest by the check against `caps`: the host records each
    /// as asked for (the tally's `refused:` items), as for a wasm child.
    refused: Vec<String>,
}

thread_local! {
    static RUNTIME: RefCell<Option<Runtime>> = RefCell::new(None);
    static PANIC_MESSAGE: RefCell<Option<String>> = RefCell::new(None);
}

fn serve(guest: &Guest, secret: Vec<u8>, walls: Option<Vec<u8>>, control: RawFd) -> Result<(), ChannelError> {
    // SAFETY: descriptor 0 and `control` are this process's, given by the launcher for this
    // purpose; nothing else in the process uses them. Each is duplicated close-on-exec and the
    // original closed, so that a process this one starts inherits neither.
    let (channel, control) = unsafe {
        let channel = UnixStream::from_raw_fd(0);
        let control = UnixStream::from_raw_fd(control);
        (channel.try_clone()?, control.try_clone()?)
    };
    std::thread::Builder::new()
        .name("wasihost-control".into())
        .spawn(move || watch_control(control))?;
    let writer = channel.try_clone()?;
    let runtime = Runtime {
        channel: Channel {
            reader: BufReader::with_capacity(1 << 16, SpinningStream { stream: channel, missed: 0 }),
            writer,
        },
        entries: Vec::new(),
        call: None,
        caps: Vec::new(),
        stopped: None,
        aborted: None,
        statuses: BTreeMap::new(),
        failures: BTreeMap::new(),
        refused: Vec::new(),
    };
    RUNTIME.with(|r| *r.borrow_mut() = Some(runtime));
    panic::set_hook(Box::new(panic_hook));
    with_runtime(|rt| {
        rt.channel.send(vec![
            Value::from(kind::HELLO),
            Value::from(PROTOCOL_VERSION),
            Value::Bytes(secret),
            Value::from(std::process::id()),
            walls_value(walls),
        ])
    })?;
    let mut loaded = false;
    loop {
        let message = match with_runtime(|rt| rt.channel.receive())? {
            Some(message) => message,
            None => return Ok(()),
        };
        let answer = match message[0].as_u64().unwrap_or(0) {
            kind::LOAD => {
                loaded = true;
                load(&message)?
            }
            kind::START if loaded => {
                with_runtime(|rt| rt.caps = caps_of(&message));
                done(0, Vec::new())
            }
            kind::CALL if loaded => call(guest, &message)?,
            kind::RUN if loaded => fail("host_error", "a native plugin has no WASI command to run".into()),
            kind::START | kind::CALL | kind::RUN => return Err(broken("a call before LOAD")),
            kind::CAP_MEMORY | kind::QUERY => vec![Value::from(kind::VALUE), Value::Null],
            other => return Err(broken(format!("unexpected message kind {}", other))),
        };
        with_runtime(|rt| rt.channel.send(answer))?;
    }
}

fn with_runtime<R>(f: impl FnOnce(&mut Runtime) -> R) -> R {
    RUNTIME.with(|r| f(r.borrow_mut().as_mut().expect("the native runtime is serving")))
}

/// The control socket's thread: a byte interrupts, the end of file ends the process.
fn watch_control(mut control: UnixStream) {
    let mut buf = [0u8; 64];
    loop {
        match control.read(&mut buf) {
            Ok(0) => std::process::exit(0),
            Ok(_) => INTERRUPTED.store(true, Ordering::Relaxed),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => std::process::exit(0),
        }
    }
}

/// LOAD: keep the entries, answer READY with their (module, name) pairs, in order.
fn load(message: &[Value]) -> Result<Vec<Value>, ChannelError> {
    let records = message
        .get(3)
        .and_then(Value::as_array)
        .ok_or_else(|| broken("LOAD without its entries"))?;
    let mut entries = Vec::with_capacity(records.len());
    let mut names = Vec::with_capacity(records.len());
    for record in records {
        let text = |field: &str| record.get(field).and_then(Value::as_str).map(str::to_owned);
        let (module, name) = match (text("module"), text("name")) {
            (Some(module), Some(name)) => (module, name),
            _ => return Err(broken("LOAD: an entry without module and name")),
        };
        let size = |field: &str| record.get(field).and_then(Value::as_u64).map_or(0, |n| n as usize);
        let denied = ["denied_result", "revoked_result"]
            .iter()
            .find_map(|field| record.get(field).and_then(Value::as_i64));
        names.push(Value::Array(vec![Value::from(module.as_str()), Value::from(name.as_str())]));
        entries.push(Entry {
            capability: text("capability").unwrap_or_default(),
            max_request_bytes: size("max_request_bytes"),
            max_response_bytes: size("max_response_bytes"),
            commits: record.get("commits").and_then(Value::as_bool).unwrap_or(false),
            native: text("convention").as_deref() == Some("native"),
            module,
            name,
            denied,
        });
    }
    with_runtime(|rt| rt.entries = entries);
    Ok(vec![Value::from(kind::READY), Value::Array(names)])
}

/// The capabilities a START or CALL grants (its last item).
fn caps_of(message: &[Value]) -> Vec<String> {
    message
        .last()
        .and_then(Value::as_array)
        .map(|caps| caps.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default()
}

fn done(status: u32, body: Vec<u8>) -> Vec<Value> {
    let tally = take_tally();
    vec![
        Value::from(kind::DONE),
        Value::from(status),
        Value::Bytes(body),
        Value::from(0u8),
        Value::Null,
        Value::Bool(false),
        tally,
    ]
}

fn fail(class: &str, message: String) -> Vec<Value> {
    let tally = take_tally();
    // The instance may not be entered again: a command that ended mid-way may have left its
    // state half-changed, as a trapped wasm instance is discarded.
    vec![
        Value::from(kind::FAIL),
        Value::from(class),
        Value::from(message),
        Value::from(0u8),
        Value::Null,
        Value::Bool(true),
        tally,
    ]
}

fn take_tally() -> Value {
    with_runtime(|rt| {
        if rt.statuses.is_empty() && rt.failures.is_empty() && rt.refused.is_empty() {
            return Value::Null;
        }
        let mut flat = Vec::new();
        for (code, n) in std::mem::take(&mut rt.statuses) {
            flat.push(Value::from(code));
            flat.push(Value::from(n.min(MAX_TALLY)));
        }
        for (class, n) in std::mem::take(&mut rt.failures) {
            flat.push(Value::from(class));
            flat.push(Value::from(n.min(MAX_TALLY)));
        }
        for capability in std::mem::take(&mut rt.refused) {
            flat.push(Value::from(format!("refused:{}", capability)));
            flat.push(Value::from(1u8));
        }
        Value::Array(flat)
    })
}

/// CALL: run the command as `wasihost_call` would, answer DONE or FAIL.
fn call(guest: &Guest, message: &[Value]) -> Result<Vec<Value>, ChannelError> {
    let bytes = |i: usize| message.get(i).and_then(Value::as_bytes);
    let (command, payload) = match (bytes(1), bytes(2)) {
        (Some(command), Some(payload)) => (command, payload),
        _ => return Err(broken("CALL without its command and payload")),
    };
    let max_output = message.get(3).and_then(Value::as_u64).unwrap_or(0);
    let seconds = message.get(6).and_then(Value::as_f64).unwrap_or(0.0);
    if interrupted() {
        return Ok(fail("deadline", "interrupted by the host".into()));
    }
    let deadline = Instant::now() + Duration::from_secs_f64(seconds.clamp(0.0, 1e9));
    with_runtime(|rt| {
        rt.call = Some(deadline);
        rt.caps = caps_of(message);
        rt.stopped = None;
        rt.aborted = None;
    });
    PANIC_MESSAGE.with(|m| m.borrow_mut().take());
    let result = panic::catch_unwind(AssertUnwindSafe(|| guest::call_native(guest, command, payload)));
    let (stopped, aborted) = with_runtime(|rt| {
        rt.call = None;
        (rt.stopped.take(), rt.aborted.take())
    });
    // A host call that ended the command ends it, even if the guest caught the unwinding.
    if let Some(stop) = stopped {
        return Ok(fail(&stop.class, stop.message));
    }
    // So does an `abort` (it cannot be caught in a wasm guest either).
    let response = match (result, aborted) {
        (Ok(response), None) => response,
        (result, aborted) => {
            let message = aborted
                .or_else(|| PANIC_MESSAGE.with(|m| m.borrow_mut().take()))
                .unwrap_or_else(|| "panic".to_owned());
            drop(result);
            return report_panic(message);
        }
    };
    let status = u32::from_le_bytes([response[0], response[1], response[2], response[3]]);
    let body = response[4..].to_vec();
    if body.len() as u64 > max_output {
        return Ok(fail(
            "output_too_large",
            format!("the command's output of {} bytes is over its limit", body.len()),
        ));
    }
    Ok(done(status, body))
}

/// A panic (or `abort`): reported through the `abort` host function when LOAD granted it
/// (the host logs it, as for a wasm guest's panic), then FAIL with class `panic`.
fn report_panic(message: String) -> Result<Vec<Value>, ChannelError> {
    let message = host::truncate(&message, crate::ABORT_MAX_MESSAGE_BYTES).to_owned();
    let index = with_runtime(|rt| rt.index(IMPORT_MODULE, ABORT.name));
    with_runtime(|rt| *rt.failures.entry("panic".into()).or_insert(0) += 1);
    let index = match index {
        Some(index) => index,
        None => return Ok(fail("panic", message)),
    };
    let mut request = Vec::with_capacity(message.len() + 3);
    host::push_text(&mut request, &message);
    let answer = with_runtime(|rt| rt.exchange(index, request_args(request, 0)))?;
    Ok(match answer {
        Answer::Stop(kind, said) => {
            let stop = stop_of(&format!("{}.{}", IMPORT_MODULE, ABORT.name), &kind, said);
            fail(&stop.class, stop.message)
        }
        _ => fail("panic", message),
    })
}

fn request_args(request: Vec<u8>, cap: usize) -> Vec<Value> {
    vec![Value::Bytes(request), Value::from(cap), Value::Null]
}

/// Records the message of a panic on the serving thread, for its FAIL (the message format of
/// the wasm SDK's hook: the payload, then the location).
fn panic_hook(info: &panic::PanicInfo<'_>) {
    let payload = info.payload();
    let what: &str = if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "panic"
    };
    let message = match info.location() {
        Some(at) => format!("{} (at {}:{}:{})", what, at.file(), at.line(), at.column()),
        None => what.to_owned(),
    };
    PANIC_MESSAGE.with(|m| *m.borrow_mut() = Some(message));
}

/// The native body of [`abort`](crate::abort): the command ends with class `panic` and
/// `message`, through the same path as a panic (without the panic hook).
pub(crate) fn abort(message: &str) -> ! {
    let message = message.to_owned();
    let serving = RUNTIME.with(|r| {
        r.try_borrow_mut()
            .ok()
            .and_then(|mut r| r.as_mut().map(|rt| rt.aborted = Some(message.clone())))
            .is_some()
    });
    if !serving {
        eprintln!("abort: {}", message);
        std::process::exit(101);
    }
    panic::resume_unwind(Box::new(Unwound))
}

/// A host call's answer, as the host gave it.
enum Answer {
    /// HOST_OK: the response body, or the status the host answered instead.
    Ok(Vec<u8>, Option<i64>),
    /// HOST_STATUS: the code.
    Status(i64),
    /// HOST_STOP: its kind and message.
    Stop(String, String),
}

impl Runtime {
    fn index(&self, module: &str, name: &str) -> Option<usize> {
        self.entries.iter().position(|e| e.module == module && e.name == name)
    }

    /// Sends HOST for entry `index` with `args` and serves the host's MEM requests until
    /// its answer.
    fn exchange(&mut self, index: usize, args: Vec<Value>) -> Result<Answer, ChannelError> {
        let mut message = Vec::with_capacity(2 + args.len());
        message.push(Value::from(kind::HOST));
        message.push(Value::from(index));
        message.extend(args);
        self.channel.send(message)?;
        loop {
            let message = match self.channel.receive()? {
                Some(message) => message,
                None => std::process::exit(0), // the host is gone
            };
            let item = |i: usize| message.get(i).cloned().unwrap_or(Value::Null);
            match message[0].as_u64().unwrap_or(0) {
                kind::MEM => {
                    let answer = match item(1).as_str() {
                        Some("can_pay") => vec![Value::from(kind::MEM_OK), Value::Bool(true), Value::from(0u8)],
                        Some("charge") => vec![Value::from(kind::MEM_OK), Value::Null, Value::from(0u8)],
                        _ => vec![
                            Value::from(kind::MEM_FAULT),
                            Value::from("gone"),
                            Value::from("a native plugin has no guest memory"),
                        ],
                    };
                    self.channel.send(answer)?;
                }
                kind::HOST_OK => {
                    let body = match item(1) {
                        Value::Bytes(body) => body,
                        _ => return Err(broken("HOST_OK without its body")),
                    };
                    return Ok(Answer::Ok(body, item(2).as_i64()));
                }
                kind::HOST_STATUS => return Ok(Answer::Status(item(1).as_i64().unwrap_or(-1))),
                kind::HOST_STOP => {
                    let text = |v: Value| v.as_str().unwrap_or("").to_owned();
                    return Ok(Answer::Stop(text(item(1)), text(item(2))));
                }
                other => return Err(broken(format!("unexpected message kind {} in a host call", other))),
            }
        }
    }

    /// The check a wasm child's engine makes before a host call (process_child's gate): the
    /// entry's capability among those the command began with. A refusal is recorded for the
    /// host, which records it as asked for.
    fn granted(&mut self, index: usize) -> bool {
        let capability = &self.entries[index].capability;
        if capability == "core" || self.caps.iter().any(|c| c == capability) {
            return true;
        }
        if !self.refused.contains(capability) {
            self.refused.push(capability.clone());
        }
        false
    }

    fn count_status(&mut self, code: u32) {
        if Status::from_code(code).is_known() && code != 0 {
            *self.statuses.entry(-(code as i64)).or_insert(0) += 1;
        }
    }
}

/// The failure a HOST_STOP of `kind` ends the command with, as the engine ends a wasm guest's
/// call for it in-process (`hostcalls._stopped_by_handler`, `native.end_call`).
fn stop_of(qualified: &str, kind: &str, message: String) -> Stop {
    let (class, message) = match kind {
        "abort" => ("panic", message),
        "out_of_fuel" => ("out_of_fuel", format!("{}: out of fuel", qualified)),
        "deadline" => ("deadline", format!("{}: deadline reached", qualified)),
        "interrupted" => ("deadline", format!("{}: interrupted by the host", qualified)),
        "denied" => ("denied", format!("{}: denied", qualified)),
        "fault" => ("protocol", format!("{}: {}", qualified, message)),
        _ => ("host_error", format!("host function failed: {}", message)),
    };
    Stop {
        class: class.to_owned(),
        message,
    }
}

/// Counts a status a host call answered the guest, for the tally (nothing off the serving
/// thread, where no host call is made).
fn tally_status(status: Status) {
    RUNTIME.with(|r| {
        if let Ok(mut r) = r.try_borrow_mut() {
            if let Some(rt) = r.as_mut() {
                rt.count_status(status.code());
            }
        }
    });
}

/// What a host call comes to: an answer for the guest, or the end of its command.
enum Outcome<T> {
    Answer(T),
    Stop(Stop),
}

/// Ends the running command with `stop` (unless one already ended it): the guest's frames
/// unwind to the runtime, which answers FAIL.
fn end_command(stop: Stop) -> ! {
    with_runtime(|rt| {
        *rt.failures.entry(stop.class.clone()).or_insert(0) += 1;
        if rt.stopped.is_none() {
            rt.stopped = Some(stop);
        }
    });
    panic::resume_unwind(Box::new(Unwound))
}

/// Checks before a host call of `module.name`: the entry's index, or the status it answers
/// (`DENIED` when LOAD did not list it; `UNSUPPORTED` outside a command); or the stop that
/// ends the command (an earlier stop, an interrupt, the deadline).
fn prepare(module: &str, name: &str) -> Outcome<Result<usize, Status>> {
    let qualified = || format!("{}.{}", module, name);
    let ready = RUNTIME.with(|r| {
        let mut r = r.try_borrow_mut().ok()?;
        let rt = r.as_mut()?;
        let deadline = rt.call?;
        Some(if let Some(stop) = rt.stopped.clone() {
            Outcome::Stop(stop)
        } else if interrupted() {
            Outcome::Stop(stop_of(&qualified(), "interrupted", String::new()))
        } else if Instant::now() >= deadline {
            Outcome::Stop(stop_of(&qualified(), "deadline", String::new()))
        } else {
            match rt.index(module, name) {
                Some(index) if rt.granted(index) => Outcome::Answer(Ok(index)),
                _ => Outcome::Answer(Err(Status::DENIED)),
            }
        })
    });
    // Off the serving thread, or between commands, no host call can be made.
    ready.unwrap_or(Outcome::Answer(Err(Status::UNSUPPORTED)))
}

/// One cbor-convention host call of `module.name` with `request`, offering `cap` bytes of
/// response: the response, or the status the call answers (the raw import's `-status`).
/// A HOST_STOP ends the command.
pub(crate) fn host_call(module: &str, name: &str, request: &[u8], cap: usize) -> Result<Vec<u8>, Status> {
    let index = match prepare(module, name) {
        Outcome::Answer(Ok(index)) => index,
        Outcome::Answer(Err(status)) => {
            tally_status(status);
            return Err(status);
        }
        Outcome::Stop(stop) => end_command(stop),
    };
    // The entry's own bounds, as a wasm child's engine checks them before the host sees the
    // call (the host ends a child whose request is over its entry's limit).
    let refused = with_runtime(|rt| {
        let entry = &rt.entries[index];
        let status = if request.len() > entry.max_request_bytes {
            Some(Status::PAYLOAD_TOO_LARGE)
        } else if entry.commits && cap < entry.max_response_bytes {
            Some(Status::BUFFER_TOO_SMALL)
        } else {
            None
        };
        if let Some(status) = status {
            rt.count_status(status.code());
        }
        status
    });
    if let Some(status) = refused {
        return Err(status);
    }
    let answer = with_runtime(|rt| rt.exchange(index, request_args(request.to_vec(), cap)));
    let outcome = match answer {
        Err(e) => channel_failed(e),
        Ok(Answer::Ok(body, None)) if body.len() <= cap => Outcome::Answer(Ok(body)),
        Ok(Answer::Ok(_, None)) => Outcome::Answer(Err(Status::BUFFER_TOO_SMALL)),
        Ok(Answer::Ok(_, Some(0))) => Outcome::Answer(Ok(Vec::new())),
        Ok(Answer::Ok(_, Some(code))) | Ok(Answer::Status(code)) if code > 0 && code <= u32::MAX as i64 => {
            Outcome::Answer(Err(Status::from_code(code as u32)))
        }
        Ok(Answer::Ok(_, Some(code))) | Ok(Answer::Status(code)) => Outcome::Stop(Stop {
            class: "host_error".into(),
            message: format!("{}.{} raised HostStatus({}), not a failure status", module, name, code),
        }),
        Ok(Answer::Stop(kind, message)) => Outcome::Stop(stop_of(&format!("{}.{}", module, name), &kind, message)),
    };
    match outcome {
        Outcome::Answer(Err(status)) => {
            tally_status(status);
            Err(status)
        }
        Outcome::Answer(Ok(body)) => Ok(body),
        Outcome::Stop(stop) => end_command(stop),
    }
}

/// One native-convention host call (an application's integer function, declared with
/// [`import!`](crate::import)): the integer it answers. Refused (not listed in LOAD, or not
/// granted), it answers the entry's denied result, or ends the command with class `denied`;
/// a status the host answers ends it too (such a function has no status slot).
pub fn call_native_import(module: &str, name: &str, args: &[i64]) -> i64 {
    let qualified = format!("{}.{}", module, name);
    let denied_stop = || Stop {
        class: "denied".into(),
        message: format!("{}: not granted", qualified),
    };
    let index = match prepare(module, name) {
        Outcome::Answer(Ok(index)) => index,
        Outcome::Answer(Err(Status::DENIED)) => {
            // Listed but not granted: the entry's denied result, as the engine answers it.
            let denied = with_runtime(|rt| {
                let found = rt.index(module, name).and_then(|i| rt.entries[i].denied);
                if found.is_some() {
                    rt.count_status(Status::DENIED.code());
                }
                found
            });
            match denied {
                Some(value) => return value,
                None => end_command(denied_stop()),
            }
        }
        Outcome::Answer(Err(status)) => end_command(Stop {
            class: "host_error".into(),
            message: format!("{}: {:?} outside a command", qualified, status),
        }),
        Outcome::Stop(stop) => end_command(stop),
    };
    let (native, denied) = with_runtime(|rt| (rt.entries[index].native, rt.entries[index].denied));
    if !native {
        end_command(Stop {
            class: "host_error".into(),
            message: format!("{} is not a native-convention function", qualified),
        });
    }
    let args = args.iter().map(|&a| Value::from(a)).collect();
    let answer = with_runtime(|rt| rt.exchange(index, args));
    let outcome = match answer {
        Err(e) => channel_failed(e),
        Ok(Answer::Ok(body, None)) => match cbor::decode_with(&body, &FRAME_LIMITS) {
            Ok(Value::Int(n)) => Outcome::Answer(n as i64),
            Ok(Value::Float(f)) => Outcome::Answer(f as i64),
            Ok(Value::Null) => Outcome::Answer(0),
            _ => Outcome::Stop(Stop {
                class: "host_error".into(),
                message: format!("{} answered no integer", qualified),
            }),
        },
        Ok(Answer::Stop(kind, _)) if kind == "denied" => match denied {
            Some(value) => {
                with_runtime(|rt| rt.count_status(Status::DENIED.code()));
                Outcome::Answer(value)
            }
            None => Outcome::Stop(denied_stop()),
        },
        Ok(Answer::Stop(kind, message)) => Outcome::Stop(stop_of(&qualified, &kind, message)),
        Ok(Answer::Status(code)) | Ok(Answer::Ok(_, Some(code))) => Outcome::Stop(if code == Status::DENIED.code() as i64 {
            Stop {
                class: "denied".into(),
                message: format!("{}: denied", qualified),
            }
        } else {
            Stop {
                class: "host_error".into(),
                message: format!("{} answered status {}; a native function has no status slot", qualified, code),
            }
        }),
    };
    match outcome {
        Outcome::Answer(value) => value,
        Outcome::Stop(stop) => end_command(stop),
    }
}

/// The channel broke in the middle of a host call: the host is gone or broke the protocol,
/// and nothing can be answered: the process ends.
fn channel_failed<T>(e: ChannelError) -> T {
    eprintln!("wasihost native plugin: {}", e);
    std::process::exit(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        assert_eq!(from_hex("00ff10"), Some(vec![0, 255, 16]));
        assert_eq!(from_hex("0"), None);
        assert_eq!(from_hex("zz"), None);
    }

    #[test]
    fn walls_must_be_text_triples() {
        let good = cbor::encode(&Value::array([Value::array(["seccomp", "enforced", "x"])])).unwrap();
        assert_eq!(walls_value(Some(good.clone())), cbor::decode(&good).unwrap());
        let bad = cbor::encode(&Value::array([Value::array(["seccomp", "enforced"])])).unwrap();
        assert_eq!(walls_value(Some(bad)), Value::Array(Vec::new()));
        assert_eq!(walls_value(None), Value::Array(Vec::new()));
    }

    #[test]
    fn stops_map_to_the_engines_classes() {
        assert_eq!(stop_of("m.f", "abort", "boom".into()).class, "panic");
        assert_eq!(stop_of("m.f", "interrupted", String::new()).class, "deadline");
        assert_eq!(stop_of("m.f", "out_of_fuel", String::new()).class, "out_of_fuel");
        assert_eq!(stop_of("m.f", "error", "KeyError".into()).message, "host function failed: KeyError");
    }

    #[test]
    fn outside_a_command_host_calls_are_unsupported() {
        assert_eq!(host_call("wasihost_v1", "log", b"\xf6", 1), Err(Status::UNSUPPORTED));
    }
}
