"""The Kafka message bus (``bus: kafka``), a first-party plugin.

:class:`~tbmq_plugins.kafka.bus.KafkaBus` implements
:class:`tbmq.interfaces.IMessageBus` on Kafka with one of two client
libraries, chosen by ``kafka.driver``: ``confluent`` (confluent-kafka, the
default, ``pip install 'tbmq[kafka]'``) or ``kafka-python``
(``pip install 'tbmq[kafka-python]'``).  The library is imported when the bus is
built, so a node on the in-process bus needs neither.

The package is registered as the ``tbmq`` entry point ``kafka``:
:data:`plugin` implements :func:`tbmq.hookspecs.tbmq_message_bus`.  See
``docs/bus.md`` for what the bus promises and how it is built (modules:
:mod:`.bus`, :mod:`.consumer`, :mod:`.loop`, :mod:`.bridge`,
:mod:`.drivers`, :mod:`.kafka_python`, :mod:`.confluent`).
"""

from __future__ import annotations

from typing import Any

from tbmq.hookspecs import hookimpl

__all__ = ["KafkaPlugin", "plugin"]


class KafkaPlugin:
    """Provides ``bus: kafka`` (:func:`tbmq.hookspecs.tbmq_message_bus`) and
    the ``kafka`` integrations (:func:`tbmq.hookspecs.tbmq_integration_target`)."""

    @hookimpl
    def tbmq_message_bus(self, config: Any, clock: Any) -> Any:
        """:param config: the :class:`tbmq.config.Config`.
        :param clock: the node's reactor.
        :returns: a :class:`~tbmq_plugins.kafka.bus.KafkaBus` on
            ``config.kafka`` when ``config.bus`` is ``kafka``, else None.
        :raises ConfigError: when the library of ``kafka.driver`` is not
            installed (the message says what to install).
        """
        if config.bus != "kafka":
            return None
        from tbmq_plugins.kafka.bus import KafkaBus

        return KafkaBus(config.kafka, clock=clock)

    @hookimpl
    def tbmq_integration_target(self, config: Any, node_config: Any, reactor: Any) -> Any:
        """:returns: a :class:`~tbmq_plugins.kafka.integration.KafkaTarget`
        for an integration of type ``kafka``, else None.
        :raises ConfigError: when the library of ``kafka.driver`` is not
            installed."""
        if config.type != "kafka":
            return None
        from tbmq_plugins.kafka.integration import KafkaTarget

        return KafkaTarget(config, reactor, node_config.kafka)


#: The plugin object of the ``tbmq`` entry point ``kafka``.
plugin = KafkaPlugin()
