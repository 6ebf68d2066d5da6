"""``twistd tbmq``: the command-line options and the service maker."""

from __future__ import annotations

import gc
import sys

from twisted.python import usage

from tbmq.config import load_config
from tbmq.errors import ConfigError
from tbmq.log import set_log_level

#: the exit status of a configuration error (as the ``tbmq`` command's)
CONFIG_ERROR_STATUS = 2


class Options(usage.Options):
    """``twistd -n tbmq [--config PATH] [--listen ENDPOINT ...] [--data-dir DIR]``"""

    synopsis = "[--config PATH] [--listen ENDPOINT ...] [--data-dir DIR]"
    longdesc = ("Run a tbmq MQTT broker node. Without a config, the embedded default: "
                "one node, in-process bus, SQLite in the data directory, listening on tcp:1883.")
    optParameters = [
        ["config", "c", None, "YAML config file (default: built-in defaults, see etc/tbmq.yml)"],
        ["data-dir", "d", None, "data directory (overrides data_dir)"],
    ]

    def __init__(self) -> None:
        super().__init__()
        self["listen"] = []

    def opt_listen(self, endpoint: str) -> None:
        """A Twisted server endpoint string (tcp:1884:interface=127.0.0.1); may
        be given more than once; replaces the configured listeners."""
        self["listen"].append(endpoint)

    opt_l = opt_listen


def config_from_options(options) -> "object":
    """Build the :class:`tbmq.config.Config` from parsed options: each
    ``--listen ENDPOINT`` is a ``tcp`` listener named ``ENDPOINT``.

    :raises tbmq.errors.ConfigError: on a bad file, key or value.
    """
    overrides: dict = {}
    if options["data-dir"]:
        overrides["data_dir"] = options["data-dir"]
    if options["listen"]:
        # named by their endpoint: a stable name (the ``listener`` label of
        # the metrics) whatever the order of the options
        overrides["listeners"] = [
            {"name": endpoint, "type": "tcp", "endpoint": endpoint}
            for endpoint in options["listen"]
        ]
    return load_config(options["config"], overrides=overrides)


def tune_gc(threshold: int) -> None:
    """Set the cyclic garbage collector's first-generation threshold for a
    broker process (Python's default, 700, runs a collection for every few
    hundred messages in flight: ~10 % of a busy QoS 1 path, see
    ``bench/RESULTS.md``); 0 keeps Python's thresholds.

    :param threshold: container allocations (net of deallocations) between
        two young-generation collections.
    """
    if threshold:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(threshold, gen1, gen2)


def makeService(options):
    """The twistd entry point: a :class:`tbmq.service.BrokerService`; the
    process's garbage collector tuned (:func:`tune_gc`), and once the node is
    up, what it loaded moved out of the collector's sight (``gc.freeze``).

    A bad configuration (file, ``TBMQ_*`` variable, option, or a backend no
    plugin provides) prints one line, ``tbmq: <key path>: <what is
    wrong>``, on standard error and exits with status 2, with no traceback.

    :raises SystemExit: with status 2 for a :class:`~tbmq.errors.ConfigError`.
    """
    from tbmq.service import BrokerService

    try:
        config = config_from_options(options)
        set_log_level(config.node.log_level)
        tune_gc(config.node.gc_threshold)
        service = BrokerService(config)
    except ConfigError as e:
        print(f"tbmq: {e}", file=sys.stderr)
        raise SystemExit(CONFIG_ERROR_STATUS) from None
    service.started.addCallback(lambda _: gc.freeze())
    return service


__all__ = ["Options", "makeService"]
