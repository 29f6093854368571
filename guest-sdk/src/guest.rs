//! The guest side of a call: the exports, command dispatch, the handshake, and ownership of
//! the blocks that cross the boundary.
//!
//! You normally use this module only through [`guest!`](crate::guest!), which generates the
//! `wasihost_alloc` and `wasihost_call` exports and the `wasihost_abi` marker. Handlers can
//! ask what start-up granted with [`welcome`] and [`is_granted`].
//!
//! # Ownership (ABI section 5)
//!
//! - `wasihost_alloc(size)` allocates a block and remembers it; the host writes the command
//!   name and the CBOR input into it and passes it to `wasihost_call`, which frees it as soon
//!   as the name and input are decoded (before the handler runs). A pointer that is not an
//!   outstanding block is answered with an error response of class `protocol`.
//! - The response block `wasihost_call` returns stays valid until the guest's next
//!   `wasihost_call`, which frees it first thing.

use std::alloc::Layout;
use std::cell::RefCell;

use crate::abi::{Error, Result, Status};
use crate::cbor::{self, Limits, Value};
use crate::host::{push_text, truncate};

/// A command handler: the decoded input in, the output value or an error out.
pub type Handler = fn(Value) -> Result<Value>;

/// A raw byte command's handler (ABI 1.1): the input bytes as the caller passed them in, the
/// output bytes out (no CBOR either way), or an error (sent, as for every command, as the
/// CBOR error map). Its manifest entry says `input = "bytes", output = "bytes"`.
pub type BytesHandler = fn(&[u8]) -> Result<Vec<u8>>;

/// Decides the answer to `wasihost.welcome` (see [`guest!`](crate::guest!)'s `welcome:`).
pub type WelcomeHook = fn(&Welcome) -> Readiness;

/// One command of the dispatch table.
#[derive(Clone, Copy)]
pub struct Command {
    /// Name the host calls it by: `[a-z][a-z0-9_-]{0,63}`.
    pub name: &'static str,
    /// The function that runs it.
    pub handler: Handler,
}

/// One raw byte command of the dispatch table (ABI 1.1).
#[derive(Clone, Copy)]
pub struct BytesCommand {
    /// Name the host calls it by: `[a-z][a-z0-9_-]{0,63}`.
    pub name: &'static str,
    /// The function that runs it.
    pub handler: BytesHandler,
}

/// Everything the SDK needs to answer calls; [`guest!`](crate::guest!) builds it.
#[derive(Clone, Copy)]
pub struct Guest {
    /// Extension id, as in the manifest.
    pub id: &'static str,
    /// Extension version, as in the manifest.
    pub version: &'static str,
    /// The ABI version the guest was built against (its marker; sent in `wasihost.hello`).
    pub abi: &'static str,
    /// Capabilities the guest asks for (sent in the `wasihost.hello` answer).
    pub features: &'static [&'static str],
    /// The commands.
    pub commands: &'static [Command],
    /// The raw byte commands (ABI 1.1; empty for a 1.0 guest).
    pub bytes_commands: &'static [BytesCommand],
    /// Optional custom answer to `wasihost.welcome`.
    pub welcome: Option<WelcomeHook>,
}

/// What the host said in `wasihost.welcome`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Welcome {
    /// Identifies this instance of the extension.
    pub runtime_id: [u8; 16],
    /// The capabilities actually granted.
    pub granted: Vec<String>,
    /// The host's epoch counter at start-up.
    pub epoch: u64,
}

impl Welcome {
    /// `true` if capability `name` was granted.
    pub fn is_granted(&self, name: &str) -> bool {
        self.granted.iter().any(|g| g == name)
    }
}

/// The answer to `wasihost.welcome`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Fully working.
    Ready,
    /// Working with reduced function; the reason is reported to the embedder.
    Degraded(String),
    /// Cannot work: start-up fails with class `handshake`.
    Failed(String),
}

impl Readiness {
    /// The default: `Ready` if every feature was granted, otherwise `Degraded` naming the
    /// missing ones (an optional capability the host withheld).
    pub fn from_grant(features: &[&str], welcome: &Welcome) -> Readiness {
        let missing: Vec<&str> = features
            .iter()
            .copied()
            .filter(|f| !welcome.is_granted(f))
            .collect();
        if missing.is_empty() {
            Readiness::Ready
        } else {
            Readiness::Degraded(format!("not granted: {}", missing.join(", ")))
        }
    }

