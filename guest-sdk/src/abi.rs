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
}

/// `abort`: end the call as a guest panic (capability `core`).
pub const ABORT: HostFn = HostFn {
    name: "abort",
    capability: "core",
    max_request_bytes: 1024,
    max_response_bytes: 0,
};
/// `log`: append one record to the extension's log.
pub const LOG: HostFn = HostFn {
    name: "log",
    capability: "log",
    max_request_bytes: 4096,
    max_response_bytes: 1,
};
/// `clock_now`: read a clock.
pub const CLOCK_NOW: HostFn = HostFn {
    name: "clock_now",
    capability: "clock",
    max_request_bytes: 16,
    max_response_bytes: 9,
};
/// `random_bytes`: random bytes, at most [`RANDOM_MAX_BYTES`] per call.
pub const RANDOM_BYTES: HostFn = HostFn {
    name: "random_bytes",
    capability: "random",
    max_request_bytes: 5,
    max_response_bytes: 4099,
};
/// Every host function of ABI 1.0.
pub const HOST_FUNCTIONS: [HostFn; 4] = [ABORT, LOG, CLOCK_NOW, RANDOM_BYTES];
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
