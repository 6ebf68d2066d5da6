"""Tests for tbmq.mqtt.topics: validation, $share parsing and the reference
matcher (MQTT 5.0 sections 4.7, 4.8)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tbmq.mqtt import (
    TopicError,
    parse_shared_subscription,
    topic_matches,
    validate_topic_filter,
    validate_topic_name,
)


@pytest.mark.parametrize(
    "name",
    ["a", "/", "a/b/c", "/finance", "sport/tennis/player1", "$SYS/broker/load", " ", "a//b", "ü/€/𝄞", "a" * 65535],
)
def test_valid_topic_names(name):
    validate_topic_name(name)


@pytest.mark.parametrize(
    "name",
    ["", "a/+", "+", "#", "a/#", "sport/tennis#", "a\x00b", "a" * 65536, "€" * 21846],
)
def test_invalid_topic_names(name):
    with pytest.raises(TopicError):
        validate_topic_name(name)


def test_topic_error_is_value_error():
    assert issubclass(TopicError, ValueError)


@pytest.mark.parametrize(
    "topic_filter",
    [
        "#",
        "+",
        "/",
        "+/+",
        "/+",
        "+/tennis/#",
        "sport/#",
        "sport/tennis/player1/#",
        "sport/+/player1",
        "a//b",
        "$SYS/#",
        "$share/group/a/b",
        "a/+/+/#",
    ],
)
def test_valid_topic_filters(topic_filter):
    validate_topic_filter(topic_filter)


@pytest.mark.parametrize(
    "topic_filter",
    [
        "",
        "sport/tennis#",  # [MQTT-4.7.1-1]: '#' must be alone in its level
        "sport/tennis/#/ranking",  # '#' must be last
        "#/a",
        "##",
        "a/#/#",
        "sport+",  # [MQTT-4.7.1-2]: '+' must occupy the whole level
        "+a/b",
        "a/b+/c",
        "a/++",
        "a\x00",
        "a" * 65536,
    ],
)
def test_invalid_topic_filters(topic_filter):
    with pytest.raises(TopicError):
        validate_topic_filter(topic_filter)


@pytest.mark.parametrize(
    "topic_filter, expected",
    [
        ("$share/consumer1/sport/tennis/+", ("consumer1", "sport/tennis/+")),
        ("$share/consumer2/sport/tennis/+", ("consumer2", "sport/tennis/+")),
        ("$share/g/#", ("g", "#")),
        ("$share/g//finance", ("g", "/finance")),
        ("$share/g/$SYS/x", ("g", "$SYS/x")),
        ("sport/tennis", None),
        ("$SYS/#", None),
        ("$sharex/g/a", None),
        ("#", None),
    ],
)
def test_parse_shared_subscription(topic_filter, expected):
    assert parse_shared_subscription(topic_filter) == expected


@pytest.mark.parametrize(
    "topic_filter",
    [
        "$share/",  # [MQTT-4.8.2-1]: empty share name
        "$share//a",
        "$share/g",  # [MQTT-4.8.2-2]: share name must be followed by '/' and a filter
        "$share/g/",
        "$share/g+/a",  # share name must not contain '+' or '#'
        "$share/+/a",
        "$share/#/a",
        "$share/g#",
        "$share/g/a#",  # filter part invalid
        "$share/g/a/#/b",
    ],
)
def test_invalid_shared_subscriptions(topic_filter):
    with pytest.raises(TopicError):
        parse_shared_subscription(topic_filter)


@pytest.mark.parametrize(
    "topic_filter, name, expected",
    [
        # section 4.7.1.2, multi-level wildcard
        ("sport/tennis/player1/#", "sport/tennis/player1", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
        ("sport/tennis/player1/#", "sport/tennis/player2", False),
        ("sport/#", "sport", True),
        ("#", "sport/tennis", True),
        ("#", "/", True),
        # section 4.7.1.3, single-level wildcard
        ("sport/tennis/+", "sport/tennis/player1", True),
        ("sport/tennis/+", "sport/tennis/player2", True),
        ("sport/tennis/+", "sport/tennis/player1/ranking", False),
        ("sport/tennis/+", "sport/tennis", False),
        ("sport/+", "sport", False),
        ("sport/+", "sport/", True),
        ("+/+", "/finance", True),
        ("/+", "/finance", True),
        ("+", "/finance", False),
        ("+/tennis/#", "sport/tennis/player1", True),
        ("+/tennis/#", "sport/tennis", True),
        ("+/tennis/#", "sport/golf", False),
        ("a/+/c", "a//c", True),
        # exact matches
        ("a/b", "a/b", True),
        ("a/b", "a/b/", False),
        ("a/b", "A/b", False),
        ("/finance", "finance", False),
        # section 4.7.2, topics beginning with $ [MQTT-4.7.2-1]
        ("#", "$SYS/broker", False),
        ("+/monitor/Clients", "$SYS/monitor/Clients", False),
        ("$SYS/#", "$SYS/monitor/Clients", True),
        ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
        ("$SYS", "$SYS", True),
        ("a/#", "a/$SYS", True),
    ],
)
def test_topic_matches(topic_filter, name, expected):
    assert topic_matches(topic_filter, name) is expected


levels = st.text(alphabet="ab$", max_size=2)
names = st.lists(levels, min_size=1, max_size=4).map("/".join).filter(bool)


@settings(max_examples=200, deadline=None)
@given(name=names)
def test_name_matches_itself_and_hash(name):
    assert topic_matches(name, name)
    assert topic_matches("#", name) is (not name.startswith("$"))


@settings(max_examples=200, deadline=None)
@given(name=names, data=st.data())
def test_plus_matches_any_single_level(name, data):
    parts = name.split("/")
    index = data.draw(st.integers(0, len(parts) - 1))
    pattern = parts.copy()
    pattern[index] = "+"
    expected = not (index == 0 and name.startswith("$"))
    assert topic_matches("/".join(pattern), name) is expected
    # '#' after any proper prefix matches, including the parent level
    prefix = "/".join(parts[:index] + ["#"])
    assert topic_matches(prefix, name) is (index > 0 or not name.startswith("$"))
