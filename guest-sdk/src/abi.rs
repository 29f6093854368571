//! ABI v1 constants, status codes and the SDK's error type.
//!
//! Everything here mirrors `abi/v1/registry.json`; the crate's tests compare the two.

use std::borrow::Cow;
use std::fmt;

/// The ABI version this SDK implements and declares (`MAJOR.MINOR`).
pub const ABI_VERSION: &str = "1.0";
/// Major part of [`ABI_VERSION`].
pub const ABI_MAJOR: u32 = 1;
/// Minor part of [`ABI_VERSION`].
pub const ABI_MINOR: u32 = 0;
/// Name of the custom section that carries the version marker.
pub const MARKER_SECTION: &str = "wasihost_abi";
/// Content of the marker section: the ASCII version, no terminator.
pub const MARKER: [u8; 3] = *b"1.0";
/// Import module of every host function of major 1.
pub const IMPORT_MODULE: &str = "wasihost_v1";

/// Emits the `wasihost_abi` custom section into the crate that invokes it.
///
/// [`guest!`](crate::guest!) already does this; invoke it yourself only if you write the
/// exports by hand. A module must carry exactly one marker, so invoke it exactly once.
///
/// The static is emitted into the *calling* crate (the `cdylib`) rather than living in this
/// library, so that it is linked whatever the build profile or linker's member selection.
#[macro_export]
macro_rules! abi_marker {
    () => {
        #[doc(hidden)]
        #[link_section = "wasihost_abi"]
        #[used]
        static __WASIHOST_ABI_MARKER: [u8; 3] = $crate::abi::MARKER;
    };
    ($version:literal) => {
        const _: () = $crate::abi::check_abi_version($version);
        #[doc(hidden)]
        #[link_section = "wasihost_abi"]
        #[used]
        static __WASIHOST_ABI_MARKER: [u8; $version.len()] =
            $crate::import::marker::<{ $version.len() }>($version);
    };
}

/// The ABI versions this SDK can build a guest for (`guest! { abi: "1.1", .. }`).
pub const SUPPORTED_ABI_VERSIONS: [&str; 2] = ["1.0", "1.1"];

/// Fails the build (at compile time, in a `const`) if `version` is not one this SDK supports.
#[doc(hidden)]
pub const fn check_abi_version(version: &str) {
    let mut i = 0;
    while i < SUPPORTED_ABI_VERSIONS.len() {
        if crate::guest::bytes_eq(SUPPORTED_ABI_VERSIONS[i].as_bytes(), version.as_bytes()) {
            return;
        }
        i += 1;
    }
    panic!("guest!: abi must be one of SUPPORTED_ABI_VERSIONS (\"1.0\", \"1.1\")");
}

/// The ABI version text a `guest!` declares (the default when it names none).
#[doc(hidden)]
#[macro_export]
macro_rules! __wasihost_abi_version {
    () => {
        $crate::abi::ABI_VERSION
    };
    ($version:literal) => {
        $version
    };
}

/// Static facts about one host function (a subset of its registry entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostFn {
    /// Import name under [`IMPORT_MODULE`].
    pub name: &'static str,
    /// Capability that must be granted for the module to import it.
    pub capability: &'static str,
    /// Largest request (CBOR bytes) the host reads.
    pub max_request_bytes: usize,
    /// Largest response (CBOR bytes) the host can write.
    pub max_response_bytes: usize,
    /// The ABI version that added it: a guest importing it must declare at least this one.
    pub since: &'static str,
}

