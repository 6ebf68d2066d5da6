"""Session rules the session decides itself, not its connection."""

from __future__ import annotations

import pytest

from tbmq.errors import ProtocolViolation
from tbmq.mqtt import ReasonCode
from tests.unit.test_outbox import make_session


def test_disconnect_changes_the_session_expiry_interval_up_to_the_cap():
    # §3.14.2.2.2: the DISCONNECT's interval replaces the CONNECT's, capped
    session, conn, clock = make_session()
    session.expiry_interval = 60
    session.expiry_on_disconnect(7200, 60, 3600)
    assert session.expiry_interval == 3600
    session.expiry_on_disconnect(0, 60, 3600)
    assert session.expiry_interval == 0


def test_disconnect_may_not_set_an_interval_after_a_connect_that_asked_for_none():
    # [MQTT-3.14.2-2]
    session, conn, clock = make_session()
    with pytest.raises(ProtocolViolation) as e:
        session.expiry_on_disconnect(10, 0, 3600)
    assert e.value.reason_code == ReasonCode.PROTOCOL_ERROR and session.expiry_interval == 0
    session.expiry_on_disconnect(0, 0, 3600)  # 0 after 0 is allowed
    assert session.expiry_interval == 0
