"""The benchmark's persistent APPLICATION scenarios (issue 21): the
generator's stream ends QoS 2 exchanges on both sides, and ``bench/run.py``
gives tbmq credentials of client type APPLICATION for the subscriber of
those scenarios only."""

from __future__ import annotations

import sqlite3

from bench import run
from bench import scenarios as sc
from bench.brokers import Tbmq
from bench.mqttgen import Stream
from tbmq.mqtt.codec import encode
from tbmq.mqtt.constants import ReasonCode
from tbmq.mqtt.packets import Publish, Pubrec, Pubrel, Pubcomp


def test_the_stream_answers_every_step_of_qos_2():
    # as a subscriber: PUBLISH → PUBREC, then PUBREL → PUBCOMP [MQTT-4.3.3]
    sub = Stream(4, on_publish=lambda payload: None)
    sub.feed(encode(Publish("t", b"x", qos=2, packet_id=7), 4))
    assert bytes(sub.out) == b"\x50\x02\x00\x07"
    sub.out.clear()
    sub.feed(encode(Pubrel(packet_id=7), 4))
    assert bytes(sub.out) == b"\x70\x02\x00\x07"
    # as a publisher: PUBREC → PUBREL; the PUBCOMP ends it (counted as an acknowledgement)
    pub = Stream(4)
    pub.feed(encode(Pubrec(packet_id=9), 4))
    assert bytes(pub.out) == b"\x62\x02\x00\x09" and pub.acks == 0
    pub.feed(encode(Pubcomp(packet_id=9), 4))
    assert pub.acks == 1


def test_a_refusing_pubrec_ends_the_exchange():
    pub = Stream(5)
    pub.feed(encode(Pubrec(packet_id=3, reason_code=ReasonCode.NOT_AUTHORIZED), 5))
    assert (pub.acks, pub.refused, bytes(pub.out)) == (1, 1, b"")


def test_the_application_scenarios_have_their_client_and_the_others_none():
    apps = {name for name, (_, _, kw, *_) in run.SCENARIOS.items() if kw.get("app_client")}
    assert apps == {"persistent_app", "persistent_app_qos2", "fanin_app_qos1"}
    assert {"persistent", "persistent_qos2", "persistent_app", "persistent_app_qos2"} <= run.PERSISTENT
    assert run.SCENARIOS["persistent_app"][2]["app_client"] == sc.APP_CLIENT_ID


def test_the_credentials_of_a_tbmq_node_are_of_client_type_application(tmp_path, monkeypatch):
    monkeypatch.setattr("bench.brokers.OUT", str(tmp_path))
    node = Tbmq()
    try:
        node.add_credentials(sc.APP_CLIENT_ID, "APPLICATION")
        conn = sqlite3.connect(f"{node.data_dir}/credentials.sqlite3")
        try:
            rows = conn.execute("SELECT client_type, credentials_value FROM mqtt_client_credentials").fetchall()
        finally:
            conn.close()
    finally:
        node.cleanup()
    assert len(rows) == 1 and rows[0][0] == "APPLICATION" and sc.APP_CLIENT_ID in rows[0][1]
