"""MQTT reason codes are written by name outside :mod:`tbmq.mqtt`.

The broker, cluster, auth and plugin sources name every reason code with
:class:`tbmq.mqtt.ReasonCode` (a v3 return code with
:class:`~tbmq.mqtt.ConnackReturnCode` / :class:`~tbmq.mqtt.SubackReturnCode`
or :func:`~tbmq.mqtt.connack_return_code`), and test a failure with
:func:`~tbmq.mqtt.is_failure`.  The check reads the sources with :mod:`ast`
(docstrings, comments and log text are strings: prose may say "0x87").
"""

from __future__ import annotations

import ast
import pathlib

import tbmq
from tbmq.mqtt import (
    REASON_CODES, ConnackReturnCode, PacketType, ReasonCode, connack_return_code, is_failure,
)
from tbmq.mqtt.constants import V3_CONNACK_RETURN_CODES

ROOT = pathlib.Path(tbmq.__file__).parent.parent

#: where reason codes are defined, by value: not checked
DEFINITIONS = ("tbmq/mqtt/",)

#: files still written with raw reason codes, converted next (they are being
#: changed elsewhere at the moment); remove an entry once its file is done
NOT_YET_CONVERTED: tuple[str, ...] = ()

#: ``(file, value)`` of hex literals that are not reason codes, each with a
#: comment saying what the number is.  A hex literal under a bit operator
#: (``b & 0x7F``, ``x | 0x80``, ``~0xFF``) is a mask and is never reported.
NOT_REASON_CODES: frozenset[tuple[str, int]] = frozenset({
    # EXPIRY_NEVER: the largest Session Expiry Interval, "never expires"
    # (MQTT 5.0 section 3.1.2.11.2)
    ("tbmq/broker/session.py", 0xFFFFFFFF),
})

#: calls whose positional argument at the index is a reason code (or a list
#: of them), by the called name (a function or a method)
REASON_CODE_ARGUMENT = {
    "disconnect": 0,          # MQTTProtocol.disconnect(reason_code, reason)
    "ProtocolViolation": 0,   # ProtocolViolation(reason_code, message)
    "_refuse": 0,             # ConnectHandler._refuse(code, why)
    "_refuse_quietly": 0,
    "_refuse_will": 0,
    "Disconnect": 0,          # packets: Disconnect(reason_code, properties)
    "Auth": 0,
    "Connack": 1,             # Connack(session_present, reason_code, properties)
    "Puback": 1,              # Puback(packet_id, reason_code, properties), and so on
    "Pubrec": 1,
    "Pubrel": 1,
    "Pubcomp": 1,
    "Suback": 1,              # Suback(packet_id, reason_codes)
    "Unsuback": 1,
    "DisconnectCommand": 2,   # DisconnectCommand(client_id, session_id, reason_code)
}

#: names that hold a reason code: ``reason_code=...``, ``x.reason_code == ...``,
#: ``def f(reason_code=...)``
REASON_CODE_NAMES = {"reason_code", "reason_codes"}

_BIT_OPS = (ast.BitAnd, ast.BitOr, ast.BitXor, ast.LShift, ast.RShift)


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _holds_reason_code(node: ast.expr) -> bool:
    return ((isinstance(node, ast.Attribute) and node.attr in REASON_CODE_NAMES)
            or (isinstance(node, ast.Name) and node.id in REASON_CODE_NAMES))


