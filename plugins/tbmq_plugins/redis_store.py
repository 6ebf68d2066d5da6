"""The Redis device message store (``storage.device_store: redis``), TBMQ's
store of persistent DEVICE sessions' messages in a cluster.

:class:`RedisDeviceMessageStore` keeps TBMQ's layout (a sorted set per
client, scored by ``seq``, and a key per message; see
:mod:`tbmq_plugins.redis_scripts`) and writes it with Lua scripts, loaded
once per connection (``SCRIPT LOAD``) and run with ``EVALSHA``, each call
one atomic script: an ``add`` stores its deliveries, trims the client's
queue to ``max_messages_per_client`` and sets the TTL at once, as TBMQ's
``ADD_MESSAGES_SCRIPT`` does.

Order: every call for one client id goes to one of the ``pool_size``
connections (a CRC-32 of the client id), where Redis runs the commands in
the order they were sent; calls do not wait for each other, so calls of
many clients travel together (Twisted writes what a reactor turn sent in
one go).  The writes (``add``, ``update``, ``remove``) a connection gets
in one reactor turn, or while its previous batch is in flight, go as one
script call (:data:`~tbmq_plugins.redis_scripts.WRITE_BATCH`; a lone one
as its own script), sent at the end of the turn, when the batch in flight
is answered, or before the next read (``load``, ``count``) or ``clear`` on
that connection, so that the connection keeps the call order; each
write's Deferred fires when Redis has run the script.  A batch is atomic:
when its script fails, every write in it fails (a Redis error, a lost
connection), none of them half-written.

Outages: a call made while its connection is down fails at once with
:class:`~tbmq.errors.BackendError`, as do the calls in flight when it
drops; the connection comes back by itself (:mod:`tbmq_plugins.redis_connections`),
and the store logs the loss and the recovery once each.

The module is also a plugin: :data:`plugin` implements
:func:`tbmq.hookspecs.tbmq_device_message_store`, registered as the
``tbmq`` entry point ``redis`` (``pip install 'tbmq[redis]'``: txredisapi).
"""

from __future__ import annotations

import zlib
from typing import Any, Iterable

import msgpack
from twisted.internet import defer, error
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from tbmq.backends.deliveries import (
    RunsAsAdds,
    check_limit,
    check_page,
    decode_delivery,
    encode_delivery,
)
from tbmq.errors import BackendError
from tbmq.hookspecs import hookimpl
from tbmq.interfaces import IDeviceMessageStore
from tbmq.log import OBSERVER as LOG_OBSERVER
from tbmq.model import StoredDelivery
from tbmq_plugins import redis_scripts as scripts
from tbmq_plugins.redis_connections import RedisConnection, parse_redis_url

__all__ = ["RedisDeviceMessageStore", "RedisPlugin", "plugin"]

log = Logger(observer=LOG_OBSERVER)

#: A ``seq`` is written as a sorted set member with this many digits.
SEQ_DIGITS = 19
#: ``seq`` values lie in [0, SEQ_END): a non-negative bigint, as the other
#: stores keep (a nanosecond timestamp until the year 2262).
SEQ_END = 1 << 63


def _member(seq: Any) -> str:
    """:returns: the sorted set member of ``seq``.
    :raises TypeError: when it is not an int.
    :raises ValueError: when it is not in [0, 2**63)."""
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise TypeError(f"seq must be an int, not {seq!r}")
    if not 0 <= seq < SEQ_END:
        raise ValueError(f"the Redis device store keeps seqs in [0, 2**63), not {seq}")
    return f"{seq:019d}"


