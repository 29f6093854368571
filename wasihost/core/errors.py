"""The error tree of wasihost.

Every error says whose fault it is: the embedder's (``ConfigError``), the package author's
(``ManifestError``, ``PackageError``, ``AdmissionError``) or the guest's at run time
(``CallError`` with a :class:`FailureClass`). ``WasihostError`` is the root to catch; it is
never raised itself.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType


class FailureClass(enum.Enum):
    """Why a call or start-up failed; the values are the ABI's failure class names."""

    ADMISSION = "admission"
    OUT_OF_FUEL = "out_of_fuel"
    DEADLINE = "deadline"
    MEMORY_LIMIT = "memory_limit"
    STACK_OVERFLOW = "stack_overflow"
    PANIC = "panic"
    TRAP = "trap"
    PROTOCOL = "protocol"
    HOST_ERROR = "host_error"
    GUEST_ERROR = "guest_error"
    # The command answered more than the extension's ``max_output_bytes``: a limit of the
    # manifest, raised there (a protocol failure before issue 35).
    OUTPUT_TOO_LARGE = "output_too_large"
    HANDSHAKE = "handshake"
    DENIED = "denied"
    # Ctrl-C (SIGINT) reached the host while the guest ran on the main thread.
    INTERRUPTED = "interrupted"
    # The caller gave up on the call (an asyncio task awaiting ``acall`` was cancelled): the
    # guest was stopped at its next epoch tick and its instance dropped. The extension did
    # nothing wrong, so its lifecycle does not record a crash.
    CANCELLED = "cancelled"
    # The process runtime's child died, was killed, or broke the channel protocol (and was
    # ended for it): the call's class whatever the guest was doing.
    NATIVE_PROCESS_EXIT = "native_process_exit"

    @property
    def discards_instance(self) -> bool:
        """A trap may leave guest state corrupt (e.g. Rust's shadow stack), so the instance goes."""
        return self not in _KEEPS_INSTANCE


_KEEPS_INSTANCE = frozenset({FailureClass.GUEST_ERROR, FailureClass.DENIED, FailureClass.ADMISSION})


class CrashClass(enum.Enum):
    """Why an extension crashed, as operators count it (the supervisor's crash records: its
    restart policies and quarantine, :mod:`wasihost.supervisor.supervision`)."""

    TRAP = "trap"
    PANIC = "panic"
    RESOURCE_LIMIT = "resource_limit"
    PROTOCOL_VIOLATION = "protocol_violation"
    HOST_CALL_FAILURE = "host_call_failure"
    # The out-of-process runtime's worker died; no in-process failure maps to it.
    NATIVE_PROCESS_EXIT = "native_process_exit"


_CLASS_OF: Mapping[FailureClass, CrashClass] = MappingProxyType(
    {
        FailureClass.TRAP: CrashClass.TRAP,
        FailureClass.PANIC: CrashClass.PANIC,
        FailureClass.OUT_OF_FUEL: CrashClass.RESOURCE_LIMIT,
        FailureClass.DEADLINE: CrashClass.RESOURCE_LIMIT,
        FailureClass.MEMORY_LIMIT: CrashClass.RESOURCE_LIMIT,
        FailureClass.STACK_OVERFLOW: CrashClass.RESOURCE_LIMIT,
        FailureClass.OUTPUT_TOO_LARGE: CrashClass.RESOURCE_LIMIT,
        FailureClass.PROTOCOL: CrashClass.PROTOCOL_VIOLATION,
        FailureClass.HANDSHAKE: CrashClass.PROTOCOL_VIOLATION,
        FailureClass.HOST_ERROR: CrashClass.HOST_CALL_FAILURE,
        FailureClass.NATIVE_PROCESS_EXIT: CrashClass.NATIVE_PROCESS_EXIT,
    }
)


def crash_class(failure: FailureClass) -> CrashClass:
    """The crash class of a failure that discarded an instance (a trap when nothing closer
    fits: an interrupt out of a host function, say)."""
    return _CLASS_OF.get(failure, CrashClass.TRAP)


class WasihostError(Exception):
    """Root of every wasihost error; catch it, never raise it directly."""

    def __init__(self, message: str) -> None:
        if type(self) is WasihostError:
            raise TypeError("WasihostError is abstract: raise one of its subclasses")
        super().__init__(message)
        self.message = message
        # What the user can do about it, in the words of the front end that caught it (the
        # CLI prints it as a ``hint:`` line); None when there is nothing to suggest.
        self.hint: str | None = None

    @property
    def error_class(self) -> str:
        """The short class printed as ``error: <class>: <message>``."""
        return "error"


class ConfigError(WasihostError, ValueError):
    """The embedder passed a setting the host refuses (your code, not the guest's)."""

    @property
    def error_class(self) -> str:
        return "config"