    fn to_value(&self) -> Value {
        let (status, reason) = match self {
            Readiness::Ready => ("ready", None),
            Readiness::Degraded(r) => ("degraded", Some(r)),
            Readiness::Failed(r) => ("failed", Some(r)),
        };
        let mut v = Value::map([("status", Value::from(status))]);
        if let Some(r) = reason {
            v.insert("reason", Value::from(truncate(r, 1024)));
        }
        v
    }
}

struct State {
    /// Blocks handed out by `wasihost_alloc` and not yet consumed: (address, size).
    blocks: Vec<(usize, usize)>,
    /// The last response, kept alive until the next `wasihost_call`.
    response: Vec<u8>,
    welcome: Option<Welcome>,
    hook_installed: bool,
}

thread_local! {
    static STATE: RefCell<State> = const {
        RefCell::new(State {
            blocks: Vec::new(),
            response: Vec::new(),
            welcome: None,
            hook_installed: false,
        })
    };
}

fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> R {
    STATE.with(|s| f(&mut s.borrow_mut()))
}

/// The welcome the host sent at start-up (`None` before it, e.g. during `wasihost.hello`).
pub fn welcome() -> Option<Welcome> {
    with_state(|s| s.welcome.clone())
}

/// `true` if the host granted capability `name` at start-up.
pub fn is_granted(name: &str) -> bool {
    with_state(|s| s.welcome.as_ref().map_or(false, |w| w.is_granted(name)))
}

/// Body of the `wasihost_alloc` export: a block of `size` bytes, or 0.
pub fn alloc(size: i32) -> i32 {
    install_panic_hook();
    let size = (size as u32 as usize).max(1);
    let layout = match Layout::from_size_align(size, 1) {
        Ok(layout) => layout,
        Err(_) => return 0,
    };
    // Reserve the bookkeeping first so that a successful allocation is never lost.
    if with_state(|s| s.blocks.try_reserve(1)).is_err() {
        return 0;
    }
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc(layout) };
    if ptr.is_null() {
        return 0;
    }
    with_state(|s| s.blocks.push((ptr as usize, size)));
    ptr as usize as i32
}

fn free_block(ptr: usize, size: usize) {
    // SAFETY: (ptr, size) came from `alloc` with this layout and is removed from the list
    // before this call, so it is freed once.
    unsafe { std::alloc::dealloc(ptr as *mut u8, Layout::from_size_align_unchecked(size, 1)) }
}

/// What a call names, resolved before the input block is freed.
enum Target {
    Hello,
    Welcome,
    User(Handler),
    Bytes(BytesHandler),
    Unknown(String),
}

/// A command's answer: a value to encode, or a raw byte command's bytes.
enum Output {
    Value(Value),
    Bytes(Vec<u8>),
}

/// Body of the `wasihost_call` export.
pub fn call(guest: &Guest, ptr: i32, cmd_len: i32, in_len: i32) -> i64 {
    install_panic_hook();
    // The previous response was valid until this entry.
    with_state(|s| s.response = Vec::new());
    let response = respond(run(
        guest,
        ptr as u32 as usize,
        cmd_len as u32 as usize,
        in_len as u32 as usize,
    ));
    let addr = response.as_ptr() as usize as u64;
    let len = response.len() as u64;
    with_state(|s| s.response = response);
    ((addr << 32) | len) as i64
}

