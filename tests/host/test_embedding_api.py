"""The embedding API as an application uses it: per-call budgets, guest errors as data, and
extension logs delivered to the application's own sink or to Python's logging."""

from __future__ import annotations

import logging
import time

import pytest

from tests.support.common import ALL_CAPS, FIXTURES
from wasihost.brokers.log import Level, LogRecord, to_logging
from wasihost.core.errors import CallError, ConfigError, FailureClass
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host


def test_per_call_fuel_and_timeout_lower_the_budget_for_one_call(host: Host) -> None:
    ext = host.load(FIXTURES / "compute")
    assert ext.call("run", {"n": 30}) is not None
    with pytest.raises(CallError) as info:
        ext.call("run", {"n": 30}, fuel=1_000)
    assert info.value.failure is FailureClass.OUT_OF_FUEL
    # The next call has the extension's own budget again.
    assert ext.call("run", {"n": 30}) is not None
    spin = host.load(FIXTURES / "spin", fuel=10_000_000_000, timeout_ms=20_000)
    spin.start()
    started = time.monotonic()
    with pytest.raises(CallError) as info:
        spin.call("run", timeout_ms=50)
    assert info.value.failure is FailureClass.DEADLINE
    assert time.monotonic() - started < 2


def test_a_per_call_budget_covers_start_up_too(host: Host) -> None:
    ext = host.load(FIXTURES / "hello")
    with pytest.raises(CallError) as info:
        ext.call("greet", {"name": "a"}, fuel=100)  # not even enough to start
    assert info.value.failure is FailureClass.OUT_OF_FUEL
    assert ext.call("greet", {"name": "a"}) == {"greeting": "hello, a"}


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"fuel": 10**12}, r"fuel=.*1\.\.\d+, this extension's fuel_per_call"),
        ({"fuel": 0}, "fuel_per_call"),
        ({"fuel": True}, "fuel_per_call"),
        ({"timeout_ms": 10**9}, "timeout_ms"),
        ({"timeout_ms": "5"}, "timeout_ms"),
    ],
)
def test_per_call_budgets_never_raise_the_extensions_own(
    host: Host, override: dict[str, object], match: str
) -> None:
    ext = host.load(FIXTURES / "echo")
    with pytest.raises(ConfigError, match=match):
        ext.call("echo", 1, **override)  # type: ignore[arg-type]


def test_guest_errors_carry_the_guests_class_and_message(host: Host) -> None:
    ext = host.load(FIXTURES / "hello")
    with pytest.raises(CallError) as info:
        ext.call("greet", {"name": 7})
    err = info.value
    assert err.failure is FailureClass.GUEST_ERROR
    assert err.guest_class == "invalid_input"
    assert err.guest_message and err.message == f"{err.guest_class}: {err.guest_message}"
    with pytest.raises(CallError) as info:
        ext.call("greet", {"name": "x"}, fuel=100)
    assert info.value.guest_class is None and info.value.guest_message is None


def test_a_log_sink_gets_every_record_and_nothing_is_buffered() -> None:
    got: list[tuple[str, LogRecord]] = []
    with Host(Policy(allow=ALL_CAPS), cache_dir=None, log_sink=lambda e, r: got.append((e, r))) as host:
        ext = host.load(FIXTURES / "logger", grants=["log"])
        # Far more than the 64 KiB buffer would keep.
        ext.call("run", {"lines": 3000})
        assert len(got) == 3000
        assert {e for e, _ in got} == {ext.id}
        assert got[0][1].message == "line 0" and got[0][1].level is Level.INFO
        assert ext.logs() == () and ext.log.dropped == 0


def test_a_failing_sink_loses_the_record_not_the_call(caplog: pytest.LogCaptureFixture) -> None:
    def broken(extension: str, record: LogRecord) -> None:
        raise RuntimeError("sink down")

    with Host(Policy(allow=ALL_CAPS), cache_dir=None, log_sink=broken) as host:
        ext = host.load(FIXTURES / "logger", grants=["log"])
        with caplog.at_level(logging.ERROR, logger="wasihost"):
            ext.call("run", {"lines": 3})
        assert ext.log.sink_errors == 3
        assert "log sink failed" in caplog.text


def test_to_logging_names_the_logger_after_the_extension(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None, log_sink=to_logging) as host:
        ext = host.load(FIXTURES / "logger", grants=["log"])
        with caplog.at_level(logging.DEBUG):
            ext.call("run", {"lines": 2, "level": 3})
        records = [r for r in caplog.records if r.name == ext.id]
        assert [r.getMessage() for r in records] == ["line 0", "line 1"]
        assert all(r.levelno == logging.WARNING for r in records)
        assert all(getattr(r, "wasihost_source", None) == "guest" for r in records)
