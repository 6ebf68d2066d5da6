"""The plugin that hands the node's messages to its integrations.

It implements ``tbmq_message_published``: the node that accepted a PUBLISH
(or publishes a will) calls it once, so each message reaches each matching
integration once in the whole cluster, on the node that accepted it, and
the embedded node works the same.  The routing of the message to its
subscribers is not slowed beyond one trie lookup (cached per topic name)
and, for a match, one append to a buffer.
"""

from __future__ import annotations

from twisted.internet import defer
from twisted.logger import Logger

from tbmq.broker.trie import SubscriptionTrie
from tbmq.errors import ConfigError
from tbmq.hookspecs import hookimpl
from tbmq.integrations.core import Integration
from tbmq.log import OBSERVER as LOG_OBSERVER

__all__ = ["Integrations", "make_target"]

#: seconds the node's stop waits at most for each integration's buffer to empty
STOP_GRACE = 5.0


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


class Integrations:
    """The node's integrations, registered as the plugin ``integrations``.

    :param config: the node's :class:`tbmq.config.Config`.
    :param reactor: the reactor.
    :param plugins: the plugin manager (targets of other types than
        ``http`` and ``mqtt``), or None.
    :raises ConfigError: an integration's type that no plugin provides.
    :ivar integrations: name → :class:`~tbmq.integrations.core.Integration`,
        in the order of the config.
    """

    log = Logger(observer=LOG_OBSERVER)

    def __init__(self, config, reactor, plugins=None) -> None:
        self.config = config
        self.reactor = reactor
        self.plugins = plugins
        self.integrations: dict[str, Integration] = {}
        self.trie = SubscriptionTrie()
        for settings in config.integrations:
            self.add(settings)

    def add(self, settings) -> Integration:
        """Add one integration (not started).

        :param settings: its :class:`~tbmq.integrations.settings.IntegrationConfig`.
        """
        integration = Integration(settings, make_target(settings, self.config, self.reactor,
                                              self.plugins),
                                  self.reactor)
        self.integrations[settings.name] = integration
        if settings.enabled:
            for topic_filter in settings.topic_filters:
                self.trie.add(topic_filter, settings.name, integration)
        return integration

    def start(self) -> None:
        for integration in self.integrations.values():
            if integration.config.enabled:
                integration.start()
                self.log.info("integration {name} ({type}) on {filters}",
                              name=integration.name, type=integration.config.type,
                              filters=", ".join(integration.config.topic_filters))

    async def stop(self) -> None:
        """Stop every integration, each after up to :data:`STOP_GRACE`
        seconds to empty its buffer."""
        await defer.gatherResults([
            defer.ensureDeferred(i.stop(STOP_GRACE)) for i in self.integrations.values()
            if i.running], consumeErrors=True)

    @hookimpl
    def tbmq_message_published(self, session, message):
        """Offer ``message`` to each enabled integration one of whose topic
        filters matches its topic name (once, however many match)."""
        matches = self.trie.match(message.topic)
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

    def collector(self):
        """:returns: the :class:`~tbmq.integrations.metrics.IntegrationsCollector`
        of the integrations, for ``/metrics``."""
        from tbmq.integrations.metrics import IntegrationsCollector
        return IntegrationsCollector(self)

    def snapshot(self) -> list[dict]:
        """:returns: :meth:`Integration.snapshot` of each integration."""
        return [i.snapshot() for i in self.integrations.values()]