/// `abort`: end the call as a guest panic (capability `core`).
pub const ABORT: HostFn = HostFn {
    name: "abort",
    capability: "core",
    max_request_bytes: 1024,
    max_response_bytes: 0,
    since: "1.0",
};
/// `log`: append one record to the extension's log.
pub const LOG: HostFn = HostFn {
    name: "log",
    capability: "log",
    max_request_bytes: 4096,
    max_response_bytes: 1,
    since: "1.0",
};
/// `clock_now`: read a clock.
pub const CLOCK_NOW: HostFn = HostFn {
    name: "clock_now",
    capability: "clock",
    max_request_bytes: 16,
    max_response_bytes: 9,
    since: "1.0",
};
/// `random_bytes`: random bytes, at most [`RANDOM_MAX_BYTES`] per call.
pub const RANDOM_BYTES: HostFn = HostFn {
    name: "random_bytes",
    capability: "random",
    max_request_bytes: 5,
    max_response_bytes: 4099,
    since: "1.0",
};
/// `storage_get` (ABI 1.1, capability `storage`): Read a key of the extension's own store.
pub const STORAGE_GET: HostFn = HostFn {
    name: "storage_get",
    capability: "storage",
    max_request_bytes: 300,
    max_response_bytes: 32771,
    since: "1.1",
};
/// `storage_put` (ABI 1.1, capability `storage`): Write a key of the extension's own store, transactionally.
pub const STORAGE_PUT: HostFn = HostFn {
    name: "storage_put",
    capability: "storage",
    max_request_bytes: 33100,
    max_response_bytes: 1,
    since: "1.1",
};
/// `storage_delete` (ABI 1.1, capability `storage`): Delete a key of the extension's own store.
pub const STORAGE_DELETE: HostFn = HostFn {
    name: "storage_delete",
    capability: "storage",
    max_request_bytes: 300,
    max_response_bytes: 1,
    since: "1.1",
};
/// `storage_list` (ABI 1.1, capability `storage`): List keys of the extension's own store by prefix, in byte order, one bounded page at a time.
pub const STORAGE_LIST: HostFn = HostFn {
    name: "storage_list",
    capability: "storage",
    max_request_bytes: 600,
    max_response_bytes: 26624,
    since: "1.1",
};
/// `storage_cas` (ABI 1.1, capability `storage`): Compare-and-swap one key of the extension's own store: write new only if the current value is expected.
pub const STORAGE_CAS: HostFn = HostFn {
    name: "storage_cas",
    capability: "storage",
    max_request_bytes: 66000,
    max_response_bytes: 1,
    since: "1.1",
};
/// `secret_hmac` (ABI 1.1, capability `secrets`): Sign data with a secret the guest may use but never read.
pub const SECRET_HMAC: HostFn = HostFn {
    name: "secret_hmac",
    capability: "secrets",
    max_request_bytes: 16500,
    max_response_bytes: 34,
    since: "1.1",
};
/// `http_request` (ABI 1.1, capability `http`): Make one outbound HTTP request to an allowed origin.
pub const HTTP_REQUEST: HostFn = HostFn {
    name: "http_request",
    capability: "http",
    max_request_bytes: 40960,
    max_response_bytes: 61440,
    since: "1.1",
};
/// `file_open` (ABI 1.1, capability `files`): Open a file under a granted mount, resolved component by component without following links (the WASI profile's resolution).
pub const FILE_OPEN: HostFn = HostFn {
    name: "file_open",
    capability: "files",
    max_request_bytes: 1200,
    max_response_bytes: 9,
    since: "1.1",
};
/// `file_temp` (ABI 1.1, capability `files`): Create a temporary file that lives until its handle is closed, the extension closes, or its time bound passes.
pub const FILE_TEMP: HostFn = HostFn {
    name: "file_temp",
    capability: "files",
    max_request_bytes: 1,
    max_response_bytes: 9,
    since: "1.1",
};
/// `file_read` (ABI 1.1, capability `files`): Read from an open file handle.
pub const FILE_READ: HostFn = HostFn {
    name: "file_read",
    capability: "files",
    max_request_bytes: 32,
    max_response_bytes: 32771,
    since: "1.1",
};
/// `file_write` (ABI 1.1, capability `files`): Write to an open file handle, within the extension's file quota.
pub const FILE_WRITE: HostFn = HostFn {
    name: "file_write",
    capability: "files",
    max_request_bytes: 32800,
    max_response_bytes: 9,
    since: "1.1",
};
/// `file_close` (ABI 1.1, capability `files`): Close a file handle (a temporary file is removed).
pub const FILE_CLOSE: HostFn = HostFn {
    name: "file_close",
    capability: "files",
    max_request_bytes: 9,
    max_response_bytes: 1,
    since: "1.1",
};
/// `events_subscribe` (ABI 1.1, capability `events`): Subscribe to an event class: its events are delivered by calling the manifest's event command.
pub const EVENTS_SUBSCRIBE: HostFn = HostFn {
    name: "events_subscribe",
    capability: "events",
    max_request_bytes: 140,
    max_response_bytes: 1,
    since: "1.1",
};
/// `events_unsubscribe` (ABI 1.1, capability `events`): Unsubscribe from an event class; its queued events are dropped.
pub const EVENTS_UNSUBSCRIBE: HostFn = HostFn {
    name: "events_unsubscribe",
    capability: "events",
    max_request_bytes: 140,
    max_response_bytes: 1,
    since: "1.1",
};
/// Every host function of ABI 1.1 (1.0's four and 1.1's additions).
pub const HOST_FUNCTIONS: [HostFn; 20] = [
    ABORT, LOG, CLOCK_NOW, RANDOM_BYTES, STORAGE_GET, STORAGE_PUT, STORAGE_DELETE, STORAGE_LIST, STORAGE_CAS, SECRET_HMAC, HTTP_REQUEST, FILE_OPEN, FILE_TEMP, FILE_READ, FILE_WRITE, FILE_CLOSE, EVENTS_SUBSCRIBE, EVENTS_UNSUBSCRIBE, JOBS_SCHEDULE, JOBS_CANCEL,
];
/// Most bytes one `random_bytes` call returns.
pub const RANDOM_MAX_BYTES: usize = 4096;