class ManifestError(WasihostError, ValueError):
    """An ``extension.toml`` is malformed; ``key`` names the offending field."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key

    @property
    def error_class(self) -> str:
        return "manifest"


class PackageError(WasihostError):
    """A package cannot be loaded: missing or unreadable file, digest mismatch."""

    @property
    def error_class(self) -> str:
        return "package"


class UpdateError(PackageError):
    """An update or rollback did not happen; the version that ran before still runs."""


class CodecError(WasihostError, ValueError):
    """Bytes from the other side are not one well-formed, in-bounds CBOR item."""

    # The data items the decoders went through before the refusal (the scan's, or the exact
    # decoder's, whichever read more): set by codec.decode_counted, so that a refused request
    # is priced for the work done.
    items: int = 0

    @property
    def error_class(self) -> str:
        return "codec"


# A refusal lists this many problems, then how many more: a module of 100,000 bad imports
# made a refusal of 100,000 lines (99 million characters), carried into logs and reports.
# Fixing the first 32 and loading again shows the next ones.
MAX_REPORTED_PROBLEMS = 32


class AdmissionError(WasihostError):
    """The module was refused before any of its code ran; ``problems`` names each offender
    (the first MAX_REPORTED_PROBLEMS, then how many more), ``ungranted`` the capabilities
    whose grant would lift a refusal, ``unserved`` the application capabilities whose
    functions were not registered, ``unrequested`` those its imports need that its manifest
    does not request (the remedies to print)."""

    def __init__(
        self,
        problems: list[str] | tuple[str, ...],
        *,
        ungranted: tuple[str, ...] = (),
        unserved: tuple[str, ...] = (),
        unrequested: tuple[str, ...] = (),
    ) -> None:
        listed = tuple(problems[:MAX_REPORTED_PROBLEMS])
        more = len(problems) - len(listed)
        if more:
            listed += (f"... and {more} more problems not listed",)
        self.problems = listed
        self.ungranted = ungranted
        # Application capabilities the manifest requests that the refusing host does not
        # serve: the remedy is the application's functions, not a grant.
        self.unserved = unserved
        # Capabilities the module's imports need that its manifest does not request: no grant
        # can be given (none was asked for); the remedy is the manifest (and the guest).
        self.unrequested = unrequested
        super().__init__("; ".join(self.problems) if self.problems else "module refused")

    @property
    def error_class(self) -> str:
        return FailureClass.ADMISSION.value


class CallError(WasihostError):
    """A guest call or start-up failed; ``failure`` says why.

    For ``guest_error`` (the guest answered with an error of its own), ``guest_class`` and
    ``guest_message`` carry its ``{"class", "message"}``, bounded; None otherwise.
    ``before_entry`` is True for a call refused before any guest code ran (the caller's stack
    had too little left): the guest did nothing, so its instance is unharmed and it is no
    crash of the extension's."""

    before_entry = False

    def __init__(
        self,
        failure: FailureClass,
        message: str,
        *,
        guest_class: str | None = None,
        guest_message: str | None = None,
    ) -> None:
        super().__init__(message)
        self.failure = failure
        self.guest_class = guest_class
        self.guest_message = guest_message

    @property
    def error_class(self) -> str:
        return self.failure.value


class ArchiveError(PackageError):
    """A ``.whpkg`` archive is malformed or hostile (bounds, names, links, a file that does not
    match the archive's content record); nothing of it was extracted."""


class SignatureError(WasihostError):
    """A package's signature does not hold: absent, by a key the host does not trust, made over
    other bytes, or naming another publisher. Raised, never returned: see
    :func:`wasihost.packaging.signing.verify`."""

    @property
    def error_class(self) -> str:
        return "signature"


class UnsignedPackageError(SignatureError):
    """The package carries no signature, and one was required."""


class UntrustedKeyError(SignatureError):
    """The signature names a publisher or key that the trust store does not hold."""


class ExpiredKeyError(SignatureError):
    """The signing key is trusted only until a date, and that date has passed."""


class InvalidSignatureError(SignatureError):
    """The Ed25519 signature does not verify over this package's digest and identity."""


class PublisherMismatchError(SignatureError):
    """The manifest's ``publisher`` is not the publisher whose key signed the package."""


class RevocationError(WasihostError):
    """Admission refused on the revocation list's account: the package is revoked, or the
    list cannot be trusted (stale, unverifiable, older than one already seen), in which case
    every package is refused (fail closed)."""

    @property
    def error_class(self) -> str:
        return "revocation"


class RevokedError(RevocationError):
    """The package's publisher, signing key, digest or extension version is revoked."""


class RevocationListError(RevocationError):
    """The revocation list is missing, malformed, not signed by a revocation key, expired, or
    an older version than one this host has already seen."""