fn run(guest: &Guest, ptr: usize, cmd_len: usize, in_len: usize) -> Result<Output> {
    let size = with_state(|s| {
        let i = s.blocks.iter().position(|&(p, _)| p == ptr)?;
        Some(s.blocks.swap_remove(i).1)
    });
    let size = match size {
        Some(size) => size,
        None => return Err(protocol("wasihost_call: pointer is not a block from wasihost_alloc")),
    };
    let total = cmd_len.checked_add(in_len).filter(|&t| t <= size);
    let decoded = total.map(|total| {
        // SAFETY: the block is `size >= total` bytes, written by the host, owned by us now.
        let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, total) };
        let (name, input) = bytes.split_at(cmd_len);
        let target = resolve(guest, name);
        // A raw byte command reads its input in place, so the block outlives its handler.
        if let Target::Bytes(handler) = target {
            return Err(handler(input));
        }
        let input = if input.is_empty() {
            Ok(Value::Null)
        } else {
            cbor::decode_with(input, &Limits::COMMAND)
        };
        Ok((target, input))
    });
    free_block(ptr, size);
    let decoded = match decoded {
        Some(Err(raw)) => return raw.map(Output::Bytes),
        Some(Ok(d)) => Some(d),
        None => None,
    };
    let (target, input) = match decoded {
        Some(d) => d,
        None => return Err(protocol("wasihost_call: lengths exceed the block")),
    };
    match target {
        Target::Unknown(name) => Err(Error::new(
            "unknown_command",
            format!("no command named \"{}\"", truncate(&name, 255)),
        )
        .with_status(Status::NOT_FOUND)),
        Target::Hello => Ok(Output::Value(hello(guest))),
        Target::Welcome => Ok(Output::Value(handle_welcome(guest, input.ok()).to_value())),
        Target::User(handler) => handler(input?).map(Output::Value),
        Target::Bytes(_) => unreachable!("raw byte commands return before the block is freed"),
    }
}

fn resolve(guest: &Guest, name: &[u8]) -> Target {
    let name = match std::str::from_utf8(name) {
        Ok(name) => name,
        Err(_) => return Target::Unknown(String::from("<not UTF-8>")),
    };
    match name {
        "wasihost.hello" => Target::Hello,
        "wasihost.welcome" => Target::Welcome,
        // Reserved names never reach user commands (the macro refuses them anyway).
        _ if name.starts_with("wasihost.") => Target::Unknown(name.to_owned()),
        _ => match guest.commands.iter().find(|c| c.name == name) {
            Some(c) => Target::User(c.handler),
            None => match guest.bytes_commands.iter().find(|c| c.name == name) {
                Some(c) => Target::Bytes(c.handler),
                None => Target::Unknown(name.to_owned()),
            },
        },
    }
}

fn protocol(message: &'static str) -> Error {
    Error::new("protocol", message)
}

fn hello(guest: &Guest) -> Value {
    Value::map([
        ("id", Value::from(guest.id)),
        ("version", Value::from(guest.version)),
        ("abi", Value::from(guest.abi)),
        ("features", Value::array(guest.features.iter().copied())),
    ])
}

fn parse_welcome(input: &Value) -> std::result::Result<Welcome, &'static str> {
    let runtime_id = input
        .get("runtime_id")
        .and_then(Value::as_bytes)
        .and_then(|b| <[u8; 16]>::try_from(b).ok())
        .ok_or("runtime_id is not 16 bytes")?;
    let granted = input
        .get("granted")
        .and_then(Value::as_array)
        .ok_or("granted is not an array")?
        .iter()
        .map(|g| g.as_str().map(str::to_owned))
        .collect::<Option<Vec<String>>>()
        .ok_or("granted holds a non-text item")?;
    let epoch = input
        .get("epoch")
        .and_then(Value::as_u64)
        .ok_or("epoch is not a uint")?;
    Ok(Welcome {
        runtime_id,
        granted,
        epoch,
    })
}

fn handle_welcome(guest: &Guest, input: Option<Value>) -> Readiness {
    let welcome = match input.as_ref().ok_or("input is not valid CBOR").and_then(parse_welcome) {
        Ok(w) => w,
        Err(why) => return Readiness::Failed(format!("malformed wasihost.welcome: {}", why)),
    };
    with_state(|s| s.welcome = Some(welcome.clone()));
    match guest.welcome {
        Some(hook) => hook(&welcome),
        None => Readiness::from_grant(guest.features, &welcome),
    }
}

/// Longest error class and message the SDK sends (longer ones are truncated).
const MAX_CLASS_BYTES: usize = 64;
const MAX_MESSAGE_BYTES: usize = 1024;

