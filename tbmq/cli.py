"""The ``tbmq`` command: manage the broker's client credentials (and,
through :mod:`tbmq.ops.cli`, its admin users, sessions and retained
messages).

::

    tbmq [--config PATH] [--data-dir DIR] credentials list [--json] [--type T]
    tbmq credentials show ID-or-NAME
    tbmq credentials add --type basic --name N [--client-id C] [--username U]
                         [--password P | --password-stdin] [--client-type T]
                         [--pub REGEX ... | --no-pub] [--sub REGEX ... | --no-sub]
    tbmq credentials add --type x509 --name N --cn CN [--cn-regex] ...
    tbmq credentials add --type scram --name N --username U
                         (--password P | --password-stdin) [--algorithm SHA256|SHA512]
    tbmq credentials change ID-or-NAME [the options of add, but --type]
    tbmq credentials remove ID-or-NAME

The store is the one the broker uses, found from the same configuration
(``--config``, the ``TBMQ_*`` environment, ``--data-dir``):
``auth.credentials: sqlite`` is ``<data_dir>/credentials.sqlite3`` (the
broker may be running: it picks the change up within
``auth.refresh_interval``), ``postgres`` is ``postgres.dsn``.

Records follow TBMQ's ``mqtt_client_credentials``: MQTT_BASIC credentials
are looked up by ``mixed|<clientId>|<username>`` when both are given,
``username|<username>`` or ``client_id|<clientId>`` otherwise; the password
is stored as a bcrypt hash.  X_509 credentials by the certificate CN (or a CN
regex); SCRAM ones by ``scram|<algorithm>|<username>`` with the RFC 5802 keys.
Authorization rules: ``--pub``/``--sub`` give the regexes topic names and
filters must match (TBMQ's ``pubAuthRulePatterns``/``subAuthRulePatterns``),
``--no-pub``/``--no-sub`` allow nothing, ``--any-pub``/``--any-sub`` (or
neither, on ``add``) allow everything.  A rule written as an MQTT topic
filter (a ``+`` level, a trailing ``/#``, ``#`` alone) is saved as given,
with a warning on standard error naming the regex it probably meant
(:func:`tbmq.auth.rules.filter_like`).

Exit status: 0 done, 1 refused (unknown record, conflict, invalid value),
2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import uuid
from typing import Any, NoReturn, Sequence

from twisted.internet import defer, task

from tbmq.auth.records import UsageError, basic_credentials_id, credentials_value
from tbmq.errors import BackendError, ConfigError, CredentialsError
from tbmq.model import ClientType, Credentials, CredentialsType

__all__ = ["basic_credentials_id", "build_parser", "credentials_value", "execute", "main",
           "run", "warn_filter_like"]

_TYPES = {
    "basic": CredentialsType.MQTT_BASIC,
    "x509": CredentialsType.X_509,
    "scram": CredentialsType.SCRAM,
}


# -- the parser ------------------------------------------------------------------


def _store_options(parser: argparse.ArgumentParser, top: bool) -> None:
    """``--config`` and ``--data-dir``, accepted before or after the
    subcommand (SUPPRESS keeps a later level from resetting them)."""
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--config", metavar="PATH", default=default,
                        help="the broker's YAML config (finds the credential store)")
    parser.add_argument("--data-dir", metavar="DIR", default=default,
                        help="the data directory (overrides data_dir)")


def _record_options(parser: argparse.ArgumentParser, adding: bool) -> None:
    parser.add_argument("--name", required=adding, help="a unique, human-readable name")
    parser.add_argument("--client-type", choices=[t.value for t in ClientType],
                        type=str.upper, help="DEVICE (default) or APPLICATION")
    parser.add_argument("--client-id", help="basic: the client id ('' removes it)")
    parser.add_argument("--username", help="basic, scram: the user name ('' removes it, basic)")
    secret = parser.add_mutually_exclusive_group()
    secret.add_argument("--password", help="basic, scram: the password")
    secret.add_argument("--password-stdin", action="store_true",
                        help="read the password from the first line of standard input")
    if not adding:
        secret.add_argument("--no-password", action="store_true",
                            help="basic: remove the password (any password is accepted)")
    parser.add_argument("--cn", help="x509: the certificate common name (or CN regex)")
    parser.add_argument("--cn-regex", action=argparse.BooleanOptionalAction, default=None,
                        help="x509: --cn is a regex matched against the CN")
    parser.add_argument("--algorithm", type=str.upper, choices=["SHA256", "SHA512"],
                        help="scram: SCRAM-SHA-256 (default) or SCRAM-SHA-512")
    parser.add_argument("--iterations", type=int, help="scram: PBKDF2 iterations (>= 4096)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="basic: the bcrypt cost factor, 4..31 (default 10)")
    for direction, what in (("pub", "publish to (topic names)"),
                            ("sub", "subscribe to (topic filters)")):
        group = parser.add_mutually_exclusive_group()
        group.add_argument(f"--{direction}", action="append", metavar="REGEX",
                           help=f"a regular expression of what the client may {what}, matched "
                                f"against the whole name ('#' and '+' are no wildcards: "
                                f"'a/.*', not 'a/#'); repeat for more")
        group.add_argument(f"--no-{direction}", action="store_true",
                           help=f"the client may {what.split(' (')[0]} nothing")
        group.add_argument(f"--any-{direction}", action="store_true",
                           help=f"no restriction on what the client may {what.split(' (')[0]}")


def build_parser() -> argparse.ArgumentParser:
    """:returns: the argument parser of the ``tbmq`` command."""
    parser = argparse.ArgumentParser(
        prog="tbmq", description="Manage the tbmq MQTT broker.")
    _store_options(parser, top=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    credentials = commands.add_parser(
        "credentials", help="list, add, change or remove client credentials")
    _store_options(credentials, top=False)
    actions = credentials.add_subparsers(dest="action", required=True, metavar="ACTION")

    listing = actions.add_parser("list", help="list the credentials, by name")
    _store_options(listing, top=False)
    listing.add_argument("--json", action="store_true", help="print JSON, values included")
    listing.add_argument("--type", choices=sorted(_TYPES), help="only this type")

    show = actions.add_parser("show", help="print one record as JSON")
    _store_options(show, top=False)
    show.add_argument("ref", metavar="ID-or-NAME")

    add = actions.add_parser("add", help="add credentials")
    _store_options(add, top=False)
    add.add_argument("--type", required=True, choices=sorted(_TYPES))
    add.add_argument("--id", help="the record's id (a new UUID by default)")
    _record_options(add, adding=True)

    change = actions.add_parser("change", help="change credentials; only given options change")
    _store_options(change, top=False)
    change.add_argument("ref", metavar="ID-or-NAME")
    _record_options(change, adding=False)

    remove = actions.add_parser("remove", help="remove credentials")
    _store_options(remove, top=False)
    remove.add_argument("ref", metavar="ID-or-NAME")
    from tbmq.ops import cli as ops_cli  # noqa: PLC0415

    ops_cli.add_commands(commands, _store_options)
    return parser


# -- building records --------------------------------------------------------------


def _read_password(args: argparse.Namespace) -> str | None:
    if args.password_stdin:
        line = sys.stdin.readline()
        return line[:-1] if line.endswith("\n") else line
    return args.password


def warn_filter_like(args: argparse.Namespace, err: Any) -> int:
    """Warn, one line on ``err`` per rule, about the ``--pub``/``--sub``
    rules that look like MQTT topic filters rather than regular expressions
    (:func:`tbmq.auth.rules.filter_like`).

    :param args: the parsed ``add`` or ``change`` options.
    :param err: where the warnings go (a text stream).
    :returns: how many warnings were printed.
    """
    from tbmq.auth.rules import filter_like  # noqa: PLC0415

    count = 0
    for direction in ("pub", "sub"):
        for rule in getattr(args, direction, None) or ():
            meant = filter_like(rule)
            if meant is not None:
                print(f"tbmq: warning: --{direction} {rule!r} looks like an MQTT topic filter, "
                      f"but rules are regular expressions over topic names ('#' and '+' are "
                      f"not wildcards there): did you mean {meant!r}?", file=err)
                count += 1
    return count


# -- output -------------------------------------------------------------------------


def record_json(record: Credentials) -> dict:
    """:returns: the record as a JSON-able dict (enums by value)."""
    data = dataclasses.asdict(record)
    data["credentials_type"] = CredentialsType(record.credentials_type).value
    data["client_type"] = ClientType(record.client_type).value
    return data


def _table(records: Sequence[Credentials]) -> str:
    rows = [("NAME", "TYPE", "CLIENT TYPE", "CREDENTIALS ID", "ID")]
    rows += [(r.name, CredentialsType(r.credentials_type).value, ClientType(r.client_type).value,
              r.credentials_id, r.id) for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


# -- running --------------------------------------------------------------------------


def open_store(args: argparse.Namespace, reactor: Any = None) -> Any:
    """Build (not start) the credential store the broker's config names.

    :param reactor: the reactor the store reports to (the global one when
        None).
    :returns: an :class:`~tbmq.interfaces.ICredentialStore` provider.
    :raises ConfigError: for a bad config, ``auth.credentials: memory``
        (nothing outlives the broker's process to manage), or a kind no
        plugin provides (:func:`tbmq.hookspecs.tbmq_credential_store`).
    """
    from tbmq.config import load_config  # noqa: PLC0415

    overrides = {"data_dir": args.data_dir} if getattr(args, "data_dir", None) else None
    config = load_config(getattr(args, "config", None), overrides=overrides)
    kind = config.auth.credentials
    if kind == "memory":
        raise ConfigError(
            f"auth.credentials: {kind!r} keeps credentials in the broker's memory; "
            "there is nothing to manage from outside", key="auth.credentials")
    if kind == "sqlite":
        from tbmq.backends.sqlite_credentials import make_sqlite_credential_store  # noqa: PLC0415

        return make_sqlite_credential_store(config, reactor=reactor)
    # PostgreSQL, or any plugin's store: built by the plugin that provides it
    from tbmq.plugins import make_plugin_manager  # noqa: PLC0415

    store = make_plugin_manager(config).hook.tbmq_credential_store(config=config, reactor=reactor)
    if store is None:
        raise ConfigError(f"auth.credentials: no plugin provides {kind!r}", key="auth.credentials")
    return store


async def _resolve(store: Any, ref: str) -> Credentials:
    """:returns: the record whose id, or else name, is ``ref``.
    :raises LookupError: when there is none."""
    record = await store.get(ref)
    if record is not None:
        return record
    for record in await store.list():
        if record.name == ref:
            return record
    raise LookupError(f"no credentials with id or name {ref!r}")


async def run(args: argparse.Namespace, store: Any, out: Any = None, reactor: Any = None,
              err: Any = None) -> int:
    """Carry out a parsed ``credentials`` command on a started store.

    :param args: the parsed arguments.
    :param store: the :class:`~tbmq.interfaces.ICredentialStore`, started.
    :param out: where to print (standard output by default).
    :param reactor: the reactor whose thread pool hashes passwords (the
        global one when None).
    :param err: where warnings go (standard error by default): ``add`` and
        ``change`` warn about rules that look like topic filters
        (:func:`warn_filter_like`).
    :returns: the exit status.
    """
    out = out or sys.stdout
    action = args.action
    if action == "list":
        records = await store.list()
        if args.type:
            records = [r for r in records if r.credentials_type == _TYPES[args.type]]
        if args.json:
            print(json.dumps([record_json(r) for r in records], indent=2, ensure_ascii=False),
                  file=out)
        else:
            print(_table(records), file=out)
        return 0
    if action == "show":
        record = await _resolve(store, args.ref)
        print(json.dumps(record_json(record), indent=2, ensure_ascii=False), file=out)
        return 0
    if action == "remove":
        record = await _resolve(store, args.ref)
        await store.delete(record.id)
        print(f"removed {record.name} ({record.id})", file=out)
        return 0
    warn_filter_like(args, err or sys.stderr)
    password = _read_password(args)
    if action == "add":
        kind = _TYPES[args.type]
        credentials_id, value = await credentials_value(args, kind, None, password, reactor)
        record = Credentials(
            id=args.id or str(uuid.uuid4()), name=args.name, credentials_type=kind,
            credentials_id=credentials_id,
            client_type=ClientType(args.client_type or ClientType.DEVICE), value=value)
        saved = await store.save(record)
        print(f"added {saved.name} ({saved.id}): {kind.value} {saved.credentials_id}", file=out)
        return 0
    old = await _resolve(store, args.ref)
    kind = CredentialsType(old.credentials_type)
    credentials_id, value = await credentials_value(args, kind, old.value, password, reactor)
    record = dataclasses.replace(
        old, name=args.name or old.name, credentials_id=credentials_id, value=value,
        client_type=ClientType(args.client_type) if args.client_type else old.client_type)
    saved = await store.save(record)
    print(f"changed {saved.name} ({saved.id}): {kind.value} {saved.credentials_id}", file=out)
    return 0


async def execute(args: argparse.Namespace, out: Any = None, err: Any = None,
                  reactor: Any = None) -> int:
    """Open the store the config names, carry out the command, close it.

    :param args: the parsed arguments (:func:`build_parser`).
    :param out: where results go (standard output by default).
    :param err: where errors go (standard error by default).
    :param reactor: the reactor to run on (the global one when None).
    :returns: the exit status: 0 done, 1 refused (unknown record, conflict,
        invalid value, store unavailable), 2 usage or configuration error.
    """
    err = err or sys.stderr
    try:
        store = open_store(args, reactor)
    except ConfigError as e:
        print(f"tbmq: {e}", file=err)
        return 2
    try:
        await store.start()
    except Exception as e:  # noqa: BLE001 - reported, not raised
        print(f"tbmq: cannot open the credential store: {e}", file=err)
        return 1
    try:
        return await run(args, store, out, reactor, err)
    except UsageError as e:
        print(f"tbmq: {e}", file=err)
        return 2
    except (LookupError, CredentialsError, BackendError) as e:
        print(f"tbmq: {e}", file=err)
        return 1
    finally:
        await store.stop()


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """The ``tbmq`` console script: parse ``argv``, run the command under
    :func:`twisted.internet.task.react`, exit with its status.

    :param argv: the arguments (``sys.argv[1:]`` when None).
    """
    args = build_parser().parse_args(argv)
    from tbmq.ops import cli as ops_cli  # noqa: PLC0415

    if args.command in ops_cli.COMMANDS:
        raise SystemExit(ops_cli.execute(args))

    async def command(reactor: Any) -> None:
        status = await execute(args, reactor=reactor)
        if status:
            raise SystemExit(status)  # react() exits with it

    task.react(lambda reactor: defer.ensureDeferred(command(reactor)))


if __name__ == "__main__":  # pragma: no cover
    main()
