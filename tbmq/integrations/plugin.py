"""The node's integrations: the ones of its config file, and the ones
added through the admin API, which every node of the cluster reads from
the compacted bus topic ``tbmq.integrations``.

Messages reach them through ``tbmq_message_published``: the node that
accepted a PUBLISH (or publishes a will) calls it once, so each message
reaches each matching integration once in the whole cluster, on the node
that accepted it, and the embedded node works the same.  That hook is
implemented by a small plugin (:class:`PublishHook`) registered only
while the node has an integration, so a node without any pays nothing per
message; with some, the routing of a message to its subscribers is not
slowed beyond one trie lookup (cached per topic name) and, for a match,
one append to a buffer.

A record of ``tbmq.integrations`` has the integration's name as its key
and its settings as a JSON object (the keys of
:class:`~tbmq.integrations.settings.IntegrationConfig`) as its value; an
empty value removes it.  Each node reads the topic from its beginning at
start (its own consumer group), so an integration added through the API
runs on every node, also one started later, and on the embedded node
after a restart (the topic is durable).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import fields

from twisted.internet import defer
from twisted.logger import Logger

from tbmq.broker.trie import SubscriptionTrie
from tbmq.cluster.completion import deferred_done
from tbmq.cluster.topics import node_group
from tbmq.errors import ConfigError
from tbmq.hookspecs import hookimpl
from tbmq.integrations.core import Integration
from tbmq.log import OBSERVER as LOG_OBSERVER

__all__ = ["Integrations", "IntegrationConflict", "PublishHook", "make_target", "settings_of"]

#: seconds the node's stop waits at most for each integration's buffer to empty
STOP_GRACE = 5.0


class IntegrationConflict(Exception):
    """The name belongs to an integration of the config file (which only
    the file changes)."""


def make_target(config, node_config, reactor, plugins=None):
    """The target of one integration: ``http`` and ``mqtt`` built in, any
    other type from the plugins' ``tbmq_integration_target`` hook (the
    ``kafka`` plugin's ``kafka``).

    :param config: the :class:`~tbmq.integrations.settings.IntegrationConfig`.
    :param node_config: the node's :class:`tbmq.config.Config` (the
        ``kafka`` section gives a ``kafka`` integration's defaults).
    :param plugins: the plugin manager, or None.
    :returns: a :class:`~tbmq.integrations.core.Target`.
    :raises ConfigError: no plugin provides the type.
    """
    if config.type == "http":
        from tbmq.integrations.http import HttpTarget
        return HttpTarget(config, reactor)
    if config.type == "mqtt":
        from tbmq.integrations.mqtt import MqttTarget
        return MqttTarget(config, reactor)
    target = None
    if plugins is not None:
        target = plugins.hook.tbmq_integration_target(config=config, node_config=node_config,
                                                      reactor=reactor)
    if target is None:
        raise ConfigError(f"integrations[{config.name!r}].type: no plugin provides type "
                          f"{config.type} (the first-party plugin 'kafka' provides kafka)",
                          "integrations")
    return target


def settings_of(data) -> object:
    """Check one integration's settings as the config file's are checked.

    :param data: a mapping of :class:`~tbmq.integrations.settings.IntegrationConfig`
        keys.
    :returns: the :class:`~tbmq.integrations.settings.IntegrationConfig`.
    :raises ConfigError: ``integrations[0].url: an http:// or https:// URL
        is required for type http`` ...
    """
    from tbmq.config import load_config

    return load_config(environ={}, overrides={"integrations": [data]}).integrations[0]


def _as_json(settings) -> dict:
    """The settings of an integration as the JSON of its bus record (a
    field each; ``dataclasses.asdict`` cannot copy the read-only maps)."""
    data = {f.name: getattr(settings, f.name) for f in fields(settings)}
    data["headers"] = dict(settings.headers)
    data["topic_filters"] = list(settings.topic_filters)
    for name, value in data.items():
        if isinstance(value, Mapping):
            data[name] = dict(value)
    return data


class PublishHook:
    """The ``tbmq_message_published`` hook of the integrations, registered
    as the plugin ``integrations-publish`` while there is one."""

    def __init__(self, integrations: "Integrations") -> None:
        self.integrations = integrations

    @hookimpl
    def tbmq_message_published(self, session, message):
        """Offer ``message`` to each enabled integration one of whose topic
        filters matches its topic name (once, however many match)."""
        matches = self.integrations.trie.match(message.topic)
        if not matches:
            return
        if len(matches) == 1 and len(matches[0]) == 1:
            for integration in matches[0].values():
                integration.offer(message)
            return
        seen = set()
        for found in matches:
            for name, integration in found.items():
                if name not in seen:
                    seen.add(name)
                    integration.offer(message)


class Integrations:
    """The node's integrations, registered as the plugin ``integrations``.

    :param config: the node's :class:`tbmq.config.Config`.
    :param reactor: the reactor.
    :param plugins: the plugin manager: targets of other types than
        ``http`` and ``mqtt``, and where :class:`PublishHook` is registered;
        None in tests that call :meth:`offer` themselves.
    :raises ConfigError: an integration's type that no plugin provides.
    :ivar integrations: name → :class:`~tbmq.integrations.core.Integration`.
    :ivar from_file: the names of the config file's integrations.
    :ivar refresh_hooks: called after :class:`PublishHook` is registered at
        run time (the broker's ``refresh_hooks``; set by its owner).
    """

    log = Logger(observer=LOG_OBSERVER)

    def __init__(self, config, reactor, plugins=None) -> None:
        self.config = config
        self.reactor = reactor
        self.plugins = plugins
        self.integrations: dict[str, Integration] = {}
        self.from_file = {settings.name for settings in config.integrations}
        self.trie = SubscriptionTrie()
        self.hook = PublishHook(self)
        self.refresh_hooks = lambda: None
        self.running = False
        self.bus = None
        self.topic = None
        for settings in config.integrations:
            self.add(settings)

    def add(self, settings) -> Integration:
        """Add one integration (started when the others are).

        :param settings: its :class:`~tbmq.integrations.settings.IntegrationConfig`.
        """
        integration = Integration(settings, make_target(settings, self.config, self.reactor,
                                                        self.plugins), self.reactor)
        self.integrations[settings.name] = integration
        if settings.enabled:
            for topic_filter in settings.topic_filters:
                self.trie.add(topic_filter, settings.name, integration)
            plugins = self.plugins
            if plugins is not None and not plugins.is_registered(self.hook):
                plugins.register(self.hook, name="integrations-publish")
                self.refresh_hooks()
            if self.running:
                self._start(integration)
        return integration

    def remove(self, name: str) -> defer.Deferred:
        """Stop and forget integration ``name`` (what its buffer holds after
        :data:`STOP_GRACE` seconds is lost, logged)."""
        integration = self.integrations.pop(name)
        for topic_filter in integration.config.topic_filters:
            self.trie.remove(topic_filter, name)
        if not integration.running:
            return defer.succeed(None)
        return defer.ensureDeferred(integration.stop(STOP_GRACE))

    def offer(self, message) -> None:
        """:meth:`PublishHook.tbmq_message_published` without a session."""
        self.hook.tbmq_message_published(None, message)

    # -- life cycle --------------------------------------------------------------

    def _start(self, integration: Integration) -> None:
        integration.start()
        self.log.info("integration {name} ({type}) on {filters}", name=integration.name,
                      type=integration.config.type,
                      filters=", ".join(integration.config.topic_filters))

    def start(self, bus=None, topics=None, service_id: str = "") -> defer.Deferred:
        """Start the integrations, then read ``tbmq.integrations``.

        :param bus: the node's :class:`tbmq.interfaces.IMessageBus`, or None
            (no integrations from the API).
        :param topics: its :class:`tbmq.cluster.topics.TopicCatalogue`.
        :param service_id: this node's service id (its consumer group).
        :returns: a Deferred firing once the topic was read to its end.
        """
        self.running = True
        for integration in self.integrations.values():
            if integration.config.enabled:
                self._start(integration)
        if bus is None:
            return defer.succeed(None)
        self.bus = bus
        self.topic = topics.integrations
        consumer = bus.subscribe(self.topic, node_group(service_id), self._on_record,
                                 from_beginning=True, exclusive=True)
        return consumer.caught_up

    async def stop(self) -> None:
        """Stop every integration, each after up to :data:`STOP_GRACE`
        seconds to empty its buffer."""
        self.running = False
        await defer.gatherResults([
            defer.ensureDeferred(i.stop(STOP_GRACE)) for i in self.integrations.values()
            if i.running], consumeErrors=True)

    # -- the integrations of the API ---------------------------------------------

    def _on_record(self, record):
        """One record of ``tbmq.integrations``: add, replace or remove."""
        name = record.key
        if name in self.from_file:
            self.log.warn("integration {name} of tbmq.integrations ignored: this node's config "
                          "file has one of that name", name=name)
            return None
        try:
            settings = settings_of(json.loads(record.value)) if record.value else None
        except (ConfigError, ValueError) as e:
            self.log.warn("integration {name} of tbmq.integrations ignored: {error}",
                          name=name, error=e)
            return None
        if name in self.integrations:  # its buffer empties in the background
            self.remove(name).addErrback(
                lambda f: self.log.failure("integration {name} did not stop", f, name=name))
        if settings is not None and settings.name == name:
            try:
                self.add(settings)
            except ConfigError as e:
                self.log.warn("integration {name} of tbmq.integrations ignored: {error}",
                              name=name, error=e)
                return None
            self.log.info("integration {name} set through the API", name=name)
        else:
            self.log.info("integration {name} removed through the API", name=name)
        return None

    async def put(self, data: dict) -> str:
        """Add or replace an integration on every node.

        :param data: its settings (the keys of the config file's entries).
        :returns: its name, once the bus holds the record.
        :raises ConfigError: bad settings (the message names the key).
        :raises IntegrationConflict: the config file has one of that name.
        :raises tbmq.errors.BusError: the bus did not take the record.
        """
        settings = settings_of(data)
        if settings.name in self.from_file:
            raise IntegrationConflict(f"integration {settings.name} is in the config file")
        value = json.dumps(_as_json(settings)).encode("utf-8")
        await self._publish(settings.name, value)
        return settings.name

    async def delete(self, name: str) -> None:
        """Remove an integration added through the API, on every node.

        :raises KeyError: no such integration here.
        :raises IntegrationConflict: it is one of the config file.
        """
        if name in self.from_file:
            raise IntegrationConflict(f"integration {name} is in the config file")
        if name not in self.integrations:
            raise KeyError(name)
        await self._publish(name, b"")

    def _publish(self, key: str, value: bytes) -> defer.Deferred:
        if self.bus is None:
            raise ConfigError("integrations: the node is not started")
        return deferred_done(lambda done: self.bus.publish(self.topic, key, value, (), done))

    # -- figures ----------------------------------------------------------------------

    def collector(self):
        """:returns: the :class:`~tbmq.integrations.metrics.IntegrationsCollector`
        of the integrations, for ``/metrics``."""
        from tbmq.integrations.metrics import IntegrationsCollector
        return IntegrationsCollector(self)

    def snapshot(self) -> list[dict]:
        """:returns: :meth:`Integration.snapshot` of each integration, with
        ``"source"``: ``config`` or ``api``."""
        found = []
        for integration in self.integrations.values():
            item = integration.snapshot()
            item["source"] = "config" if integration.name in self.from_file else "api"
            found.append(item)
        return found
