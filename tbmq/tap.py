"""``twistd tbmq``: the command-line options and the service maker."""

from __future__ import annotations

import atexit
import gc
import os
import sys

from twisted.python import usage

from tbmq.config import load_config
from tbmq.errors import ConfigError, TbmqError
from tbmq.log import set_log_level

#: the exit status of a configuration error (as the ``tbmq`` command's)
CONFIG_ERROR_STATUS = 2

#: the exit status of a node that could not start with a valid configuration
#: (a listener's address in use, a backend that does not start)
START_ERROR_STATUS = 1


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


#: container allocations (net of deallocations) between two collections
#: of the collector's middle generation, whatever the young threshold
MIDDLE_GENERATION_EVERY = 500_000


def tune_gc(threshold: int) -> None:
    """Set the cyclic garbage collector's thresholds for a broker process:
    the young generation is collected every ``threshold`` container
    allocations (Python's default, 700, runs a collection for every few
    hundred messages in flight: ~10 % of a busy QoS 1 path, see
    ``bench/RESULTS.md``), the middle one every
    :data:`MIDDLE_GENERATION_EVERY` (at least every 10 young collections,
    Python's ratio).  0 keeps Python's thresholds.

    A young collection stops the reactor while it traverses every
    container allocated since the last one and still alive: a burst of
    CONNECTs leaves about 12 per connection, so 50,000 made one stop of
    7-15 ms in a burst of 5,000 (every handshake in flight waits for it,
    the CONNACK p99); 5,000 makes a dozen stops of about 1 ms for the same
    total work, and the middle generation, collected as often as before,
    takes no longer.

    :param threshold: container allocations (net of deallocations) between
        two young-generation collections, >= 0.
    """
    if threshold:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(threshold, max(10, -(-MIDDLE_GENERATION_EVERY // threshold)), gen2)


def tune_threads(switch_interval: float) -> None:
    """Set how long a thread waiting for the GIL waits at most while
    another runs Python (``sys.setswitchinterval``) in a broker process.

    The reactor thread runs Python nearly all the time under load; the
    database thread (:class:`~tbmq.backends.sqlite_runner.SQLiteRunner`)
    lets go of the GIL in every statement and COMMIT and must take it back
    after each, so a transaction of a few statements waited up to Python's
    5 ms that many times, and the publishers of messages to a persistent
    APPLICATION client wait for that COMMIT before their PUBACK.  A thread
    that does not want the GIL costs the reactor nothing more.

    :param switch_interval: seconds, > 0 (``node.switch_interval``).
    """
    sys.setswitchinterval(switch_interval)


def _say(problem: str) -> None:
    """Write ``tbmq: <problem>`` on the process's standard error (twistd
    sends ``sys.stderr`` to the log once it logs)."""
    stream = sys.__stderr__
    if stream is not None:
        stream.write(f"tbmq: {problem}\n")
        stream.flush()


def _one_line_excepthook(previous):
    """A ``sys.excepthook`` that prints a :class:`~tbmq.errors.TbmqError`
    left uncaught (a listener that cannot bind, raised through twistd
    before the reactor runs) as one line, and any other exception with
    ``previous``."""
    def excepthook(kind, value, traceback):
        if isinstance(value, TbmqError):
            _say(" ".join(str(value).split()))
        else:
            previous(kind, value, traceback)

    return excepthook


def _exit_at_the_end(failure) -> None:
    """The node failed once the reactor ran: say why on standard error and
    make the process exit with :data:`START_ERROR_STATUS` once twistd has
    cleaned up (twistd itself exits 0 whenever the reactor stops)."""
    from tbmq.service import startup_problem

    problem = startup_problem(failure)
    _say(problem or f"could not start: {failure.getErrorMessage()} (see the log)")

    def exit_now() -> None:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 -- a closed stream: nothing to flush
                pass
        os._exit(START_ERROR_STATUS)

    atexit.register(exit_now)


def makeService(options):
    """The twistd entry point: a :class:`tbmq.service.BrokerService`; the
    process's garbage collector tuned (:func:`tune_gc`), its file descriptor
    table grown once to its working size
    (:func:`~tbmq.broker.tcp_server.reserve_descriptors`), and once the node is
    up, what it loaded moved out of the collector's sight (``gc.freeze``).

    A bad configuration (file, ``TBMQ_*`` variable, option, endpoint string,
    TLS file, or a backend no plugin provides) prints one line, ``tbmq:
    <key path>: <what is wrong>``, on standard error and exits with status
    2, with no traceback.  A node that cannot start (a listener's address
    in use, a backend that fails) prints one line, ``tbmq: cannot listen on
    tcp:1883: address already in use (listeners[0].endpoint)``, and exits
    with status 1: a listener binds before the reactor runs, so a
    daemonized twistd's parent reports it too; a failure once the reactor
    runs stops it, and the process exits with status 1 after twistd's
    clean-up.

    :raises SystemExit: with status 2 for a :class:`~tbmq.errors.ConfigError`.
    """
    from tbmq.broker.tcp_server import reserve_descriptors
    from tbmq.service import BrokerService

    try:
        config = config_from_options(options)
        set_log_level(config.node.log_level)
        tune_gc(config.node.gc_threshold)
        tune_threads(config.node.switch_interval)
        reserve_descriptors()
        service = BrokerService(config)
    except ConfigError as e:
        print(f"tbmq: {e}", file=sys.stderr)
        raise SystemExit(CONFIG_ERROR_STATUS) from None
    sys.excepthook = _one_line_excepthook(sys.excepthook)
    service.started.addCallbacks(lambda _: gc.freeze(), _exit_at_the_end)
    return service


__all__ = ["Options", "makeService"]