@implementer(IDeviceMessageStore)
class RedisDeviceMessageStore(RunsAsAdds):
    """:class:`~tbmq.interfaces.IDeviceMessageStore` in Redis.

    :param url: ``redis://[[user]:password@]host[:port][/db]`` (``rediss://``
        for TLS).
    :param pool_size: connections kept open (>= 1); a client's calls all
        use one of them.
    :param key_prefix: prepended to every key (several clusters may share
        one Redis); it should not contain ``{``, which would change the
        keys' Redis Cluster hash tag.
    :param message_ttl: seconds each stored delivery is kept after its
        ``add`` (TBMQ's ``persisted-messages.ttl``, a week by default), or
        None for ever.
    :param max_messages_per_client: the most deliveries kept per client
        (the lowest seqs go beyond it, see :meth:`add`; TBMQ's
        ``persisted-messages.limit``), or None for no limit.
    :param reactor: the reactor to run on; the global one when None.
    :param connect_timeout: seconds to wait for a TCP connection.
    :param reply_timeout: seconds to wait for a reply before the connection
        is dropped (its calls fail), or None.
    :raises ValueError: for a bad URL, pool size, TTL or limit.

    ``seq`` values must lie in [0, 2**63) (the broker's are nanosecond
    timestamps).  Calls made before :meth:`start` or after :meth:`stop`
    fail with :class:`~tbmq.errors.BackendError`.
    """

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", pool_size: int = 4,
                 key_prefix: str = "tbmq:", message_ttl: int | None = 604800,
                 max_messages_per_client: int | None = None, reactor: Any = None,
                 connect_timeout: float = 5.0, reply_timeout: float | None = 10.0) -> None:
        self.target = parse_redis_url(url)
        if int(pool_size) < 1:
            raise ValueError(f"pool_size must be >= 1, not {pool_size}")
        if message_ttl is not None and int(message_ttl) < 1:
            raise ValueError(f"message_ttl must be >= 1 or None, not {message_ttl}")
        self.pool_size = int(pool_size)
        self.key_prefix = key_prefix
        self.message_ttl = None if message_ttl is None else int(message_ttl)
        self.max_messages_per_client = check_limit(max_messages_per_client)
        if reactor is None:
            from twisted.internet import reactor  # noqa: PLC0415
        self._reactor = reactor
        self._connect_timeout = connect_timeout
        self._reply_timeout = reply_timeout
        self._connections: list[RedisConnection] = []
        self._running = False
        self._healthy = True
        self._pending: set[defer.Deferred] = set()
        #: connection index -> the writes and reads not sent yet:
        #: [(key, write, waiter)], each as
        #: :data:`~tbmq_plugins.redis_scripts.WRITE_BATCH` takes it
        self._batches: dict[int, list] = {}
        #: the connection indexes with a batch of writes in flight
        self._busy: set[int] = set()
        self._flush_call: Any = None

    # -- life cycle ---------------------------------------------------------

    @property
    def running(self) -> bool:
        """True between a successful :meth:`start` and :meth:`stop`."""
        return self._running

    def start(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IBackend.start`: open the
        ``pool_size`` connections and load the scripts on each.

        :returns: a Deferred firing with None when every connection is
            usable, or failing with :class:`~tbmq.errors.BackendError` when
            Redis cannot be reached (or refuses the password, the database,
            a script); nothing is left running then.
        """
        if self._running:
            return defer.succeed(None)
        if not self._connections:
            self._connections = [
                RedisConnection(self.target, self._reactor, scripts.SCRIPTS,
                                self._connection_up, self._connection_down,
                                self._connect_timeout, self._reply_timeout)
                for _ in range(self.pool_size)
            ]
        d = defer.gatherResults([c.start() for c in self._connections], consumeErrors=True)

        def started(_: Any) -> None:
            self._running = self._healthy = True

        def failed(failure: Failure) -> defer.Deferred:
            if isinstance(failure.value, defer.FirstError):
                failure = failure.value.subFailure
            reason = BackendError(
                f"Redis device store: cannot use {self.target}: {failure.getErrorMessage()}")
            return self._close().addCallback(lambda _: Failure(reason))

        return d.addCallbacks(started, failed)

    def stop(self) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IBackend.stop`: wait for the
        calls in flight, then close the connections.

        :returns: a Deferred firing with None when closed.
        """
        self._flush_batches()
        self._running = False
        pending = list(self._pending)
        d = defer.DeferredList(pending, consumeErrors=True) if pending else defer.succeed(None)
        return d.addCallback(lambda _: self._close())

    def _close(self) -> defer.Deferred:
        connections, self._connections = self._connections, []
        d = defer.gatherResults([c.stop() for c in connections], consumeErrors=True)
        return d.addCallback(lambda _: None)

    def _connection_up(self, connection: RedisConnection) -> None:
        if not self._healthy and all(c.protocol is not None for c in self._connections):
            self._healthy = True
            log.info("Redis device store: connected to {target} again", target=str(self.target))

    def _connection_down(self, connection: RedisConnection) -> None:
        if self._healthy and self._running:
            self._healthy = False
            log.warn("Redis device store: lost a connection to {target}; its calls fail "
                     "until it is back", target=str(self.target))

    # -- calls --------------------------------------------------------------

    def _queue_key(self, client_id: str) -> str:
        """:returns: the key of the client's sorted set (TBMQ's
        ``ClientIdMessagesCacheKey``)."""
        return f"{self.key_prefix}{{{client_id}}}_messages"

    def _index(self, client_id: str) -> int:
        """:returns: the index of ``client_id``'s connection."""
        return zlib.crc32(client_id.encode("utf-8", "surrogatepass")) % len(self._connections)

    def _run(self, client_id: str, script: scripts.Script, args: list) -> defer.Deferred:
        """Run ``script`` for ``client_id`` on the client's connection, after
        the writes of this reactor turn that went to it.

        :returns: a Deferred firing with the script's reply, or failing
            with :class:`~tbmq.errors.BackendError` (not running, not
            connected, connection lost, a Redis error)."""
        if not self._running:
            return defer.fail(BackendError("Redis device store is not running"))
        index = self._index(client_id)
        if index in self._batches:
            self._send_batch(index, self._batches.pop(index))
        return self._send(index, script, (self._queue_key(client_id),), args)

    def _send(self, index: int, script: scripts.Script, keys: tuple,
              args: list) -> defer.Deferred:
        """Send ``EVALSHA script keys args`` on connection ``index`` now.

        :returns: a Deferred as :meth:`_run`'s."""
        protocol = self._connections[index].protocol
        if protocol is None:
            return defer.fail(BackendError(
                f"Redis device store: not connected to {self.target}"))
        try:
            d = protocol.evalsha(script.sha, keys, args)
        except Exception:
            d = defer.fail()
        d.addErrback(self._reload, protocol, script, keys, args)
        d.addCallback(self._in_step, protocol, script)
        d.addErrback(self._translate)
        self._pending.add(d)

        def finished(result: Any) -> Any:
            self._pending.discard(d)
            return result

        return d.addBoth(finished)

    def _write(self, client_id: str, write: list) -> defer.Deferred:
        """Queue ``write``, a write or a read (see
        :data:`~tbmq_plugins.redis_scripts.WRITE_BATCH`), into its
        connection's batch, sent at the end of this reactor turn, or when
        the connection's batch in flight is answered.

        :returns: a Deferred firing with its result (an add's trim count, a
            read's msgpack array, else 0) once Redis ran the batch, or
            failing as :meth:`_run`'s."""
        if not self._running:
            return defer.fail(BackendError("Redis device store is not running"))
        waiter: defer.Deferred = defer.Deferred()
        index = self._index(client_id)
        self._batches.setdefault(index, []).append((self._queue_key(client_id), write, waiter))
        if self._flush_call is None and index not in self._busy:
            self._flush_call = self._reactor.callLater(0, self._flush_batches, False)
        return waiter

    def _flush_batches(self, everything: bool = True) -> None:
        """Send the connections' batches of writes: all of them, or (at the end
        of a reactor turn) those of the connections with no batch in flight,
        the others going when their batch in flight is answered."""
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        for index in list(self._batches):
            if everything or index not in self._busy:
                self._send_batch(index, self._batches.pop(index))

    def _send_batch(self, index: int, batch: list) -> None:
        """Send the writes of ``batch`` (``[(key, write, waiter)]``) on
        connection ``index`` as one script call, and fire each waiter with
        its result, or all of them with the batch's failure."""
        head = [self.max_messages_per_client or 0, self.message_ttl or 0]
        self._busy.add(index)
        if len(batch) == 1:
            key, write, waiter = batch[0]
            if write[0] == "a":
                script, args = scripts.ADD, head + [msgpack.packb(write[1], use_bin_type=False)]
            elif write[0] == "u":
                script, args = scripts.UPDATE, write[1:]
            elif write[0] == "l":
                script, args = scripts.LOAD, write[1:]
            else:
                script, args = scripts.REMOVE, write[1]
            d = self._send(index, script, (key,), args)
            d.addBoth(self._answered, index).chainDeferred(waiter)
            return
        d = self._send(index, scripts.WRITE_BATCH, tuple(key for key, _, _ in batch),
                       head + [msgpack.packb([write for _, write, _ in batch],
                                             use_bin_type=False)])

        def replied(counts: list) -> None:
            for (_, _, waiter), count in zip(batch, counts):
                waiter.callback(count)

        def failed(failure: Failure) -> None:
            for _, _, waiter in batch:
                waiter.errback(failure)

        d.addBoth(self._answered, index).addCallbacks(replied, failed)

    def _answered(self, result: Any, index: int) -> Any:
        """A batch of connection ``index`` is answered: send the writes that
        waited for it (before its callers run: what they write next goes in
        a later batch).

        :returns: ``result``."""
        self._busy.discard(index)
        batch = self._batches.pop(index, None)
        if batch:
            self._send_batch(index, batch)
        return result

    def _in_step(self, reply: Any, protocol: Any, script: scripts.Script) -> Any:
        """Check the type of ``script``'s reply: LOAD answers bytes (one
        msgpack array), every other script an integer.  Another type is
        another call's reply: the connection's replies came out of step
        with its calls (txredisapi after a reply timeout), so calls on it
        may answer for calls that were never done.  The connection is
        dropped (its calls in flight fail, their callers retry) and this
        call fails with :class:`~tbmq.errors.BackendError`.

        :returns: ``reply``."""
        expected = {scripts.LOAD: bytes, scripts.WRITE_BATCH: list}.get(script, int)
        if isinstance(reply, expected):
            return reply
        log.warn("Redis device store: {target} answered the {name} script with {reply!r:.40}: "
                 "its replies are out of step with the calls; dropping the connection",
                 target=str(self.target), name=script.name, reply=reply)
        transport = getattr(protocol, "transport", None)
        if transport is not None:
            transport.abortConnection()
        raise BackendError(f"Redis device store ({self.target}): a reply out of step with "
                           f"its call ({script.name})")

    def _reload(self, failure: Failure, protocol: Any, script: scripts.Script, keys: tuple,
                args: list) -> defer.Deferred:
        """On NOSCRIPT (the server's script cache was flushed): load the
        script again and run the call once more, both sent at once, so the
        calls that follow it on the connection stay after it."""
        import txredisapi  # noqa: PLC0415

        failure.trap(txredisapi.ScriptDoesNotExist)
        log.info("Redis device store: {target} lost the script {name}; loading it again",
                 target=str(self.target), name=script.name)
        protocol.script_load(script.source).addErrback(lambda _: None)  # the retry reports it
        return protocol.evalsha(script.sha, keys, args)

    def _translate(self, failure: Failure) -> Failure:
        import txredisapi  # noqa: PLC0415

        if failure.check(txredisapi.RedisError, error.ConnectionLost, error.ConnectionDone,
                         error.ConnectError):
            return Failure(BackendError(
                f"Redis device store ({self.target}): {failure.getErrorMessage()}"))
        return failure

    def add(self, client_id: str, deliveries: Iterable[StoredDelivery]) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.add`: one
        script stores the deliveries (one already there by ``seq`` is
        replaced), gives them the TTL, and trims the client's oldest beyond
        the limit.

        :param client_id: the persistent session's client id.
        :param deliveries: the deliveries; their values are read now.
        :returns: a Deferred firing with the number of the client's stored
            deliveries removed by the trim (an expired one does not count),
            or failing with :class:`TypeError`/:class:`ValueError` for a
            bad ``seq``, :class:`~tbmq.errors.RecordEncodingError` for a
            delivery that cannot be encoded, or
            :class:`~tbmq.errors.BackendError`.
        """
        items: list = []
        try:
            for d in deliveries:
                items += [_member(d.seq), str(d.seq), encode_delivery(client_id, d),
                          "" if d.packet_id is None else str(int(d.packet_id)),
                          str(int(d.state))]
        except Exception:
            return defer.fail()
        if not items and self._running:
            return defer.succeed(0)
        return self._write(client_id, ["a", items])

    def update(self, client_id: str, seq: int, packet_id: int | None,
               state: int) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.update`: one
        script sets the packet id (int, or None) and
        :class:`~tbmq.model.DeliveryState` of delivery ``seq`` of
        ``client_id``, whose TTL stays; an unknown ``seq`` is ignored.

        :returns: a Deferred firing with None once Redis has it, or failing
            with :class:`~tbmq.errors.BackendError`.
        """
        try:
            write = ["u", _member(seq), "" if packet_id is None else str(int(packet_id)),
                     str(int(state))]
        except Exception:
            return defer.fail()
        return self._write(client_id, write).addCallback(lambda _: None)

    def remove(self, client_id: str, seqs: Iterable[int]) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.remove`.

        :param client_id: the persistent session's client id.
        :param seqs: the order keys to drop; unknown ones are ignored.
        :returns: a Deferred firing with None once Redis has it.
        """
        try:
            members = [_member(seq) for seq in seqs]
        except Exception:
            return defer.fail()
        if not members and self._running:
            return defer.succeed(None)
        return self._write(client_id, ["r", members]).addCallback(lambda _: None)

    def load(self, client_id: str, after_seq: int | None = None,
             limit: int | None = None) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.load`: the
        read joins the writes of this reactor turn to the client's
        connection, in call order (one script call for the turn's reads
        and writes of a connection: the reads of a burst of resumed
        sessions cost one call, not one each).

        :param client_id: the persistent session's client id.
        :param after_seq: only deliveries with a greater ``seq``; all when
            None.
        :param limit: at most this many (>= 0); all when None.
        :returns: a Deferred firing with the ``list[StoredDelivery]`` in
            ``seq`` order (expired ones left out), or failing with
            :class:`ValueError` (a negative ``limit``), :class:`TypeError`
            (not an int) or :class:`~tbmq.errors.BackendError`.
        """
        try:
            check_page(after_seq, limit)
        except (TypeError, ValueError):
            return defer.fail()
        if after_seq is None or after_seq < 0:
            read = ["l", "-inf", "", -1 if limit is None else limit]
        elif after_seq >= SEQ_END - 1:
            read = ["l", "+inf", "", 0]  # nothing can follow: still in order with the writes
        else:
            read = ["l", str(after_seq), _member(after_seq), -1 if limit is None else limit]
        return self._write(client_id, read).addCallback(_deliveries)

    def count(self, client_id: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.count`
        (a scan of the client's queue, which drops expired members).

        :param client_id: the persistent session's client id.
        :returns: a Deferred firing with the number of its deliveries, the
            calls made before included.
        """
        return self._run(client_id, scripts.COUNT, [])

    def clear(self, client_id: str) -> defer.Deferred:
        """Implement :meth:`tbmq.interfaces.IDeviceMessageStore.clear`.

        :param client_id: the persistent session's client id.
        :returns: a Deferred firing with None once Redis has it.
        """
        return self._run(client_id, scripts.CLEAR, []).addCallback(lambda _: None)


def _deliveries(reply: bytes) -> list[StoredDelivery]:
    """:param reply: the :data:`~tbmq_plugins.redis_scripts.LOAD` script's
        msgpack array.
    :returns: its deliveries."""
    items = msgpack.unpackb(reply, raw=True)
    return [
        decode_delivery(items[i + 3], int(items[i + 1]) if items[i + 1] else None,
                        int(items[i + 2]))
        for i in range(0, len(items), 4)
    ]


class RedisPlugin:
    """Provides ``storage.device_store: redis``
    (:func:`tbmq.hookspecs.tbmq_device_message_store`)."""

    @hookimpl
    def tbmq_device_message_store(self, config: Any) -> RedisDeviceMessageStore | None:
        """:param config: the :class:`tbmq.config.Config`.
        :returns: a :class:`RedisDeviceMessageStore` on ``config.redis``
            (url, pool_size, key_prefix, message_ttl) keeping at most
            ``storage.max_messages_per_client`` per client, when
            ``storage.device_store`` names ``redis``; else None."""
        if config.storage.device_store_name != "redis":
            return None
        redis = config.redis
        return RedisDeviceMessageStore(
            redis.url, redis.pool_size, redis.key_prefix, redis.message_ttl,
            config.storage.max_messages_per_client)


#: The plugin object of the ``tbmq`` entry point ``redis``.
plugin = RedisPlugin()
