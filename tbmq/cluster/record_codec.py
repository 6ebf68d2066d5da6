"""The machinery of the bus record encodings (:mod:`tbmq.cluster.records`
has the records' arrays, their fields and the codec of each topic, and
exports what is here): a :class:`RecordCodec` per record type, a
:class:`RecordUnion` of several on one topic, :class:`BytesCodec` for raw
bytes.

Every value is the msgpack array ``[tag, version, field, ...]``, packed
as ``msgpack.packb(..., use_bin_type=True)`` does (by a packer each thread
keeps) and read with ``unpackb(raw=False, strict_map_key=False,
use_list=False)`` (arrays as tuples).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import msgpack

from tbmq.errors import RecordEncodingError

__all__ = ["ARRAY_TYPES", "VERSION", "BytesCodec", "RecordCodec", "RecordUnion"]

#: An empty mapping shared by those that have nothing to put in theirs.
_NONE: dict = {}

#: The version the writers of :mod:`tbmq.cluster.records` write, but
#: ``SESSION``'s (:data:`tbmq.cluster.records.SESSION_VERSION`).
VERSION = 1


class RecordCodec:
    """The encoding of one record type on one kind of topic.

    :param name: the record type's name, for error messages.
    :param cls: the record class.
    :param tag: the type tag written first in the array.
    :param write: ``write(value) -> list`` of the version-:data:`VERSION`
        fields, checking them (raises :class:`RecordEncodingError`).
    :param readers: version → ``read(fields) -> value`` (checks the fields).
    :param tombstone: whether None (a tombstone) is a valid value.
    :param version: the version :meth:`encode` writes (a key of
        ``readers``).
    :param fast: None, or ``(write_array, read_array)`` or ``(write_array,
        read_array, read_arrays)``, the hot path of a record type the bus
        carries per message or per CONNECT: ``write_array(value) -> list |
        None``, given an instance of ``cls`` itself, returns the whole
        ``[tag, version, fields...]`` array when every field has its plain
        type (``str``, ``int``, ``float``...) and fits, else None;
        ``read_array(obj) -> value | None`` does the same for a decoded
        array of the written version, and ``read_arrays(objs) -> list |
        None`` for several (a packed record's: one call, no call per
        value), None when any one is not read so.  Each may raise
        :class:`RecordEncodingError`.  Where they return None, ``write`` and
        ``readers`` decide (convert a field, or say which one is wrong):
        the hot path only skips the field by field calls, it accepts and
        refuses nothing of its own.
    :param weight: None (a record is one message), or ``weight(array) ->
        int``: the messages a decoded array carries, what flow control
        counts (:meth:`count_arrays`).
    :param write_many: None, or the hot path of :meth:`encode_many` for a
        batch of instances of ``cls`` itself: ``write_many(values, pack) ->
        list | None``, given them (one or more) and this thread's
        ``Packer.pack``, returns the encodings of all of them, byte for
        byte what :meth:`encode` gives each, when it can write them
        together (the fields they share packed once), else None (then each
        goes by ``write_array``); it may raise, and then too each goes by
        ``write_array`` (which accepts and refuses what it does).
    :ivar version: the version :meth:`encode` writes.
    """

    __slots__ = ("name", "cls", "tag", "version", "tombstone", "_write", "_readers",
                 "_fast", "_write_array", "_read_array", "_read_arrays", "_weight",
                 "_write_many", "_value_weight")

    def __init__(self, name: str, cls: type, tag: str, write: Callable[[Any], list],
                 readers: dict[int, Callable[[list], Any]], tombstone: bool = False,
                 version: int = VERSION,
                 fast: tuple[Callable[[Any], list | None], Callable[[Any], Any]]
                 | tuple[Callable[[Any], list | None], Callable[[Any], Any],
                         Callable[[Any], list | None]] | None = None,
                 weight: Callable[[Any], int] | None = None,
                 write_many: Callable[[Any, Callable], list | None] | None = None,
                 value_weight: Callable[[Any], int] | None = None) -> None:
        self.name = name
        self.cls = cls
        self.tag = tag
        self.version = version
        self.tombstone = tombstone
        self._write = write
        self._readers = readers
        self._fast = fast
        self._write_array, self._read_array = (fast or (_no_array, _no_array))[:2]
        self._read_arrays = fast[2] if fast is not None and len(fast) > 2 else _no_array
        self._weight = weight
        self._write_many = write_many
        self._value_weight = value_weight

    def with_tombstone(self) -> "RecordCodec":
        """:returns: the same encoding, accepting None (a tombstone)."""
        return RecordCodec(self.name, self.cls, self.tag, self._write, self._readers, True,
                           self.version, self._fast, self._weight, self._write_many,
                           self._value_weight)

    def weigh(self, value: Any) -> int:
        """:returns: the messages a decoded record carries: 1, or what the
            codec's ``value_weight`` says (a
            :class:`~tbmq.cluster.records.DeliveryRun`: its messages); what a
            consumer counts against its per-turn slice."""
        weight = self._value_weight
        return 1 if weight is None else weight(value)

    def count_arrays(self, objs: Any) -> int:
        """:param objs: decoded arrays, as :meth:`decode_arrays` takes them
            (a packed record's values).
        :returns: the messages they carry (one each, or what ``weight``
            says): what a consumer counts against its buffer's limit."""
        weight = self._weight
        if weight is None:
            return len(objs)
        return sum([weight(obj) if type(obj) in ARRAY_TYPES else 1 for obj in objs])

    def encode(self, value: Any) -> bytes | None:
        """:param value: an instance of :attr:`cls`, or None where tombstones
            are allowed.
        :returns: the encoded bytes (None for a tombstone).
        :raises RecordEncodingError: when ``value`` does not fit.
        """
        try:
            if type(value) is self.cls:
                array = self._write_array(value)
                if array is None:
                    array = [self.tag, self.version, *self._write(value)]
                return _pack(array)
            if value is None:
                if self.tombstone:
                    return None
                raise RecordEncodingError(
                    f"{self.name}: a tombstone (None) is not allowed here")
            return _pack(self.to_list(value))
        except RecordEncodingError:
            raise
        except Exception as e:
            raise RecordEncodingError(f"{self.name}: cannot encode: {e}") from None

    def encode_many(self, values: Any) -> list:
        """The encodings of several values, as :meth:`encode` gives each
        (the records of one ``publish_many``): one packer and one pass for
        all of them, each value of :attr:`cls` with plain fields packed from
        its array (the hot path), any other by :meth:`encode`.

        :param values: a sequence of values :meth:`encode` takes.
        :returns: ``list`` of ``bytes | None``, in order.
        :raises RecordEncodingError: as :meth:`encode`, for the first value
            that does not fit.
        """
        return _encode_many(self.name, values, {self.cls: self._write_array}, self.encode,
                            {self.cls: self._write_many} if self._write_many else _NONE)

    def to_list(self, value: Any) -> list:
        """:returns: the ``[tag, version, fields...]`` array of ``value``
            (used for nested records; an array field may be a tuple).
        :raises RecordEncodingError: when ``value`` does not fit."""
        if not isinstance(value, self.cls):
            raise RecordEncodingError(
                f"{self.name}: expected {self.cls.__name__}, got {type(value).__name__}")
        try:
            array = self._write_array(value) if type(value) is self.cls else None
            return [self.tag, self.version, *self._write(value)] if array is None else array
        except RecordEncodingError:
            raise
        except Exception as e:
            raise RecordEncodingError(f"{self.name}: cannot encode: {e}") from None

    def decode(self, data: Any) -> Any:
        """:param data: bytes from :meth:`encode`, or None (a tombstone).
        :returns: the record, or None for a tombstone.
        :raises RecordEncodingError: for anything that is not a record of
            this type and a known version (and for a tombstone where none is
            allowed).
        """
        if type(data) is bytes:
            try:
                obj = _unpackb(data, raw=False, strict_map_key=False, use_list=False)
            except Exception as e:
                raise RecordEncodingError(f"{self.name}: not msgpack: {e}") from None
            if type(obj) is tuple:
                try:
                    value = self._read_array(obj)
                except RecordEncodingError:
                    raise
                except Exception as e:  # as in from_list
                    raise RecordEncodingError(f"{self.name}: cannot decode: {e}") from None
                if value is not None:
                    return value
        elif data is None:
            if self.tombstone:
                return None
            raise RecordEncodingError(f"{self.name}: a tombstone (None) is not allowed here")
        else:
            obj = _unpack(self.name, data)
        return self.from_list(obj)

    def decode_arrays(self, objs: Any) -> list:
        """The records of several values already unpacked from msgpack (the
        values of a packed record, version 2: one unpacking for all).

        :param objs: each a record's array (a tuple or a list) or None (a
            tombstone).
        :returns: the records (None for a tombstone), in order.
        :raises RecordEncodingError: as :meth:`decode`, for the first value
            that is not a record of this type.
        """
        read = self._read_array
        try:  # one handler for the loop: entering it per value costs as much as a read
            out = self._read_arrays(objs)  # the hot path: every value in one call
            if out is not None:
                return out
            out = []
            append = out.append
            for obj in objs:
                value = read(obj) if type(obj) is tuple else None
                if value is None:
                    value = self._read_other(obj)
                append(value)
        except RecordEncodingError:
            raise
        except Exception as e:  # as in from_list
            raise RecordEncodingError(f"{self.name}: cannot decode: {e}") from None
        return out

    def _read_other(self, obj: Any) -> Any:
        """A value of :meth:`decode_arrays` the hot path did not read: a
        tombstone (None), or an array read field by field."""
        if obj is None:
            if self.tombstone:
                return None
            raise RecordEncodingError(f"{self.name}: a tombstone (None) is not allowed here")
        return self.from_list(obj)

    def from_list(self, obj: Any) -> Any:
        """Inverse of :meth:`to_list` (arrays as lists or tuples).

        :raises RecordEncodingError: as :meth:`decode`."""
        if type(obj) not in ARRAY_TYPES or len(obj) < 2:
            raise RecordEncodingError(f"{self.name}: not a tagged record array")
        try:
            value = self._read_array(obj)
            if value is not None:
                return value
            tag, version = obj[0], obj[1]
            if type(tag) is not str or tag != self.tag:
                raise RecordEncodingError(
                    f"{self.name}: expected tag {self.tag!r}, got {tag!r}")
            reader = self._readers.get(version) if type(version) is int else None
            if reader is None:
                raise RecordEncodingError(f"{self.name}: unknown version {version!r}")
            return reader(obj[2:])
        except RecordEncodingError:
            raise
        except Exception as e:  # a check this module forgot: still the one error type
            raise RecordEncodingError(f"{self.name}: cannot decode: {e}") from None


def _encode_many(name: str, values: Any, writers: dict, encode: Callable[[Any], Any],
                 many: dict = _NONE) -> list:
    """:meth:`RecordCodec.encode_many` and :meth:`RecordUnion.encode_many`:
    values of one class that has a ``write_many`` in
    ``many`` (class → ``write_many``, see :class:`RecordCodec`) written
    together by it when it can; else each value whose exact class has a
    hot-path writer in ``writers`` (class → ``write_array``) packed from
    its array by this thread's packer, any other (or one the writer leaves
    to the field checks) by ``encode``.

    :raises RecordEncodingError: as ``encode``, naming ``name``."""
    packer = _thread_packer()
    pack = packer.pack
    if len(set(map(type, values))) == 1:
        # one class (a batch of one topic's records): the arrays written and
        # packed by map, no bytecode per value but the writer's own
        cls = type(values[0])
        out = None
        if many and cls in many:
            try:
                out = many[cls](values, pack)
            except Exception:
                out = None  # each by its array below: each value's own error
        write = writers.get(cls)
        if out is None and write is not None:
            try:
                arrays = list(map(write, values))
                if None not in arrays:
                    out = list(map(pack, arrays))
            except Exception:
                pass  # one by one below: each value's own error
        if out is not None:
            if max(map(len, out)) >= _PACKER_KEPT_BELOW and \
                    getattr(_packers, "packer", None) is packer:
                del _packers.packer  # its buffer grew: let it go
            return out
    out = []
    append = out.append
    for value in values:
        write = writers.get(type(value))
        array = None
        if write is not None:
            try:
                array = write(value)
            except Exception:
                array = None  # encode says what is wrong
        if array is None:
            append(encode(value))
            continue
        try:
            append(pack(array))
        except Exception as e:
            raise RecordEncodingError(f"{name}: cannot encode: {e}") from None
    if out and max(map(len, out)) >= _PACKER_KEPT_BELOW and \
            getattr(_packers, "packer", None) is packer:
        del _packers.packer  # its buffer grew: let it go
    return out


def _no_array(value: Any) -> None:
    """The hot path of a codec without one: always the field by field one."""
    return None


#: What msgpack reads an array as (``use_list=False``), and what
#: :meth:`RecordCodec.to_list` writes.
ARRAY_TYPES = (tuple, list)
_unpackb = msgpack.unpackb
_packers = threading.local()
#: A thread keeps its :class:`msgpack.Packer` (whose buffer grows to the
#: largest value it packed) while what it packs stays under this size.
_PACKER_KEPT_BELOW = 256 * 1024


def _thread_packer() -> msgpack.Packer:
    """:returns: this thread's packer, made at its first use (a Packer is
    not for concurrent use)."""
    try:
        return _packers.packer
    except AttributeError:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
        return packer


def _pack(array: list) -> bytes:
    """``msgpack.packb(array, use_bin_type=True)`` with a packer of this
    thread's, made once (a Packer is not for concurrent use): ``packb``
    makes one, with its buffer, per call.

    :raises Exception: what :meth:`msgpack.Packer.pack` raises (it then
        empties its buffer)."""
    try:
        packer = _packers.packer
    except AttributeError:
        packer = _thread_packer()
    data = packer.pack(array)
    if len(data) >= _PACKER_KEPT_BELOW:
        del _packers.packer  # its buffer grew: let it go
    return data


def _unpack(name: str, data: Any) -> Any:
    """The msgpack object in ``data`` (arrays as tuples).

    :raises RecordEncodingError: when ``data`` is not bytes or not msgpack."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise RecordEncodingError(f"{name}: expected bytes, got {type(data).__name__}")
    try:
        return _unpackb(data, raw=False, strict_map_key=False, use_list=False)
    except Exception as e:
        raise RecordEncodingError(f"{name}: not msgpack: {e}") from None


class RecordUnion:
    """Several record types on one topic, told apart by their tag (no
    tombstone): each value is written by the codec of its class and read
    by the codec of its tag.

    :param name: the union's name, for error messages.
    :param codecs: the :class:`RecordCodec` of each record type (distinct
        tags and classes).
    """

    __slots__ = ("name", "codecs", "_by_tag", "_writers", "_arrays_by_tag", "_weights",
                 "_many", "_value_weights")
    tombstone = False

    def __init__(self, name: str, *codecs: RecordCodec) -> None:
        self.name = name
        self.codecs = codecs
        self._by_tag = {codec.tag: codec for codec in codecs}
        #: a member's exact class → its hot-path writer (:meth:`encode_many`)
        self._writers = {codec.cls: codec._write_array for codec in codecs}
        #: a member's exact class → its ``write_many`` (:meth:`encode_many`), for those with one
        self._many = {codec.cls: codec._write_many for codec in codecs if codec._write_many}
        #: a member's tag → its hot-path reader (:meth:`decode_arrays`)
        self._arrays_by_tag = {codec.tag: codec._read_array for codec in codecs}
        #: a member's tag → its ``weight`` (:meth:`count_arrays`), for those with one
        self._weights = {codec.tag: codec._weight for codec in codecs if codec._weight}
        #: a member's class → its ``value_weight`` (:meth:`weigh`), for those with one
        self._value_weights = {codec.cls: codec._value_weight for codec in codecs
                               if codec._value_weight}

    def weigh(self, value: Any) -> int:
        """As :meth:`RecordCodec.weigh`, by the member of the value's class."""
        weight = self._value_weights.get(type(value))
        return 1 if weight is None else weight(value)

    def count_arrays(self, objs: Any) -> int:
        """As :meth:`RecordCodec.count_arrays`, each array weighed by the
        member of its tag."""
        weights = self._weights
        if not weights:
            return len(objs)
        n = 0
        for obj in objs:
            tag = obj[0] if type(obj) in ARRAY_TYPES and obj else None
            weight = weights.get(tag) if type(tag) is str else None
            n += 1 if weight is None else weight(obj)
        return n

    def encode(self, value: Any) -> bytes:
        """:returns: ``value`` encoded by the codec of its class.
        :raises RecordEncodingError: for a value of no member's class (None
            included), or one whose fields do not fit."""
        for codec in self.codecs:
            if isinstance(value, codec.cls):
                return codec.encode(value)
        raise RecordEncodingError(f"{self.name}: expected one of "
                                  f"{', '.join(c.cls.__name__ for c in self.codecs)}, "
                                  f"got {type(value).__name__}")

    def encode_many(self, values: Any) -> list:
        """:returns: ``[encode(value) for value in values]``, a value of a
            member's own class with plain fields packed from its array (the
            hot path, as :meth:`RecordCodec.encode_many`), one packer for all.
        :raises RecordEncodingError: as :meth:`encode`."""
        return _encode_many(self.name, values, self._writers, self.encode, self._many)

    def decode(self, data: Any) -> Any:
        """:returns: the record ``data`` holds, read by the codec of its tag.
        :raises RecordEncodingError: for anything else (a tombstone, another
            tag, an unknown version, bad fields)."""
        if data is None:
            raise RecordEncodingError(f"{self.name}: a tombstone (None) is not allowed here")
        if type(data) is bytes:  # the hot path, as RecordCodec.decode
            try:
                obj = _unpackb(data, raw=False, strict_map_key=False, use_list=False)
            except Exception as e:
                raise RecordEncodingError(f"{self.name}: not msgpack: {e}") from None
            try:  # as decode_arrays: a tuple of a member's tag, read by its fast reader
                value = self._arrays_by_tag[obj[0]](obj) if type(obj) is tuple else None
            except Exception:
                value = None  # _read_tagged says what is wrong
            if value is not None:
                return value
        else:
            obj = _unpack(self.name, data)
        return self._read_tagged(obj)

    def decode_arrays(self, objs: Any) -> list:
        """As :meth:`RecordCodec.decode_arrays`: each value read by the codec
        of its tag (no tombstone).

        :raises RecordEncodingError: for the first value that is not a
            record of a member's type."""
        out = []
        append = out.append
        readers = self._arrays_by_tag
        for obj in objs:
            try:  # the hot path: a tuple as msgpack read it, of a member's tag
                value = readers[obj[0]](obj) if type(obj) is tuple else None
            except Exception:
                value = None  # _read_tagged says what is wrong
            append(self._read_tagged(obj) if value is None else value)
        return out

    def _read_tagged(self, obj: Any) -> Any:
        """An unpacked value (:meth:`decode`, or one of :meth:`decode_arrays`
        the hot path did not read) read by the member of its tag.

        :raises RecordEncodingError: for a value of no member's tag, or one
            its member refuses."""
        tag = obj[0] if type(obj) in ARRAY_TYPES and obj else None
        codec = self._by_tag.get(tag) if type(tag) is str else None
        if codec is None:
            raise RecordEncodingError(f"{self.name}: expected a tag of "
                                      f"{sorted(self._by_tag)}, got {tag!r}")
        return codec.from_list(obj)


class BytesCodec:
    """Raw bytes passed through (``tbmq.events``): no tag, no version.

    :ivar tombstone: False; None is refused.
    """

    __slots__ = ()
    name = "bytes"
    tombstone = False

    def encode(self, value: Any) -> bytes:
        """:raises RecordEncodingError: unless ``value`` is bytes-like."""
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        raise RecordEncodingError(f"bytes: expected bytes, got {type(value).__name__}")

    def encode_many(self, values: Any) -> list:
        """:returns: ``[encode(value) for value in values]``.
        :raises RecordEncodingError: as :meth:`encode`."""
        return [self.encode(value) for value in values]

    def decode(self, data: Any) -> bytes:
        """:raises RecordEncodingError: unless ``data`` is bytes-like."""
        return self.encode(data)

    def count_arrays(self, objs: Any) -> int:
        """:returns: ``len(objs)``."""
        return len(objs)

    def weigh(self, value: Any) -> int:
        """:returns: 1 (one message per record)."""
        return 1

    def decode_arrays(self, objs: Any) -> list:
        """Raw bytes are never in a record that unpacks its values.

        :raises RecordEncodingError: always."""
        raise RecordEncodingError("bytes: raw bytes are not msgpack values")
