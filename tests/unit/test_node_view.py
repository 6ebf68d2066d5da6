"""The node view (:mod:`tbmq.node_view`): ops, ``$SYS``, the event exporter
and plugins read the node through it, never through the ``Broker``."""

from __future__ import annotations

import types

from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import defer
from twisted.internet.task import Clock

from tbmq.broker.traffic import Traffic
from tbmq.cluster.record_types import NodeInfo, SessionInfo
from tbmq.config import load_config
from tbmq.hookspecs import hookimpl
from tbmq.model import ClientType, Message, SubscriptionOptions
from tbmq.node_view import NodeView
from tbmq.ops.api.app import AdminApi
from tbmq.ops.metrics import make_registry, render
from tbmq.ops.service import OpsService
from tbmq.ops.stats import History
from tbmq.views import SessionView
from tests.helpers import Harness
from tests.unit.test_ops_cluster import ADMIN, request, run

#: the public names of the view: what a fake must offer, and all it may
PUBLIC = {name for name in dir(NodeView) if not name.startswith("_")}


def info(client_id, service_id, connected=True, client_type=ClientType.DEVICE):
    return SessionInfo(client_id, service_id, "s-" + client_id, connected, True, client_type,
                       60, 5, 100.0, None if connected else 150.0, 150.0,
                       address="192.0.2.7:5000")


class FakeNode:
    """A node as a view shows it, with made-up figures and no broker behind:
    ops built on it works only if it uses nothing but the view."""

    def __init__(self, clock) -> None:
        self.config = load_config(environ={}, overrides={"sys_interval": 10})
        self.clock = clock
        self.service_id = "fake-1"
        self.started_at = 5.0
        self.traffic = Traffic(observe_latency=False)
        self.traffic.received[1] = 7
        self.traffic.sent[0] = 3
        self.call_times = None
        self.credential_store = None
        self.bus = None
        self.registered: list = []
        self.published: list = []
        self.disconnected: list = []
        self.cleared: list = []
        self._registry = {"dev-1": info("dev-1", "fake-1"),
                          "app-2": info("app-2", "fake-2", connected=False,
                                        client_type=ClientType.APPLICATION)}
        self._subs = {"dev-1": {"a/#": SubscriptionOptions(qos=1)},
                      "app-2": {"b/+": SubscriptionOptions(qos=2), "c": SubscriptionOptions()}}

    def sessions(self):
        session = types.SimpleNamespace(
            client_id="dev-1", client_type=ClientType.DEVICE, persistent=True,
            connection=object(), subscriptions=self._subs["dev-1"])
        return {"dev-1": SessionView(session)}

    def session(self, client_id):
        return self.sessions().get(client_id)

    def backlog(self, client_id):
        return (0, 2) if client_id == "dev-1" else None

    async def stored_messages(self, client_id):
        return 4

    def connections_by_listener(self):
        return {"default": 1}

    def connection_count(self):
        return 1

    def cluster_sessions(self):
        return types.MappingProxyType(self._registry)

    def cluster_session(self, client_id):
        return self._registry.get(client_id)

    def sessions_by_node(self):
        return {"fake-1": 1, "fake-2": 1}

    def subscriptions(self):
        return types.MappingProxyType(self._subs)

    def subscriptions_of(self, client_id):
        return types.MappingProxyType(self._subs.get(client_id, {}))

    def retained_count(self):
        return 6 + len(self.published)

    def retained(self, topic):
        return None

    def retained_for(self, topic_filter):
        return []

    def dropped(self):
        return {"queue_full": 2}

    def sessions_refused(self):
        return {"sessions_limit": 1, "application_clients_limit": 0}

    def consumers(self):
        return []

    def alive_nodes(self):
        return ["fake-1", "fake-2"]

    def known_nodes(self):
        return {"fake-2": NodeInfo("fake-2", 1.0, 2.0, listeners=("tcp:1884",))}

    def last_heard(self):
        return {"fake-2": self.clock.seconds()}

    def previous_heartbeats(self):
        return {}

    integrations = None

    def heartbeat_counters(self):
        return {"received": 0, "sent": 0}

    def bus_topic(self, name):
        return name

    def disconnect_client(self, client_id):
        self.disconnected.append(client_id)
        self._registry[client_id].connected = False
        return True

    def clear_session(self, client_id):
        self.cleared.append(client_id)
        self._registry.pop(client_id)
        return True

    def delete_retained(self, topic):
        return None

    def publish_local(self, message):
        self.published.append(message)

    def blocked_clients(self):
        return []

    def blocked_client(self, entry_id):
        return None

    def block_client(self, entry):
        return defer.succeed(None)

    def unblock_client(self, entry_id):
        return None

    def unauthorized_attempts(self):
        return []

    unauthorized_evicted = 3

    def clear_unauthorized(self):
        return defer.succeed(0)

    def register_plugin(self, plugin, name=None):
        self.registered.append(name)

    def unregister_plugin(self, plugin):
        self.registered.remove(plugin)


def test_the_fake_offers_exactly_the_view():
    fake = FakeNode(Clock())
    assert {n for n in dir(fake) if not n.startswith("_")} - {
        "registered", "published", "disconnected", "cleared"} == PUBLIC