/// A status code: `0` is success, anything else an error.
///
/// A newtype rather than an enum because codes the SDK does not know (from a newer minor)
/// must survive intact: [`Status::from_code`] accepts every `u32`. Compare against the
/// associated constants, which also work as `match` patterns.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status(u32);

impl Status {
    /// Success.
    pub const OK: Status = Status(0);
    /// The capability is not granted, or its grant was revoked.
    pub const DENIED: Status = Status(1);
    /// Malformed CBOR or wrong request shape.
    pub const INVALID_ARGUMENT: Status = Status(2);
    /// Request over the entry's limit.
    pub const PAYLOAD_TOO_LARGE: Status = Status(3);
    /// Response larger than the buffer offered.
    pub const BUFFER_TOO_SMALL: Status = Status(4);
    /// A bounded resource of the extension is full.
    pub const QUOTA_EXCEEDED: Status = Status(5);
    /// The host cannot serve the call now.
    pub const UNAVAILABLE: Status = Status(6);
    /// The host (or guest) failed internally.
    pub const INTERNAL: Status = Status(7);
    /// The named thing does not exist.
    pub const NOT_FOUND: Status = Status(8);
    /// The request is understood but not supported.
    pub const UNSUPPORTED: Status = Status(9);

    const NAMES: [&'static str; 10] = [
        "OK",
        "DENIED",
        "INVALID_ARGUMENT",
        "PAYLOAD_TOO_LARGE",
        "BUFFER_TOO_SMALL",
        "QUOTA_EXCEEDED",
        "UNAVAILABLE",
        "INTERNAL",
        "NOT_FOUND",
        "UNSUPPORTED",
    ];

    /// Any code, known or not.
    pub const fn from_code(code: u32) -> Status {
        Status(code)
    }

    /// The numeric code.
    pub const fn code(self) -> u32 {
        self.0
    }

    /// `true` for [`Status::OK`].
    pub const fn is_ok(self) -> bool {
        self.0 == 0
    }

    /// `true` when this SDK knows the code's name.
    pub const fn is_known(self) -> bool {
        (self.0 as usize) < Self::NAMES.len()
    }