fn respond(result: Result<Output>) -> Vec<u8> {
    match result {
        Ok(Output::Value(value)) => {
            let mut out = vec![0u8; 4];
            match cbor::encode_into(&value, &mut out, &Limits::COMMAND) {
                Ok(()) => out,
                Err(e) => error_response(&Error::new("invalid_output", e.to_string())),
            }
        }
        Ok(Output::Bytes(body)) => {
            // Status OK (0) and the body after it: the response block's layout (ABI section 5).
            let mut out = Vec::new();
            if out.try_reserve_exact(4 + body.len()).is_err() {
                return error_response(&Error::new("invalid_output", "no memory for the output"));
            }
            out.extend_from_slice(&[0u8; 4]);
            append_bytes(&mut out, &body);
            out
        }
        Err(e) => error_response(&e),
    }
}

/// `bytes` copied into a new vector in one bulk copy: the way for a raw byte command to turn
/// (part of) its input into output.
///
/// Built with `-C target-feature=+bulk-memory` (as `fixtures/build` does), the copy is one
/// `memory.copy`, at memory speed, where `<[u8]>::to_vec` may call the standard library's
/// precompiled `memcpy`, a loop in wasm. Either costs fuel by the byte: wasmtime charges a
/// `memory.copy` one fuel a byte (measured on wasmtime 50).
pub fn to_bytes(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    append_bytes(&mut out, bytes);
    out
}

/// Appends `bytes` to `out` in one bulk copy (see [`to_bytes`]).
pub fn append_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.reserve(bytes.len());
    let len = out.len();
    // SAFETY: `reserve` made room for `bytes.len()` more bytes after `len`; `bytes` is a
    // distinct borrow, so the ranges do not overlap; all of them are initialised by the copy.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr().add(len), bytes.len());
        out.set_len(len + bytes.len());
    }
}

fn error_response(e: &Error) -> Vec<u8> {
    let status = if e.status().is_ok() {
        Status::INTERNAL
    } else {
        e.status()
    };
    let class = truncate(e.class(), MAX_CLASS_BYTES);
    let message = truncate(e.message(), MAX_MESSAGE_BYTES);
    let mut out = Vec::with_capacity(4 + 20 + class.len() + message.len());
    out.extend_from_slice(&status.code().to_le_bytes());
    out.push(0xa2); // map of 2
    push_text(&mut out, "class");
    push_text(&mut out, class);
    push_text(&mut out, "message");
    push_text(&mut out, message);
    out
}

fn install_panic_hook() {
    let first = with_state(|s| !std::mem::replace(&mut s.hook_installed, true));
    if first {
        std::panic::set_hook(Box::new(panic_hook));
    }
}

/// Reports a panic to the host through `abort` (capability `core`, always granted): the
/// call fails with class `panic` and the message lands in the extension's log.
fn panic_hook(info: &std::panic::PanicInfo<'_>) {
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
    super::abort(&message)
}

/// Compile-time checks of a [`guest!`](crate::guest!) invocation (a `const fn`, so mistakes
/// are build errors): id and version non-empty; command names `[a-z][a-z0-9_-]{0,63}` and
/// distinct; features `[a-z][a-z0-9_.-]*` (dotted, as `wasi.stdio` or an application's
/// `myapp.read`), distinct, and not `core` (which is implicit).
pub const fn check_guest(id: &str, version: &str, features: &[&str], commands: &[&str]) {
    if id.is_empty() {
        panic!("guest!: id must not be empty");
    }
    if version.is_empty() {
        panic!("guest!: version must not be empty");
    }
    let mut i = 0;
    while i < commands.len() {
        let name = commands[i].as_bytes();
        if name.len() > 64 || !is_name(name) {
            panic!("guest!: command names must match [a-z][a-z0-9_-]{{0,63}}");
        }
        if appears_before(commands, i) {
            panic!("guest!: duplicate command name");
        }
        i += 1;
    }
    let mut i = 0;
    while i < features.len() {
        let name = features[i].as_bytes();
        if !is_capability(name) {
            panic!("guest!: capability names must match [a-z][a-z0-9_.-]*");
        }
        if bytes_eq(name, b"core") {
            panic!("guest!: capability core is implicit; do not list it in features");
        }
        if appears_before(features, i) {
            panic!("guest!: duplicate feature");
        }
        i += 1;
    }
}

