"""Grants with epochs: who may do what, and the one commit-time check every broker uses.

An extension's authority is the set of its active grants, each a capability with a scope. Its
**grant epoch** only ever grows: every grant, scope change, revocation or policy update bumps
it. A call captures the epoch when it starts; a broker that *commits* something (a log append
now; storage transactions and network sends later) does it through :meth:`GrantTable.commit`,
which re-checks the epoch and the capability under the same (per-extension) lock a
revocation takes. So once
``revoke`` has returned, nothing authorised before it can commit.

Epochs are drawn from one counter per table (host-wide), above every epoch the table has
given out or its store holds, so one id never shows the same epoch with two different grant
states: not across a revocation, and not across its record leaving memory and coming back.
That is what lets the table forget an extension's record once its last open extension has
closed (:meth:`GrantTable.release`): a view kept from before (an epoch, a committer) can
never match what the id is granted later.

Pure apart from the optional write-through store (a :class:`GrantStore`), which is asked to
persist a change before the change becomes visible in memory.
"""

from __future__ import annotations

import enum
import functools
import json
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

import attrs

from .errors import ConfigError
from .registry import CORE_CAPABILITY

T = TypeVar("T")


class _Acting(threading.local):
    """The ids whose commit action runs on this thread, holding the id's lock. The action is
    the embedder's code (a ``ctx.commit`` action, a log sink): a grant change or a commit of
    the same id from inside it would wait on its own thread for that lock forever (the guest's
    call with it, out of reach of any deadline), so it is refused instead."""

    def __init__(self) -> None:
        self.ids: set[str] = set()


_ACTING = _Acting()


def _refuse_reentry(extension: str) -> ConfigError:
    return ConfigError(
        f"grants of {extension!r} changed or committed from inside one of its own commits "
        "(a ctx.commit action or a log sink): that waits for itself; do it after the commit"
    )


Committer = Callable[..., tuple[bool, Any]]
"""``commit(epoch, action, *args) -> (authorised, action's result or None)``: see
:meth:`GrantTable.committer`."""

# A scope is a small JSON object (origins, quota, mounts...); 4 KiB is far more than any needs.
MAX_SCOPE_BYTES = 4096


def canonical_scope(scope: Mapping[str, Any] | None) -> str:
    """Scopes are stored as canonical JSON, so equal scopes compare equal."""
    if scope is None:
        return "{}"
    if not isinstance(scope, Mapping):
        raise ConfigError("a grant scope must be a JSON object")
    try:
        text = json.dumps(dict(scope), sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"grant scope is not JSON-serialisable: {exc}") from None
    if len(text.encode()) > MAX_SCOPE_BYTES:
        raise ConfigError(f"grant scope exceeds {MAX_SCOPE_BYTES} bytes")
    return text


@attrs.frozen
class Grant:
    """The capabilities an extension holds, at one grant epoch."""

    capabilities: frozenset[str]
    epoch: int = 0

    def allows(self, capability: str) -> bool:
        return capability == CORE_CAPABILITY or capability in self.capabilities


class GrantOrigin(enum.StrEnum):
    """Where a capability an extension holds came from (docs/grants.md: the grant rule)."""

    MANIFEST = "manifest"
    """The manifest requests it and the load named no ``grants``: a host without a state
    directory grants everything the manifest requests that its policy allows."""
    LOAD = "load"
    """Named by the load's ``grants`` (a bare module's whole request; with a state directory,
    written to the grant table by that load)."""
    GRANT = "grant"
    """The grant table: ``Host.grant`` or ``wasihost grants grant``, after or before the load
    (with a state directory, every grant the table held before this load)."""


@attrs.frozen
class GrantInfo:
    """One capability an extension holds now: where it came from, since when, its scope and
    whether its manifest requires it (:attr:`Extension.grants`)."""

    capability: str
    origin: GrantOrigin
    since_epoch: int
    scope: Mapping[str, Any]
    required: bool


@attrs.frozen
class GrantEntry:
    """One active grant: a capability, its scope (canonical JSON), and the epoch since which
    it has been held without a break (a new scope keeps it; a revocation ends it, and a later
    grant starts a new one: so a broker can tell a grant held throughout from one revoked and
    given again, issue 28 items 18-19)."""

    capability: str
    scope: str = "{}"
    since_epoch: int = 0

    @property
    def scope_value(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.scope)
        return value