def _int_literals(node: ast.AST):
    """The int literals an expression's value may be (``bool`` excluded):
    the expression itself, the branches of a conditional expression, the
    items of a list or tuple; not the arguments of a call in it, nor the
    condition of an ``if`` expression."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        yield node
    elif isinstance(node, ast.IfExp):
        yield from _int_literals(node.body)
        yield from _int_literals(node.orelse)
    elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        for item in node.elts:
            yield from _int_literals(item)
    elif isinstance(node, ast.BoolOp):
        for value in node.values:
            yield from _int_literals(value)
    elif isinstance(node, ast.UnaryOp):
        yield from _int_literals(node.operand)


def raw_reason_codes(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """The places of ``source`` that write a reason code as a number.

    Two rules: (1) an int literal written in hex (``0x87``), except under a
    bit operator; (2) an int literal of any base where a reason code goes:
    an argument of :data:`REASON_CODE_ARGUMENT`, a ``reason_code=`` keyword
    or default, a comparison with a ``reason_code``.

    :returns: ``(line, source text)`` of each, in order, each place once.
    """
    tree = ast.parse(source, filename)
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    found: dict[int, ast.Constant] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            text = ast.get_source_segment(source, node) or ""
            parent = parents.get(node)
            masked = ((isinstance(parent, ast.BinOp) and isinstance(parent.op, _BIT_OPS))
                      or (isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Invert)))
            if text[:2].lower() == "0x" and not masked:
                found[id(node)] = node
        elif isinstance(node, ast.Call):
            index = REASON_CODE_ARGUMENT.get(_called_name(node))
            if index is not None and index < len(node.args):
                found.update((id(c), c) for c in _int_literals(node.args[index]))
            for kw in node.keywords:
                if kw.arg in REASON_CODE_NAMES:
                    found.update((id(c), c) for c in _int_literals(kw.value))
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_holds_reason_code(side) for side in sides):
                for side in sides:
                    if isinstance(side, ast.Constant):
                        found.update((id(c), c) for c in _int_literals(side))
        elif isinstance(node, ast.arguments):
            positional = [*node.posonlyargs, *node.args]
            pairs = list(zip(positional[len(positional) - len(node.defaults):], node.defaults))
            pairs += [(a, d) for a, d in zip(node.kwonlyargs, node.kw_defaults) if d is not None]
            for arg, default in pairs:
                if arg.arg in REASON_CODE_NAMES:
                    found.update((id(c), c) for c in _int_literals(default))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is not None and any(_holds_reason_code(t) for t in targets):
                found.update((id(c), c) for c in _int_literals(node.value))
    return sorted((c.lineno, ast.get_source_segment(source, c) or repr(c.value))
                  for c in found.values())


def checked_sources() -> list[pathlib.Path]:
    paths = sorted((ROOT / "tbmq").rglob("*.py")) + sorted((ROOT / "plugins").rglob("*.py"))
    return [p for p in paths
            if not p.relative_to(ROOT).as_posix().startswith(DEFINITIONS + NOT_YET_CONVERTED)]


def test_the_checker_reports_raw_reason_codes_and_not_masks_or_names():
    source = '''
def f(conn, packet, b, reason_code=0x98):
    conn.disconnect(0x8E)
    if packet.reason_code >= 0x80:
        return 0x90, "topic name invalid"
    conn.send(Pubrel(pid, 0x92 if v5 else 0))
    conn.send(Connack(False, 0, {}))
    if packet.reason_code == 0:
        pass
    result = AuthResult(False, reason_code=134)
    self.reason_code = 4
    BUSY = 0x89
    mask = b & 0x7F
    flags = ~0x01 | (b << 0x02)
    conn.disconnect(ReasonCode.SESSION_TAKEN_OVER)
    conn.send(Puback(pid))
    DisconnectCommand(cid, sid, _int(code, "reason_code", 0, 255))
    conn.send(Suback(pid, [0x87 if v5 else 128, code]))
    return len(b) == 0
'''
    assert raw_reason_codes(source) == [
        (2, "0x98"), (3, "0x8E"), (4, "0x80"), (5, "0x90"), (6, "0"), (6, "0x92"),
        (7, "0"), (8, "0"), (10, "134"), (11, "4"), (12, "0x89"), (18, "0x87"), (18, "128"),
    ]


def test_no_raw_reason_code_outside_tbmq_mqtt():
    sources = checked_sources()
    assert len(sources) > 50
    names = {p.relative_to(ROOT).as_posix() for p in sources}
    assert {"tbmq/broker/connect.py", "tbmq/broker/outbox.py",
            "plugins/tbmq_plugins/auth_jwt.py"} <= names
    offenders = {}
    for path in sources:
        rel = path.relative_to(ROOT).as_posix()
        found = [(line, text) for line, text in raw_reason_codes(path.read_text(), rel)
                 if (rel, int(text, 0)) not in NOT_REASON_CODES]
        if found:
            offenders[rel] = found
    assert offenders == {}


def test_the_files_not_yet_converted_still_exist():
    """An entry of :data:`NOT_YET_CONVERTED` is removed with its file's
    conversion; one that names nothing is stale."""
    for entry in NOT_YET_CONVERTED:
        assert (ROOT / entry).exists(), entry


def test_is_failure_is_0x80_and_above():
    assert not is_failure(ReasonCode.SUCCESS)
    assert not is_failure(ReasonCode.NO_MATCHING_SUBSCRIBERS)
    assert not is_failure(ReasonCode.RE_AUTHENTICATE)
    assert not is_failure(0x7F)
    assert is_failure(ReasonCode.UNSPECIFIED_ERROR)
    assert is_failure(ReasonCode.QUOTA_EXCEEDED)
    assert is_failure(0xFF)


def test_connack_return_code_is_the_v3_answer_the_broker_gave():
    """The v3.1.1 return codes [MQTT-3.2.2-5] a refusal gets, as the broker
    wrote them pair by pair before the table."""
    R, V3 = ReasonCode, ConnackReturnCode
    assert {code: connack_return_code(code) for code in (
        R.SUCCESS, R.UNSUPPORTED_PROTOCOL_VERSION, R.CLIENT_IDENTIFIER_NOT_VALID,
        R.BAD_USER_NAME_OR_PASSWORD, R.NOT_AUTHORIZED, R.BAD_AUTHENTICATION_METHOD,
        R.BANNED, R.SERVER_BUSY, R.SERVER_UNAVAILABLE, R.UNSPECIFIED_ERROR,
        R.QUOTA_EXCEEDED)} == {
        R.SUCCESS: V3.ACCEPTED,
        R.UNSUPPORTED_PROTOCOL_VERSION: V3.UNACCEPTABLE_PROTOCOL_VERSION,
        R.CLIENT_IDENTIFIER_NOT_VALID: V3.IDENTIFIER_REJECTED,
        R.BAD_USER_NAME_OR_PASSWORD: V3.BAD_USERNAME_OR_PASSWORD,
        R.NOT_AUTHORIZED: V3.NOT_AUTHORIZED,
        R.BAD_AUTHENTICATION_METHOD: V3.NOT_AUTHORIZED,
        R.BANNED: V3.NOT_AUTHORIZED,
        R.SERVER_BUSY: V3.SERVER_UNAVAILABLE,
        R.SERVER_UNAVAILABLE: V3.SERVER_UNAVAILABLE,
        R.UNSPECIFIED_ERROR: V3.SERVER_UNAVAILABLE,
        R.QUOTA_EXCEEDED: V3.SERVER_UNAVAILABLE,
    }
    # a provider's own code that the table does not hold: refused as before
    assert connack_return_code(R.PAYLOAD_FORMAT_INVALID) == V3.NOT_AUTHORIZED
    # every key is a CONNACK reason code (section 3.2.2.2)
    assert set(V3_CONNACK_RETURN_CODES) <= REASON_CODES[PacketType.CONNACK]


def test_the_analytics_disconnect_reasons_are_the_disconnect_reason_codes():
    """The report's names cover the DISCONNECT reason codes (section
    3.14.2.1), as plain ``int`` keys for Spark."""
    from tbmq.analytics.schema import DISCONNECT_REASONS

    assert set(DISCONNECT_REASONS) == set(REASON_CODES[PacketType.DISCONNECT])
    assert {type(code) for code in DISCONNECT_REASONS} == {int}
    assert DISCONNECT_REASONS[0x8E] == "session taken over"
