"""The extension lifecycle: every state, every legal move, in one table.

Pure and sans-IO. Everything that decides whether an extension may move from one state to
another lives in :data:`TRANSITIONS`; the documentation's diagram is generated from it
(``python -m wasihost.core.lifecycle``), so the two cannot disagree.
"""

from __future__ import annotations

import enum
import sys
import threading
from collections.abc import Callable, Mapping

from .errors import WasihostError


class State(enum.Enum):
    PROVISIONING = "provisioning"
    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    THROTTLED = "throttled"
    QUARANTINED = "quarantined"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"
    REVOKED = "revoked"
    CLOSED = "closed"


class Event(enum.Enum):
    START = "start"  # begin the startup sequence (verify, admit, instantiate)
    READY = "ready"  # the handshake completed and the guest reported ready or degraded
    START_FAILED = "start_failed"  # a startup step or the handshake failed
    PAUSE = "pause"
    THROTTLE = "throttle"
    RESUME = "resume"
    CRASH = "crash"  # a call failed in a way that discarded the instance
    RESTART = "restart"  # the supervisor (or operator) tries again
    QUARANTINE = "quarantine"  # too many crashes, or an operator's decision
    RELEASE = "release"  # an operator lets a quarantined extension out
    STOP = "stop"
    STOPPED = "stopped"
    REVOKE = "revoke"  # every grant withdrawn, or an emergency disable
    CLOSE = "close"  # the embedder closed it (or its host, or replaced it by an update)


S, E = State, Event

# (state, event) -> next state. Nothing else is legal. Notably there is no
# PROVISIONING --READY--> RUNNING: every way into RUNNING passes through STARTING, whose only
# way out to RUNNING is a completed handshake.
TRANSITIONS: Mapping[tuple[State, Event], State] = {
    (S.PROVISIONING, E.START): S.STARTING,
    # Rebuilt from durable state that says quarantined: it stays so until the operator acts.
    (S.PROVISIONING, E.QUARANTINE): S.QUARANTINED,
    (S.STARTING, E.READY): S.RUNNING,
    (S.STARTING, E.START_FAILED): S.FAILED,
    (S.RUNNING, E.PAUSE): S.PAUSED,
    (S.RUNNING, E.THROTTLE): S.THROTTLED,
    (S.THROTTLED, E.RESUME): S.RUNNING,
    (S.PAUSED, E.RESUME): S.RUNNING,
    (S.RUNNING, E.CRASH): S.FAILED,
    (S.THROTTLED, E.CRASH): S.FAILED,
    (S.FAILED, E.RESTART): S.STARTING,
    (S.STOPPED, E.RESTART): S.STARTING,
    (S.FAILED, E.QUARANTINE): S.QUARANTINED,
    (S.RUNNING, E.QUARANTINE): S.QUARANTINED,
    (S.PAUSED, E.QUARANTINE): S.QUARANTINED,
    (S.THROTTLED, E.QUARANTINE): S.QUARANTINED,
    (S.QUARANTINED, E.RELEASE): S.STOPPED,
    (S.RUNNING, E.STOP): S.STOPPING,
    (S.PAUSED, E.STOP): S.STOPPING,
    (S.THROTTLED, E.STOP): S.STOPPING,
    (S.FAILED, E.STOP): S.STOPPED,
    (S.STOPPING, E.STOPPED): S.STOPPED,
    **{(state, E.REVOKE): S.REVOKED for state in State if state not in (S.REVOKED, S.CLOSED)},
    # Closed is final: the extension object is done, whatever it was doing.
    **{(state, E.CLOSE): S.CLOSED for state in State if state is not S.CLOSED},
}

# Commands run only in RUNNING: not while starting (no handshake yet), not while paused,
# throttled or quarantined, never after a revocation.
COMMAND_STATES = frozenset({S.RUNNING})
# States an operator must act on; the supervisor never leaves them by itself.
TERMINAL_FOR_SUPERVISOR = frozenset({S.QUARANTINED, S.REVOKED, S.CLOSED})


class LifecycleError(WasihostError):
    """An illegal lifecycle move; names the extension, the state and the event."""

    def __init__(self, extension: str, state: State, event: Event) -> None:
        super().__init__(
            f"{extension}: no transition from {state.value} on {event.value}"
            + (
                f" (legal: {', '.join(e.value for e in legal_events(state))})"
                if legal_events(state)
                else ""
            )
        )
        self.state = state
        self.event = event

    @property
    def error_class(self) -> str:
        return "lifecycle"


class ExtensionRevoked(WasihostError):
    """The operator revoked the extension (or disabled it): it runs nothing until reinstated.
    Its data is kept; ``wasihost status`` says what remains."""

    @property
    def error_class(self) -> str:
        return "revoked"