@attrs.frozen
class GrantState:
    """Everything durable about one extension's grants."""

    entries: Mapping[str, GrantEntry] = attrs.field(factory=dict)
    epoch: int = 0
    revoked: str | None = None  # why the whole extension was revoked (disabled), if it was

    def snapshot(self) -> Grant:
        if self.revoked is not None:
            return Grant(frozenset(), self.epoch)
        return Grant(frozenset(self.entries), self.epoch)


def withdrawn(before: GrantState | None, after: GrantState | None) -> frozenset[str]:
    """The capabilities ``before`` held that ``after`` no longer holds without a break: gone,
    revoked with the whole extension, or revoked and granted again since (a new
    ``since_epoch``). What a broker's long-lived state (subscriptions, jobs) made under them
    must end."""
    if before is None or before.revoked is not None:
        return frozenset()
    if after is None or after.revoked is not None:
        return frozenset(before.entries)
    return frozenset(
        c
        for c, entry in before.entries.items()
        if c not in after.entries or after.entries[c].since_epoch != entry.since_epoch
    )


class GrantStore(Protocol):
    """Durable home of grant states; ``save`` must be atomic and raise on failure."""

    def save_grants(self, extension: str, state: GrantState) -> None: ...

    def load_grants(self, extension: str) -> GrantState | None: ...

    def highest_grant_epoch(self) -> int:
        """The highest epoch this store has ever held, for any id: those of ids deleted since
        included, so that a table opened on it later never draws one again."""
        ...


