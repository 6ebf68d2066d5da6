"""Field checks of the records of :mod:`tbmq.cluster.records` and
:mod:`tbmq.cluster.client_records`: each takes a decoded field value and
its name, and returns the value as its record keeps it.

:raises tbmq.errors.RecordEncodingError: (each) for a value of another
    type, or out of range, naming the field.
"""

from __future__ import annotations

from typing import Any

from tbmq.errors import RecordEncodingError
from tbmq.model import ClientType
from tbmq.mqtt.properties import pack_properties

__all__ = ["_Bad", "_bool", "_bytes", "_client_type", "_count", "_float", "_int",
           "_opt_float", "_opt_str", "_props_out", "_qos", "_str"]


_Bad = RecordEncodingError  # a field check failed


def _str(v: Any, name: str) -> str:
    if type(v) is not str:
        raise _Bad(f"{name}: expected str, got {type(v).__name__}")
    return v


def _bytes(v: Any, name: str) -> bytes:
    if type(v) is bytes:
        return v
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    raise _Bad(f"{name}: expected bytes, got {type(v).__name__}")


def _int(v: Any, name: str, low: int | None = None, high: int | None = None) -> int:
    if type(v) is not int and not (isinstance(v, int) and not isinstance(v, bool)):
        raise _Bad(f"{name}: expected int, got {type(v).__name__}")
    if (low is not None and v < low) or (high is not None and v > high):
        raise _Bad(f"{name}: {v} out of range [{low}, {high}]")
    return int(v)


def _qos(v: Any, name: str) -> int:
    return _int(v, name, 0, 2)


def _bool(v: Any, name: str) -> bool:
    if type(v) is not bool:
        raise _Bad(f"{name}: expected bool, got {type(v).__name__}")
    return v


def _float(v: Any, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Bad(f"{name}: expected a number, got {type(v).__name__}")
    return float(v)


def _opt_float(v: Any, name: str) -> float | None:
    return None if v is None else _float(v, name)


def _opt_str(v: Any, name: str) -> str | None:
    return None if v is None else _str(v, name)


def _client_type(v: Any, name: str) -> ClientType:
    try:
        return ClientType(v)
    except (ValueError, TypeError):
        raise _Bad(f"{name}: not a client type: {v!r}") from None


def _props_out(props: Any, name: str) -> bytes | None:
    if props is None:
        return None
    if not isinstance(props, dict):
        raise _Bad(f"{name}: expected dict, got {type(props).__name__}")
    if not props:
        return None
    try:
        return pack_properties(props)
    except Exception as e:
        raise _Bad(f"{name}: {e}") from None


def _count(fields: list, n: int, what: str) -> list:
    if len(fields) != n:
        raise _Bad(f"{what}: expected {n} fields, got {len(fields)}")
    return fields
