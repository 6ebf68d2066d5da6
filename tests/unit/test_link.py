"""What a session sees of its connection: a :class:`tbmq.broker.link.Link`
built by the connection at attach, not the connection itself."""

from __future__ import annotations

import dataclasses

from tbmq.broker.link import Link
from tbmq.mqtt import Property
from tests.helpers import Harness


def test_a_session_sees_its_connection_through_a_link_with_the_connects_values():
    h = Harness({"mqtt": {"outbound_topic_aliases": 4}})
    c = h.client("a", level=5, properties={Property.RECEIVE_MAXIMUM: 7,
                                           Property.MAXIMUM_PACKET_SIZE: 5000,
                                           Property.TOPIC_ALIAS_MAXIMUM: 2})
    session = h.broker.sessions.sessions["a"]
    link = session.link
    assert type(link) is Link and session.outbox.link is link
    assert (link.protocol_level, link.send_quota, link.max_packet_size,
            link.topic_alias_maximum) == (5, 7, 5000, 2)
    assert link.auth is c.protocol.auth and not link.paused
    # a re-authentication or a change of the client's credentials
    # (tbmq.auth.watch) replaces the connection's auth: the link's too
    changed = dataclasses.replace(c.protocol.auth, rules=None)
    c.protocol.auth = changed
    assert link.auth is changed


def test_the_connection_keeps_the_links_paused_and_a_new_connection_gets_a_new_link():
    h = Harness()
    c = h.client("a", clean_start=False)
    session = h.broker.sessions.sessions["a"]
    link = session.link
    c.protocol.pauseProducing()
    assert link.paused and link.paused_bytes == 0
    c.protocol.resumeProducing()
    assert not link.paused
    c.lose()
    assert session.link is None and session.outbox.link is None
    h.client("a", clean_start=False)
    assert session.link is not None and session.link is not link
