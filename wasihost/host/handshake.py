"""The start-up handshake: the two reserved commands every guest answers before its first call
(``wasihost.hello``, then ``wasihost.welcome``), the checks on its answers, and the guest's
error body that a non-OK answer (of these or of any command) carries.

Everything a guest answers here is hostile until checked: bounded in size, decoded with the
bounded codec, and each field's type checked before it is used.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ..core.codec import CodecLimits, decode, encode
from ..core.errors import CallError, CodecError, FailureClass

if TYPE_CHECKING:
    from ..core.admission import AdmissionPlan
    from ..core.grants import Grant
    from ..core.manifest import Manifest
    from ..core.registry import Registry
    from ..core.tokens import TokenIssuer
    from ..engine import Budget
    from .backend import GuestInstance

# Handshake answers are a few short fields; anything bigger is a confused or hostile guest.
MAX_HANDSHAKE_BYTES = 4096
# The bounds of a reserved command's answer, made once (an attrs instance costs a few µs).
HANDSHAKE_LIMITS = CodecLimits(max_bytes=MAX_HANDSHAKE_BYTES)
# A guest's error map is for a human: class and message, bounded.
MAX_GUEST_ERROR_BYTES = 2048
MAX_GUEST_ERROR_TEXT = 512
MAX_GUEST_ERROR_CLASS = 64
GUEST_ERROR_LIMITS = CodecLimits(max_bytes=MAX_GUEST_ERROR_BYTES)
# 128 random bits: a runtime id names one start of one extension, and must not be guessable
# from another's (it is bound into the host-call token).
RUNTIME_ID_BYTES = 16
READINESS = ("ready", "degraded", "failed")
# A module's instances give the same handshake answers, byte for byte: the answers' checks
# are pure functions of those bytes, so each is worked out once per distinct answer (an
# answer that fails them is worked out, and refused, every time). Bounded by entries, each
# at most MAX_HANDSHAKE_BYTES.
HANDSHAKE_ANSWERS_KEPT = 64


@attrs.frozen
class Handshake:
    """What the guest said at start-up and what the host answered."""

    runtime_id: bytes
    guest_id: str
    guest_version: str
    abi: str
    requested: tuple[str, ...]
    granted: tuple[str, ...]
    epoch: int
    readiness: str
    reason: str | None
    # The feature flags the host offered in ``wasihost.hello``: those of the guest's view.
    features: tuple[str, ...] = ()


def run_handshake(
    instance: GuestInstance,
    budget: Budget,
    *,
    ext_id: str,
    plan: AdmissionPlan,
    manifest: Manifest | None,
    grant: Grant,
    registry: Registry,
    tokens: TokenIssuer,
) -> Handshake:
    """Say hello, check who the guest says it is against its marker and manifest, welcome it
    with a new runtime id, its grant and token, and check that it is ready."""
    guest_id, guest_version, abi, features = _hello_answer(
        _reserved(instance, "wasihost.hello", hello_request(registry, plan), budget)
    )
    if abi != str(plan.version):
        raise CallError(
            FailureClass.HANDSHAKE,
            f"wasihost.hello: guest says ABI {abi!r}, its marker says {plan.version}",
        )
    if manifest is not None and (guest_id, guest_version) != (manifest.id, manifest.version):
        raise CallError(
            FailureClass.HANDSHAKE,
            f"wasihost.hello: guest says {guest_id} {guest_version}, the manifest "
            f"says {manifest.id} {manifest.version}",
        )
    runtime_id = secrets.token_bytes(RUNTIME_ID_BYTES)
    granted = sorted(grant.capabilities)
    welcome = {
        "runtime_id": runtime_id,
        "granted": granted,
        "epoch": grant.epoch,
        "token": tokens.issue(ext_id, runtime_id, grant.epoch),
    }
    readiness, reason = _welcome_answer(
        _reserved(instance, "wasihost.welcome", encode(welcome), budget)
    )
    if readiness == "failed":
        raise CallError(
            FailureClass.HANDSHAKE, f"guest reported failed start-up: {reason or 'no reason'}"
        )
    return Handshake(
        runtime_id=runtime_id,
        guest_id=guest_id,
        guest_version=guest_version,
        abi=abi,
        requested=features,
        granted=tuple(granted),
        epoch=grant.epoch,
        readiness=readiness,
        reason=reason,
        features=plan.view.features,
    )


def hello_request(registry: Registry, plan: AdmissionPlan) -> bytes:
    """``wasihost.hello``'s request: the same for every guest of one view while the
    registry's majors stay as they are (a major is never removed or replaced, so their
    count says whether they changed), so worked out once per host.

    Feature flags travel in it (an additive field: guests ignore fields they do not know):
    those of the view the guest linked against, so what it may rely on."""
    key = ("hello", len(registry.majors), plan.view.features)
    request: bytes | None = registry.memo.get(key)
    if request is None:
        versions = [str(v) for v in registry.versions]
        features = list(plan.view.features)
        request = encode({"host": "wasihost", "abi": versions, "features": features})
        registry.remember(key, request)
    return request


def guest_error(body: bytes) -> tuple[str, str]:
    """The guest's ``{"class", "message"}``, bounded; never trusted to be well-formed."""
    try:
        value = decode(body, GUEST_ERROR_LIMITS)
    except CodecError:
        return "error", "guest error (malformed error body)"
    if not isinstance(value, dict):
        return "error", "guest error (malformed error body)"
    cls = value.get("class")
    msg = value.get("message")
    cls = cls[:MAX_GUEST_ERROR_CLASS] if isinstance(cls, str) and cls else "error"
    msg = msg[:MAX_GUEST_ERROR_TEXT] if isinstance(msg, str) else ""
    return cls, msg