/// Raw byte commands are an ABI 1.1 addition: a guest that has any must say `abi: "1.1"` (or
/// later), so that its marker, and so its manifest's `abi`, allow `input = "bytes"`.
pub const fn check_bytes_abi(abi: &str, bytes_commands: &[&str]) {
    if !bytes_commands.is_empty() && bytes_eq(abi.as_bytes(), b"1.0") {
        panic!("guest!: bytes_commands need abi: \"1.1\"");
    }
}

const fn is_name(b: &[u8]) -> bool {
    if b.is_empty() || !b[0].is_ascii_lowercase() {
        return false;
    }
    let mut j = 1;
    while j < b.len() {
        let c = b[j];
        if !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-') {
            return false;
        }
        j += 1;
    }
    true
}

const fn is_capability(b: &[u8]) -> bool {
    if b.is_empty() || !b[0].is_ascii_lowercase() {
        return false;
    }
    let mut j = 1;
    while j < b.len() {
        let c = b[j];
        if !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-' || c == b'.') {
            return false;
        }
        j += 1;
    }
    true
}

const fn appears_before(names: &[&str], i: usize) -> bool {
    let mut k = 0;
    while k < i {
        if bytes_eq(names[k].as_bytes(), names[i].as_bytes()) {
            return true;
        }
        k += 1;
    }
    false
}

