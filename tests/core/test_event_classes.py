"""The event class grammar (pure): selectors, matching, and what one selector covers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from wasihost.core.event_classes import MAX_CLASS_CHARS, covers, is_class, is_selector, matches

LABEL = st.text("abcxyz09_-", min_size=1, max_size=4).filter(lambda t: t[0].isalpha())
CLASS = st.lists(LABEL, min_size=1, max_size=4).map(".".join)
SELECTOR = st.one_of(CLASS, CLASS.map(lambda c: c + ".*"))


def test_the_grammar() -> None:
    assert is_class("orders.created") and is_class("a") and is_class("a" * MAX_CLASS_CHARS)
    for bad in ("", "A", "9a", "a" * (MAX_CLASS_CHARS + 1), "a*", "a.*", "a b", 1, None):
        assert not is_class(bad)
    assert is_selector("orders.*") and is_selector("orders.eu.*") and is_selector("orders")
    for bad in ("*", ".*", "orders.**", "orders.*.x", "orders*", "a" * 127 + ".*", b"a"):
        assert not is_selector(bad)


def test_matching_and_covering() -> None:
    assert matches("orders.*", "orders.created") and matches("orders.*", "orders.eu.paid")
    assert not matches("orders.*", "orders") and not matches("orders.*", "ordersx.a")
    assert matches("orders.created", "orders.created")
    assert not matches("orders.created", "orders.created.x")
    assert covers("orders.*", "orders.eu.*") and covers("orders.*", "orders.x")
    assert not covers("orders.eu.*", "orders.*") and not covers("orders.x", "orders.*")


@given(SELECTOR, SELECTOR, CLASS)
def test_a_covered_selector_never_matches_more_than_what_covers_it(
    allowed: str, selector: str, event_class: str
) -> None:
    if covers(allowed, selector) and matches(selector, event_class):
        assert matches(allowed, event_class)


@given(SELECTOR)
def test_generated_selectors_are_well_formed_and_cover_themselves(selector: str) -> None:
    if len(selector) <= MAX_CLASS_CHARS:
        assert is_selector(selector)
    assert covers(selector, selector)