def test_ops_runs_on_a_view_alone():
    """The metrics, ``$SYS`` and the admin API of a node built on a fake
    view: every figure comes from the view (no ``Broker`` exists)."""
    clock = Clock()
    clock.advance(1000.0)
    fake = FakeNode(clock)
    ops = OpsService(fake, clock)
    assert fake.registered == ["ops"]  # the auth-failure counter, through the view
    run_ = defer.ensureDeferred(ops.start())
    assert run_.called
    published = {m.topic: m.payload for m in fake.published}
    assert published["$SYS/broker/service_id"] == b"fake-1"
    assert published["$SYS/broker/clients/total"] == b"2"
    assert published["$SYS/broker/clients/connected"] == b"1"
    assert published["$SYS/broker/subscriptions/count"] == b"3"
    assert published["$SYS/broker/cluster/nodes"] == b"2"
    assert published["$SYS/broker/messages/received"] == b"7"
    assert ops.stats.retained_messages() == 6  # the node's own $SYS topics not counted
    snapshot = ops.stats.snapshot()
    assert snapshot["node"]["sessions"]["total"] == 1
    assert snapshot["node"]["messages_dropped"] == 2
    assert snapshot["cluster"]["sessions"]["application"] == 1
    nodes = ops.stats.nodes()
    assert [(n["service_id"], n["sessions"], n["listeners"]) for n in nodes] == [
        ("fake-1", 1, [lc.label for lc in fake.config.listeners]),
        ("fake-2", 1, ["tcp:1884"])]
    families = {f.name: f for f in text_string_to_metric_families(
        render(make_registry(ops.stats)).decode())}
    assert families["tbmq_cluster_nodes"].samples[0].value == 2
    assert families["tbmq_cluster_subscriptions"].samples[0].value == 3
    api = AdminApi(fake, ops.stats, History(ops.stats, clock), auth=None, clock=clock)
    node = types.SimpleNamespace(clock=clock, turn=lambda: None)
    shown = run(node, api.show_session(request(), ADMIN, None, "dev-1"))
    assert (shown["queued"], shown["inflight"], len(shown["subscriptions"])) == (4, 2, 1)
    listed = run(node, api.list_sessions(request(connected="false"), ADMIN, None))
    assert [s["client_id"] for s in listed["items"]] == ["app-2"]
    done = run(node, api.disconnect_session(request(), ADMIN, None, "dev-1"))
    assert done["status"] == "disconnected" and fake.disconnected == ["dev-1"]
    done = run(node, api.remove_session(request(), ADMIN, None, "app-2"))
    assert done["status"] == "removed" and fake.cleared == ["app-2"]
    assert run(node, api.list_unauthorized(request(), ADMIN, None)) == {
        "items": [], "total": 0, "evicted": 3}
    assert run(node, api.list_blocked(request(), ADMIN, None)) == {"items": [], "total": 0}
    defer.ensureDeferred(ops.stop())


class Started:
    """A plugin that keeps what the started/stopping hooks gave it."""

    def __init__(self) -> None:
        self.got: list = []

    @hookimpl
    def tbmq_broker_started(self, broker):
        self.got.append(("started", broker))

    @hookimpl
    def tbmq_broker_stopping(self, broker):
        self.got.append(("stopping", broker))


class Connected:
    def __init__(self) -> None:
        self.seen: list = []

    @hookimpl
    def tbmq_client_connected(self, session, connect, address):
        self.seen.append(session.client_id)


def test_plugins_get_the_view_and_register_through_it():
    plugin = Started()
    h = Harness(replace={"started": plugin})
    view = h.broker.view
    assert plugin.got == [("started", view)]
    assert isinstance(view, NodeView) and not hasattr(view, "__dict__")
    # a plugin registered at run time through the view gets its hooks called
    later = Connected()
    view.register_plugin(later, name="later")
    c = h.client("dev-1", level=5)
    h.turn()
    assert later.seen == ["dev-1"] and c is not None
    view.unregister_plugin(later)
    h.client("dev-2", level=5)
    assert later.seen == ["dev-1"]
    h.broker.stop()
    assert plugin.got[-1] == ("stopping", view)


def test_the_view_reads_the_node():
    h = Harness()
    from tbmq.mqtt import Subscribe, SubscriptionRequest  # noqa: PLC0415

    c = h.client("dev-1", level=5)
    c.send(Subscribe(1, [SubscriptionRequest("a/#", 1)]))
    h.turn()
    c.received()
    view = h.broker.view
    assert view.service_id == h.broker.service_id
    assert list(view.sessions()) == ["dev-1"]
    assert view.session("dev-1").connected and view.session("nobody") is None
    assert view.cluster_session("dev-1").service_id == view.service_id
    assert dict(view.subscriptions_of("dev-1"))["a/#"].qos == 1
    assert view.backlog("dev-1") == (0, 0) and view.backlog("nobody") is None
    assert view.connection_count() == 1
    assert view.sessions_by_node() == {view.service_id: 1}
    try:
        view.subscriptions()["x"] = {}
    except TypeError:
        pass
    else:
        raise AssertionError("the view's subscriptions are writable")
    message = Message("$SYS/broker/test", b"1", 0, True, {}, "", h.clock.seconds(), None)
    view.publish_local(message)
    assert view.retained("$SYS/broker/test") is message
    assert [m.topic for m in view.retained_for("$SYS/#")] == ["$SYS/broker/test"]