    /// The registry name (`"QUOTA_EXCEEDED"`), or `None` for a code this SDK does not know.
    pub fn name(self) -> Option<&'static str> {
        Self::NAMES.get(self.0 as usize).copied()
    }

    /// A lower-case error class for this status (`"quota_exceeded"`); unknown codes,
    /// which the ABI says to treat as a generic error, give `"error"`.
    pub fn class(self) -> &'static str {
        const CLASSES: [&str; 10] = [
            "ok",
            "denied",
            "invalid_argument",
            "payload_too_large",
            "buffer_too_small",
            "quota_exceeded",
            "unavailable",
            "internal",
            "not_found",
            "unsupported",
        ];
        CLASSES.get(self.0 as usize).copied().unwrap_or("error")
    }

    /// Interprets a host function's return value: `>= 0` is a byte count, `< 0` is `-status`.
    pub fn from_return(ret: i32) -> core::result::Result<usize, Status> {
        if ret >= 0 {
            Ok(ret as usize)
        } else {
            // i32::MIN negates to 2^31, which still fits a u32.
            Err(Status((ret as i64).unsigned_abs() as u32))
        }
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "Status({})", self.0),
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// `Result` with the SDK's [`Error`].
pub type Result<T, E = Error> = core::result::Result<T, E>;

/// An error of a host call or of a command.
///
/// Returned by every capability wrapper (carrying the host's [`Status`]), and returned by
/// command handlers: the SDK turns it into the error response `{"class", "message"}` under a
/// non-zero status (its [`status`](Error::status), or `INTERNAL` if that is `OK`).
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    status: Status,
    class: Cow<'static, str>,
    message: Cow<'static, str>,
}

impl Error {
    /// An error with a class of your choosing (status `INTERNAL`).
    ///
    /// Classes are short machine-readable words such as `"not_ready"`; the message is for people.
    pub fn new(class: impl Into<Cow<'static, str>>, message: impl Into<Cow<'static, str>>) -> Error {
        Error {
            status: Status::INTERNAL,
            class: class.into(),
            message: message.into(),
        }
    }

    /// Class `invalid_input`, status `INVALID_ARGUMENT`: the command's input has the wrong shape.
    pub fn invalid_input(message: impl Into<Cow<'static, str>>) -> Error {
        Error::new("invalid_input", message).with_status(Status::INVALID_ARGUMENT)
    }

    /// The error for a failed host call: class from the status (`"denied"`, ...).
    pub fn from_status(status: Status) -> Error {
        let message: Cow<'static, str> = match status.name() {
            Some(name) => Cow::Borrowed(name),
            None => Cow::Owned(format!("status {}", status.code())),
        };
        Error {
            status,
            class: Cow::Borrowed(status.class()),
            message,
        }
    }

    /// Replaces the status (used as the response status when a handler returns this error).
    pub fn with_status(mut self, status: Status) -> Error {
        self.status = status;
        self
    }

    /// The status: the host's for a failed host call, the response status for a command.
    pub fn status(&self) -> Status {
        self.status
    }

    /// The error class.
    pub fn class(&self) -> &str {
        &self.class
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<Status> for Error {
    fn from(status: Status) -> Error {
        Error::from_status(status)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Error({:?}, {:?}, {:?})", self.status, self.class, self.message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.class, self.message)
    }
}

impl std::error::Error for Error {}

// The jobs broker's entries (ABI 1.1), listed in HOST_FUNCTIONS above.
/// `jobs_schedule` (ABI 1.1, capability `jobs`): Schedule a background job: one of the manifest's [jobs] commands, run once after delay_ms, every every_ms (at least 1000), or on each event of class on_event.
pub const JOBS_SCHEDULE: HostFn = HostFn {
    name: "jobs_schedule",
    capability: "jobs",
    max_request_bytes: 4608,
    max_response_bytes: 9,
    since: "1.1",
};
/// `jobs_cancel` (ABI 1.1, capability `jobs`): Cancel one of the extension's jobs; a run in progress finishes.
pub const JOBS_CANCEL: HostFn = HostFn {
    name: "jobs_cancel",
    capability: "jobs",
    max_request_bytes: 9,
    max_response_bytes: 1,
    since: "1.1",
};
