"""The commands on the grants and state of installed extensions: ``grants`` (list, grant,
revoke, reinstate) and ``status``."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from ..core import cbor_json
from ..core.terminal import printable
from .common import UsageError
from .options import _state_dir_to_read, _state_flag, _state_host

if TYPE_CHECKING:
    from ..host.runtime import Host


def _cmd_grants(args: argparse.Namespace) -> int:
    from ..core.manifest import check_extension_id

    check_extension_id(args.extension)
    if args.grants_cmd == "list":
        _state_dir_to_read(args)
    with _state_host(args) as host:
        ext = args.extension
        store = host.require_state()
        if args.grants_cmd != "list" and store.package(ext) is None:
            # Allowed (grants may be set before the install), but a typo would pass silently.
            # Said once the change is made: a refused one waits for nothing.
            pending_note = (
                f"note: {printable(ext)} is not installed in {store.directory}: "
                "the change waits for it"
            )
        else:
            pending_note = None
        if args.grants_cmd == "reinstate" and host.grants.state(ext).revoked is None:
            print(f"{ext} is not revoked: nothing to reinstate")
            return 0
        if args.grants_cmd == "grant":
            scope = None
            if args.scope is not None:
                try:
                    scope = cbor_json.loads(args.scope)
                except cbor_json.JsonFormError as exc:
                    raise UsageError(f"--scope: {exc}") from None
            epoch = host.grant(ext, args.capability, scope)
            print(f"granted {args.capability} to {ext} (epoch {epoch})")
            if pending_note is None:
                pending_note = _unrequested_note(host, ext, args.capability)
        elif args.grants_cmd == "revoke":
            epoch = host.revoke(ext, args.capability, args.reason)
            what = args.capability or "everything (the extension is revoked)"
            print(f"revoked {what} from {ext} (epoch {epoch})")
        elif args.grants_cmd == "reinstate":
            epoch = host.reinstate(ext)
            # A whole-extension revocation withdrew every grant: none comes back by itself.
            held = sorted(host.grants.state(ext).entries)
            print(
                f"reinstated {ext} (epoch {epoch}); "
                + (
                    f"it holds: {', '.join(held)}"
                    if held
                    else f"it holds no grants: give each again with "
                    f"wasihost grants grant {ext} CAP{_state_flag(args)}"
                )
            )
        else:
            state = host.grants.state(ext)
            rows = [
                {"capability": e.capability, "scope": e.scope_value, "since_epoch": e.since_epoch}
                for e in state.entries.values()
            ]
            if args.json:
                print(
                    cbor_json.dumps(
                        {
                            "extension": ext,
                            "epoch": state.epoch,
                            "revoked": state.revoked,
                            "grants": rows,
                        }
                    )
                )
            else:
                print(
                    f"{ext}: epoch {state.epoch}"
                    + (f", REVOKED: {printable(state.revoked)}" if state.revoked else "")
                )
                for row in rows:
                    print(
                        f"  {row['capability']}  scope={cbor_json.dumps(row['scope'])}  "
                        f"since epoch {row['since_epoch']}"
                    )
                if not rows:
                    print("  (no grants)")
        if pending_note is not None:
            print(pending_note, file=sys.stderr)
    return 0


def _unrequested_note(host: Host, ext: str, capability: str) -> str | None:
    """What to say of a grant the installed version's manifest does not request: kept, for a
    later version that requests it, but it gives nothing now (docs/grants.md)."""
    from ..core.errors import WasihostError
    from ..host.updates import installed_requests

    installed = host.require_state().package(ext)
    if installed is None:
        return None
    try:
        requested = installed_requests(host, installed)
    except WasihostError:
        return None  # an unreadable install is the status command's to report
    if capability in requested:
        return None
    return (
        f"note: {printable(ext)} {printable(installed.version)} does not request "
        f"{capability}: the grant gives it nothing until a version that requests it"
    )


def _status_of(host: Host, ext: str) -> dict[str, Any]:
    from ..host.updates import interrupted

    store = host.require_state()
    pkg = store.package(ext)
    grants = host.grants.state(ext)
    recorded = store.lifecycle(ext)
    why: str | None
    if grants.revoked is not None:
        state, why = "revoked", grants.revoked
    elif recorded is not None:
        state, why = recorded
    else:
        state, why = ("installed" if pkg else "unknown"), None
    return {
        "extension": ext,
        "version": pkg.version if pkg else None,
        "state": state,
        "why": why,
        "epoch": grants.epoch,
        "grants": sorted(grants.entries),
        "remaining": store.remaining_data(ext),
        "recent": [f"{e.kind}: {e.detail}" for e in store.events(ext, 5)],
        "crashes_by_class": store.crash_counts(ext),
        # A host died during an update or rollback: the data may be half migrated until the
        # next start (or install, update, rollback, remove) restores the checkpoint.
        "interrupted": interrupted(host, ext),
        # None when the state keeps nothing of ``ext``: `remove --purge` would refuse it.
        "remove": (
            f"wasihost remove {ext} --purge"
            + (f" --state-dir {store.directory}" if store.directory else "")
            if store.keeps(ext)
            else None
        ),
    }


def _storage_kept(remaining: dict[str, Any]) -> str:
    """The storage broker's share of what an extension keeps, for ``status``."""
    if remaining["storage_error"] is not None:
        return f"unreadable ({printable(remaining['storage_error'])})"
    return f"{remaining['storage_bytes']} bytes in {remaining['storage_entries']} entries"