class ExtensionUnavailable(WasihostError):
    """The extension is paused, quarantined or stopping: not your call's fault, try later or
    ask the operator."""

    def __init__(
        self,
        extension: str,
        state: State,
        reason: str | None,
        *,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(f"{extension} is {state.value}" + (f": {reason}" if reason else ""))
        self.state = state
        # Set when waiting helps: the extension restarts after a crash once its backoff ends.
        self.retry_after_s = retry_after_s

    @property
    def error_class(self) -> str:
        return "unavailable"


# Why a call is refused once the host's shutdown has begun (Host.close with a timeout): the
# reason of the ExtensionUnavailable that the call path and the scheduling hook both raise.
SHUTTING_DOWN = "the host is shutting down"


def legal_events(state: State) -> tuple[Event, ...]:
    return tuple(e for (s, e) in TRANSITIONS if s is state)


def next_state(extension: str, state: State, event: Event) -> State:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise LifecycleError(extension, state, event) from None


# An operator's reason (Host.revoke/disable, Extension.pause/quarantine/close) is a line for a
# person: it is stored in the grant table, the lifecycle table and the journal, and printed by
# `wasihost status`. 1 KiB holds any sentence; before this bound a 50 MB reason (a paste
# accident) wrote 100 MB into the state database, and a reason that was not text failed the
# database write halfway through a revocation with a raw sqlite3 error.
MAX_REASON_BYTES = 1024


def check_reason(reason: object, *, name: str = "reason") -> str:
    """``reason`` if it is text an operator may store: a str of valid UTF-8 (no lone
    surrogate, which SQLite and the terminal cannot take) of at most MAX_REASON_BYTES; else a
    :class:`~wasihost.core.errors.ConfigError` naming the argument. Checked before anything
    changes, so a refused reason leaves no half-made revocation."""
    from .errors import ConfigError

    if not isinstance(reason, str):
        raise ConfigError(f"{name} must be a string, not {type(reason).__name__}")
    try:
        size = len(reason.encode("utf-8"))
    except UnicodeEncodeError:
        raise ConfigError(f"{name} is not valid UTF-8 (it holds a lone surrogate)") from None
    if size > MAX_REASON_BYTES:
        raise ConfigError(f"{name} is {size} bytes; at most {MAX_REASON_BYTES} are kept")
    return reason


def clip_reason(text: str) -> str:
    """Text the host itself makes into a reason out of what others wrote (a revocation list's
    verdict, a stored lifecycle reason): made storable rather than refused, because refusing
    it would leave undone the revocation it explains."""
    data = text.encode("utf-8", "replace")
    if len(data) > MAX_REASON_BYTES:
        data = data[: MAX_REASON_BYTES - 3] + b"..."
    return data.decode("utf-8", "ignore")


class Lifecycle:
    """The current state of one extension; the only mutable piece, guarded by a lock.

    ``on_change`` is told of every transition (the runtime records them durably).
    """

    def __init__(
        self,
        extension: str,
        state: State = State.PROVISIONING,
        on_change: Callable[[State, Event, State], None] | None = None,
    ) -> None:
        self.extension = extension
        self._state = state
        self._lock = threading.Lock()
        self._on_change = on_change
        self.reason: str | None = None

    @property
    def state(self) -> State:
        return self._state

    def fire(self, event: Event, reason: str | None = None) -> State:
        with self._lock:
            before = self._state
            after = next_state(self.extension, before, event)
            self._state = after
            if reason is not None or event in (Event.READY, Event.RESTART, Event.START):
                self.reason = reason
        if self._on_change is not None:
            self._on_change(before, event, after)
        return after

    def try_fire(self, event: Event, reason: str | None = None) -> State | None:
        """Fire ``event`` if it is legal in the current state (checked atomically), else None.

        For moves that race with an operator: a call that crashed while another thread
        revoked the extension must not fail on the now-illegal CRASH."""
        with self._lock:
            before = self._state
            after = TRANSITIONS.get((before, event))
            if after is None:
                return None
            self._state = after
            self.reason = reason
        if self._on_change is not None:
            self._on_change(before, event, after)
        return after

    def may_run_commands(self) -> bool:
        return self._state in COMMAND_STATES


def mermaid() -> str:
    """The state diagram, generated from :data:`TRANSITIONS` (Mermaid syntax)."""
    lines = ["stateDiagram-v2", f"    [*] --> {S.PROVISIONING.name}"]
    revoke_sources = sorted(s.name for (s, e) in TRANSITIONS if e is E.REVOKE)
    close_sources = sorted(s.name for (s, e) in TRANSITIONS if e is E.CLOSE)
    for (state, event), target in TRANSITIONS.items():
        if event in (E.REVOKE, E.CLOSE):
            continue
        lines.append(f"    {state.name} --> {target.name}: {event.value}")
    lines.append(f"    note right of {S.REVOKED.name}: revoke, from every state but closed")
    lines.append(f"    note right of {S.CLOSED.name}: close, from every other state")
    lines.append(f"    %% revoke sources: {', '.join(revoke_sources)}")
    lines.append(f"    %% close sources: {', '.join(close_sources)}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(mermaid() + "\n")