pub(crate) const fn bytes_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Declares a guest: the `wasihost_abi` marker, the `wasihost_alloc` / `wasihost_call`
/// exports, the handshake answers and the command table.
///
/// ```ignore
/// use wasihost_guest::{Error, Value};
///
/// wasihost_guest::guest! {
///     id: "org.example.hello",
///     version: "0.1.0",
///     features: ["log"],
///     commands: {
///         "greet" => greet,
///     }
/// }
///
/// fn greet(input: Value) -> Result<Value, Error> {
///     let name = input.get("name").and_then(Value::as_str)
///         .ok_or_else(|| Error::invalid_input("name must be text"))?;
///     Ok(Value::map([("greeting", Value::from(format!("hello, {}", name)))]))
/// }
/// ```
///
/// Fields, in this order:
///
/// - `id`, `version`: `&'static str` expressions, reported in `wasihost.hello`;
/// - `abi: "1.1",` (optional): the ABI minor the guest is built against, a string literal
///   among [`SUPPORTED_ABI_VERSIONS`](crate::abi::SUPPORTED_ABI_VERSIONS); by default
///   [`ABI_VERSION`](crate::abi::ABI_VERSION) (1.0). A guest that imports a 1.1 function (the
///   storage, secrets, http, files and events modules) must say `abi: "1.1"`, or the host
///   refuses it at admission, naming the import;
/// - `features: [..]`: the capabilities the guest asks for (the manifest's required and
///   optional ones; never `core`);
/// - `welcome: <fn(&Welcome) -> Readiness>,` (optional): decides the `wasihost.welcome`
///   answer; by default [`Readiness::from_grant`] (ready if every feature was granted,
///   degraded otherwise);
/// - `commands: { "name" => handler, .. }`: each handler is a
///   `fn(Value) -> Result<Value, Error>` (a function path or a non-capturing closure);
/// - `bytes_commands: { "name" => handler, .. }` (optional, ABI 1.1, so with `abi: "1.1"`):
///   raw byte commands, each a [`BytesHandler`] `fn(&[u8]) -> Result<Vec<u8>, Error>` that
///   gets the caller's bytes as they are and returns the output bytes, with no CBOR. The
///   manifest decides what crosses: list each as `name = { input = "bytes", output = "bytes" }`
///   under `[commands]`. Names share one space with `commands`.
///
/// ```ignore
/// wasihost_guest::guest! {
///     id: "org.example.blob",
///     version: "0.1.0",
///     abi: "1.1",
///     features: [],
///     commands: {},
///     bytes_commands: {
///         "reverse" => |input| Ok(input.iter().rev().copied().collect()),
///     }
/// }
/// ```
///
/// Invoke it once, at the crate root of a `cdylib`. Names are checked at compile time. With the
/// SDK's `native` feature it generates `fn main` instead of the exports (invoke it at the root
/// of a binary): see [`native`](crate::native) and the README's "Native plugins".
#[macro_export]
macro_rules! guest {
    (
        id: $id:expr,
        version: $version:expr,
        $(abi: $abi:literal,)?
        features: [$($feature:expr),* $(,)?],
        $(welcome: $welcome:expr,)?
        commands: { $($name:literal => $handler:expr),* $(,)? }
        $(, bytes_commands: { $($bname:literal => $bhandler:expr),* $(,)? })? $(,)?
    ) => {
        $crate::abi_marker!($($abi)?);

        const _: () = $crate::guest::check_guest(
            $id,
            $version,
            &[$($feature),*],
            &[$($name,)* $($($bname,)*)?],
        );
        const _: () = $crate::guest::check_bytes_abi(
            $crate::__wasihost_abi_version!($($abi)?),
            &[$($($bname),*)?],
        );

        #[doc(hidden)]
        static __WASIHOST_GUEST: $crate::guest::Guest = $crate::guest::Guest {
            id: $id,
            version: $version,
            abi: $crate::__wasihost_abi_version!($($abi)?),
            features: &[$($feature),*],
            commands: &[$($crate::guest::Command { name: $name, handler: $handler }),*],
            bytes_commands: &[$($($crate::guest::BytesCommand { name: $bname, handler: $bhandler }),*)?],
            welcome: $crate::__wasihost_welcome_hook!($($welcome)?),
        };

        $crate::__wasihost_entry!(__WASIHOST_GUEST);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __wasihost_welcome_hook {
    () => {
        ::core::option::Option::None
    };
    ($hook:expr) => {
        ::core::option::Option::Some($hook as $crate::guest::WelcomeHook)
    };
}

/// The guest's entry points: the two ABI exports of a wasm guest (without the `native`
/// feature), or `fn main` running [`native::main`](crate::native::main) (with it).
#[cfg(not(feature = "native"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __wasihost_entry {
    ($guest:ident) => {
        /// ABI export: allocate a block for the host to write a call into (0 on failure).
        #[no_mangle]
        pub extern "C" fn wasihost_alloc(size: i32) -> i32 {
            $crate::guest::alloc(size)
        }

        /// ABI export: run one command; returns `(resp_ptr << 32) | resp_len`.
        #[no_mangle]
        pub extern "C" fn wasihost_call(ptr: i32, cmd_len: i32, in_len: i32) -> i64 {
            $crate::guest::call(&$guest, ptr, cmd_len, in_len)
        }
    };
}

/// The guest's entry points: the two ABI exports of a wasm guest (without the `native`
/// feature), or `fn main` running [`native::main`](crate::native::main) (with it).
#[cfg(feature = "native")]
#[doc(hidden)]
#[macro_export]
macro_rules! __wasihost_entry {
    ($guest:ident) => {
        /// The native plugin's entry: serves the host over the channel on descriptor 0.
        fn main() {
            $crate::native::main(&$guest)
        }
    };
}

/// Runs one command for the native runtime (feature `native`): the dispatch and the response
/// bytes of [`call`] (status word, then the body), with the name and input as slices rather
/// than a block of guest memory. Appended here, after every line of the wasm path, so that
/// the wasm build's code (and its panic locations) does not move.
#[cfg(feature = "native")]
pub(crate) fn call_native(guest: &Guest, name: &[u8], input: &[u8]) -> Vec<u8> {
    respond(run_native(guest, name, input))
}

#[cfg(feature = "native")]
fn run_native(guest: &Guest, name: &[u8], input: &[u8]) -> Result<Output> {
    let decoded = || {
        if input.is_empty() {
            Ok(Value::Null)
        } else {
            cbor::decode_with(input, &Limits::COMMAND)
        }
    };
    match resolve(guest, name) {
        Target::Bytes(handler) => handler(input).map(Output::Bytes),
        Target::Unknown(name) => Err(Error::new(
            "unknown_command",
            format!("no command named \"{}\"", truncate(&name, 255)),
        )
        .with_status(Status::NOT_FOUND)),
        Target::Hello => Ok(Output::Value(hello(guest))),
        Target::Welcome => Ok(Output::Value(handle_welcome(guest, decoded().ok()).to_value())),
        Target::User(handler) => handler(decoded()?).map(Output::Value),
    }
}
