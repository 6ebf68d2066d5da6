"""``twistd tbmq``: the command-line options and the service maker."""

from __future__ import annotations

from twisted.python import usage

from tbmq.config import load_config


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
    """Build the :class:`tbmq.config.Config` from parsed options.

    :raises tbmq.errors.ConfigError: on a bad file, key or value.
    """
    overrides: dict = {}
    if options["data-dir"]:
        overrides["data_dir"] = options["data-dir"]
    if options["listen"]:
        overrides["listeners"] = [
            {"name": f"listen{i}", "type": "tcp", "endpoint": endpoint}
            for i, endpoint in enumerate(options["listen"])
        ]
    return load_config(options["config"], overrides=overrides)


def makeService(options):
    """The twistd entry point: a :class:`tbmq.service.BrokerService`."""
    from tbmq.service import BrokerService

    return BrokerService(config_from_options(options))


__all__ = ["Options", "makeService"]