class GrantTable:
    """The host's grants, per extension; the single owner of grant state in memory."""

    def __init__(self, store: GrantStore | None = None) -> None:
        self._store = store
        self._states: dict[str, GrantState] = {}
        # One lock per extension: a commit (which may be a file write) holds it while it runs,
        # and must not hold up other extensions' calls or grant changes. An id's lock leaves
        # with its record (release), so a lock user checks, once it holds the lock, that it is
        # still the id's (_locked).
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        # How many open extensions hold each id's record: from admission (Host._build) to
        # Extension.close. An id is here only while held.
        self._holders: dict[str, int] = {}
        # The highest epoch given out or held: every new epoch is drawn above it (under
        # _locks_lock), for every id, so an epoch is never given to one id twice.
        self._high = store.highest_grant_epoch() if store is not None else 0

    def _lock_for(self, extension: str) -> threading.Lock:
        lock = self._locks.get(extension)
        if lock is None:
            with self._locks_lock:
                lock = self._locks.setdefault(extension, threading.Lock())
        return lock

    def _locked(self, extension: str) -> threading.Lock:
        """The id's lock, acquired: the caller releases it. A lock taken just as the id's
        record left memory is no longer the id's: then take the new one."""
        if extension in _ACTING.ids:
            raise _refuse_reentry(extension)
        while True:
            lock = self._lock_for(extension)
            lock.acquire()
            if self._locks.get(extension) is lock:
                return lock
            lock.release()

    def _next_epoch(self, old: GrantState) -> int:
        with self._locks_lock:
            epoch = self._high = max(self._high, old.epoch) + 1
        return epoch

    def _get(self, extension: str) -> GrantState:
        """Caller holds the id's lock. Kept in memory only while an extension holds the id:
        a look at another id (a status query, a closed extension's) leaves nothing behind."""
        state = self._states.get(extension)
        if state is None:
            loaded = self._store.load_grants(extension) if self._store is not None else None
            state = loaded if loaded is not None else GrantState()
            if extension in self._holders:
                self._states[extension] = state
        return state

    def _put(self, extension: str, state: GrantState) -> int:
        if self._store is not None:
            self._store.save_grants(extension, state)  # durable first, then visible
        self._states[extension] = state
        return state.epoch

    def _done(self, extension: str, lock: threading.Lock) -> None:
        """End of an operation under ``lock`` (held), then release it. For an id no open
        extension holds, a durable table keeps nothing (the store has it all), and one
        without a store keeps only a record an operator's change made (and its lock)."""
        try:
            if extension not in self._holders and (
                self._store is not None or extension not in self._states
            ):
                self._forget(extension, lock)
        finally:
            lock.release()

    def _forget(self, extension: str, lock: threading.Lock) -> None:
        """Caller holds ``lock``, the id's: drop its record and its lock from memory."""
        with self._locks_lock:
            if extension in self._holders:
                return  # held again meanwhile (admitted while this ran)
            self._states.pop(extension, None)
            if self._locks.get(extension) is lock:
                del self._locks[extension]

    # -- open extensions hold their id's record ----------------------------------------------

    def hold(self, extension: str) -> None:
        """An extension of this id is being admitted: its record stays in memory (and its
        lock stays the same, as its committers need) until :meth:`release`."""
        with self._locks_lock:
            self._holders[extension] = self._holders.get(extension, 0) + 1

    def release(self, extension: str) -> bool:
        """An extension of this id closed (or its admission failed). Once none is open, the
        record leaves memory if nothing would be lost: with a store always (it is there);
        without one if it carries nothing a later admission keeps (no revocation, no scope).
        Returns True if it left. Later epochs of the id are drawn above every one it had."""
        lock = self._locked(extension)
        try:
            with self._locks_lock:
                count = self._holders.get(extension, 0) - 1
                if count > 0:
                    self._holders[extension] = count
                    return False
                self._holders.pop(extension, None)
            state = self._states.get(extension)
            if state is not None and self._store is None and not _forgettable(state):
                return False
            self._forget(extension, lock)
            return extension not in self._states
        finally:
            lock.release()

    def held(self) -> int:
        """How many ids open extensions hold (diagnostics, tests)."""
        return len(self._holders)

    def state(self, extension: str) -> GrantState:
        lock = self._locked(extension)
        try:
            return self._get(extension)
        finally:
            self._done(extension, lock)

    def current(self, extension: str) -> GrantState | None:
        """The extension's state without taking the lock, for hot paths that only compare it
        with one seen before: states are immutable and replaced whole, and one dict read is
        atomic under the GIL. None if the table has not loaded the extension yet."""
        return self._states.get(extension)

    def live_states(self) -> Mapping[str, GrantState]:
        """The mapping :meth:`current` reads (never replaced, only updated), for a per-call
        check that would otherwise pay a method call: read it, never write it."""
        return self._states

    def snapshot(self, extension: str) -> Grant:
        return self.state(extension).snapshot()

    def epoch(self, extension: str) -> int:
        return self.state(extension).epoch

    def grant(self, extension: str, capability: str, scope: Mapping[str, Any] | None = None) -> int:
        """Grant (or re-scope) ``capability``; returns the new epoch."""
        if capability == CORE_CAPABILITY:
            raise ConfigError("'core' is implicit and cannot be granted or revoked")
        text = canonical_scope(scope)
        lock = self._locked(extension)
        try:
            old = self._get(extension)
            current = old.entries.get(capability)
            if current is not None and current.scope == text and old.revoked is None:
                return old.epoch
            epoch = self._next_epoch(old)
            entries = dict(old.entries)
            since = current.since_epoch if current is not None else epoch
            entries[capability] = GrantEntry(capability, text, since)
            return self._put(extension, GrantState(entries, epoch, old.revoked))
        finally:
            self._done(extension, lock)

    def reset(self, extension: str, capabilities: frozenset[str]) -> int:
        """Make ``capabilities`` the extension's whole grant (a stateless host's admission).
        Bumps the epoch only if something changes; a revoked extension stays revoked."""
        lock = self._locked(extension)
        try:
            old = self._get(extension)
            if old.revoked is None and frozenset(old.entries) == capabilities and old.epoch:
                return old.epoch
            epoch = self._next_epoch(old)
            entries = {
                c: old.entries.get(c, GrantEntry(c, "{}", epoch)) for c in sorted(capabilities)
            }
            return self._put(extension, GrantState(entries, epoch, old.revoked))
        finally:
            self._done(extension, lock)

    def revoke(self, extension: str, capability: str | None = None, reason: str = "") -> int:
        """Withdraw one capability, or (``capability=None``) all of them: the extension is
        then revoked as a whole until :meth:`reinstate`. Returns the new epoch."""
        lock = self._locked(extension)
        try:
            old = self._get(extension)
            entries = dict(old.entries)
            if capability is None:
                entries.clear()
                revoked: str | None = reason or "revoked by the operator"
            else:
                if capability not in entries:
                    raise ConfigError(f"{extension} holds no grant for {capability!r}")
                del entries[capability]
                revoked = old.revoked
            return self._put(extension, GrantState(entries, self._next_epoch(old), revoked))
        finally:
            self._done(extension, lock)

    def reinstate(self, extension: str) -> int:
        """Lift a whole-extension revocation; grants must be given again one by one."""
        lock = self._locked(extension)
        try:
            old = self._get(extension)
            return self._put(extension, GrantState(old.entries, self._next_epoch(old), None))
        finally:
            self._done(extension, lock)

    def known(self) -> list[str]:
        """Extensions whose grants this table holds in memory: those open extensions hold,
        and (without a store) those given a grant, a scope or a revocation while none was
        open. A durable table's other ids are in its store."""
        return list(self._states)

    def adopt(self, extension: str, durable: GrantState) -> bool:
        """Another host changed this id's grants in the shared store: take ``durable`` as the
        state in memory if it is newer (a higher epoch) than the one held, without writing it
        back (it is the store's already). Every epoch this table draws later is above it. True
        if it was adopted. Only for an id an open extension holds (others are read from the
        store when needed)."""
        lock = self._locked(extension)
        try:
            held = self._states.get(extension)
            if held is None or durable.epoch <= held.epoch:
                return False
            with self._locks_lock:
                self._high = max(self._high, durable.epoch)
            self._states[extension] = durable
            return True
        finally:
            lock.release()

    def bump(self, extension: str) -> int:
        """A security-policy update: every authorisation made so far is void."""
        lock = self._locked(extension)
        try:
            old = self._get(extension)
            return self._put(extension, attrs.evolve(old, epoch=self._next_epoch(old)))
        finally:
            self._done(extension, lock)

    def authorizes(self, extension: str, epoch: int, capability: str) -> bool:
        """The gate of every host call. Lock-free once the extension is loaded (states are
        immutable and swapped whole); what must not race a revocation goes through
        :meth:`commit`, which holds the lock."""
        state = self._states.get(extension)
        if state is None:
            state = self.state(extension)
        return self._authorizes(state, epoch, capability)

    @staticmethod
    def _authorizes(state: GrantState, epoch: int, capability: str) -> bool:
        if state.revoked is not None or state.epoch != epoch:
            return False
        return capability == CORE_CAPABILITY or capability in state.entries

    def authorizer(self, extension: str) -> Callable[[int, str], bool]:
        """:meth:`authorizes` for one extension, ``(epoch, capability) -> bool``, with its
        lookups bound once: the gate of every host call of that extension's instances."""
        states = self._states
        slow = self.authorizes

        def authorizes(epoch: int, capability: str) -> bool:
            state = states.get(extension)
            if state is None:
                return slow(extension, epoch, capability)
            if state.revoked is not None or state.epoch != epoch:
                return False
            return capability == CORE_CAPABILITY or capability in state.entries

        return authorizes

    def committer(self, extension: str, capability: str) -> Committer:
        """:meth:`commit` for one extension and capability, ``(epoch, action, *args)``, with
        the extension's lock and the lookups bound once (an id's lock is not replaced while an
        extension holds it, see :meth:`hold`): for brokers that commit on every call.
        ``action(*args)`` runs under the lock, as for :meth:`commit`, only if ``epoch`` still
        authorises ``capability``."""
        lock = self._lock_for(extension)
        states = self._states
        slow = self.commit
        core = capability == CORE_CAPABILITY

        def commit(epoch: int, action: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
            acting = _ACTING.ids
            if extension in acting:
                raise _refuse_reentry(extension)
            with lock:
                state = states.get(extension)
                if state is not None:
                    if (
                        state.revoked is not None
                        or state.epoch != epoch
                        or not (core or capability in state.entries)
                    ):
                        return False, None
                    acting.add(extension)
                    try:
                        return True, action(*args)
                    finally:
                        acting.discard(extension)
            # Not in memory: no extension holds the id (so its lock may have been replaced
            # since this was made): the checked path, under the id's lock of now.
            return slow(extension, epoch, capability, functools.partial(action, *args))

        return commit

    def commit(
        self, extension: str, epoch: int, capability: str, action: Callable[[], T]
    ) -> tuple[bool, T | None]:
        """Run ``action`` only if ``epoch`` still authorises ``capability``, atomically with
        respect to every grant change. ``action`` must be short: it holds the table's lock."""
        lock = self._locked(extension)
        acting = _ACTING.ids
        try:
            if not self._authorizes(self._get(extension), epoch, capability):
                return False, None
            acting.add(extension)
            try:
                return True, action()
            finally:
                acting.discard(extension)
        finally:
            self._done(extension, lock)


def _forgettable(state: GrantState) -> bool:
    """Without a store, whether a closed id's record holds nothing a later admission would
    keep: an admission resets the capabilities to its own answer, and keeps only a
    revocation and the operator's scopes. (Its epochs need no keeping: see _next_epoch.)"""
    return state.revoked is None and all(e.scope == "{}" for e in state.entries.values())