def _metrics_line(metrics: dict[str, Any]) -> str:
    """One line of host metrics for `wasihost status` (counts only)."""
    source = {
        "live": f"live, {metrics['live_hosts']} host(s)",
        "last host": "last published by a host now closed",
        "state": "from the journal",
    }[metrics["source"]]
    states = ", ".join(f"{s} {n}" for s, n in metrics["extensions_by_state"].items()) or "none"
    errors = metrics["host_call_errors"]
    refused = sum(errors["statuses"].values())
    failed = sum(errors["failures"].values())
    crashes = sum(metrics["crashes_by_class"].values())
    return (
        f"metrics ({source}): extensions {states}; crashes {crashes}; "
        f"quarantines {metrics['quarantines']}; throttles {metrics['throttles']}; "
        f"host calls refused {refused}, failed {failed}"
    )


def _cmd_status(args: argparse.Namespace) -> int:
    from ..core.manifest import check_extension_id

    if args.extension is not None:
        check_extension_id(args.extension)
    _state_dir_to_read(args)
    with _state_host(args) as host:
        store = host.require_state()
        names = [args.extension] if args.extension else store.extensions()
        reports = [_status_of(host, n) for n in names]
        from ..supervisor.opmetrics import status_metrics

        metrics = status_metrics(store)
        if args.json:
            # An object since the metrics joined (the list of reports is its "extensions").
            print(cbor_json.dumps({"extensions": reports, "metrics": metrics}, indent=2))
            return 0
        if not reports:
            print(f"no extensions in {store.directory}")
        print(_metrics_line(metrics))
        for r in reports:
            print(
                f"{r['extension']} {r['version'] or ''}".rstrip()
                + f": {r['state']}"
                + (f" ({printable(r['why'])})" if r["why"] else "")  # may quote a guest
            )
            print(f"  grants (epoch {r['epoch']}): {', '.join(r['grants']) or 'none'}")
            rem = r["remaining"]
            print(
                f"  kept: package {rem['package'] or '-'}; files {rem['data_bytes']} bytes; "
                f"storage {_storage_kept(rem)}; {rem['journal_events']} journal events"
            )
            if r["interrupted"]:
                print(
                    "  interrupted: a host stopped during an update or rollback of it; its data is "
                    "restored from the checkpoint at its next start, install, update, rollback "
                    "or remove"
                )
            if r["crashes_by_class"]:
                counts = ", ".join(f"{c} {n}" for c, n in r["crashes_by_class"].items())
                print(f"  crashes in the journal: {counts}")
            for line in r["recent"]:
                print(f"  recent: {printable(line)}")
            if r["remove"] is None:
                print("  nothing is kept for it in this state directory")
            else:
                print(f"  to remove everything: {r['remove']}")
    return 0