def guest_error_line(cls: str, msg: str) -> str:
    return f"{cls}: {msg}" if msg else cls


def _reserved(instance: GuestInstance, command: str, request: bytes, budget: Budget) -> bytes:
    """The body of a reserved command's OK answer (any other status fails the handshake)."""
    try:
        with instance.lock:
            result = instance.call(command.encode(), request, MAX_HANDSHAKE_BYTES, budget)
    except CallError as exc:
        if exc.failure in (FailureClass.PROTOCOL, FailureClass.GUEST_ERROR):
            raise CallError(FailureClass.HANDSHAKE, f"{command}: {exc.message}") from None
        raise
    if result.status != 0:
        raise CallError(
            FailureClass.HANDSHAKE,
            f"{command}: guest answered status {result.status} "
            f"({guest_error_line(*guest_error(result.body))})",
        )
    return result.body


@functools.lru_cache(maxsize=HANDSHAKE_ANSWERS_KEPT)
def _hello_answer(body: bytes) -> tuple[str, str, str, tuple[str, ...]]:
    """``wasihost.hello``'s answer checked: (guest id, version, ABI, feature flags)."""
    fields = _require_fields(
        _decode_answer(body, "wasihost.hello"),
        "wasihost.hello",
        {"id": str, "version": str, "abi": str, "features": list},
    )
    features = fields["features"]
    if not all(isinstance(f, str) for f in features):
        raise CallError(FailureClass.HANDSHAKE, "wasihost.hello: features must be text")
    return fields["id"], fields["version"], fields["abi"], tuple(features)


@functools.lru_cache(maxsize=HANDSHAKE_ANSWERS_KEPT)
def _welcome_answer(body: bytes) -> tuple[str, str | None]:
    """``wasihost.welcome``'s answer checked: (readiness, reason)."""
    welcome = _require_fields(
        _decode_answer(body, "wasihost.welcome"), "wasihost.welcome", {"status": str}
    )
    readiness = welcome["status"]
    reason = welcome.get("reason")
    if readiness not in READINESS or (reason is not None and not isinstance(reason, str)):
        raise CallError(FailureClass.HANDSHAKE, f"wasihost.welcome: bad answer {welcome!r}")
    return readiness, reason


def _decode_answer(body: bytes, command: str) -> Any:
    try:
        return decode(body, HANDSHAKE_LIMITS)
    except CodecError as exc:
        raise CallError(FailureClass.HANDSHAKE, f"{command}: {exc.message}") from None


def _require_fields(value: Any, where: str, fields: Mapping[str, type]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CallError(FailureClass.HANDSHAKE, f"{where}: answer is not a map")
    for key, kind in fields.items():
        if not isinstance(value.get(key), kind):
            raise CallError(FailureClass.HANDSHAKE, f"{where}: field {key!r} missing or mistyped")
    return value
