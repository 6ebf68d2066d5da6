"""The ``tbmq`` commands of operations, beside ``tbmq credentials``::

    tbmq admin add NAME [--role admin|viewer] [--password-stdin] [--replace] [--rounds N]
    tbmq admin list
    tbmq admin remove NAME

    tbmq sessions list [--q TEXT] [--node ID] [--connected | --disconnected] [--json]
    tbmq sessions show CLIENT_ID
    tbmq sessions disconnect CLIENT_ID
    tbmq sessions remove CLIENT_ID
    tbmq retained list [--filter FILTER] [--json]
    tbmq retained delete TOPIC
    tbmq blocked add|list|remove ...   (tbmq.ops.blocked_cli)

``admin`` writes the admin users' store directly (:mod:`tbmq.ops.admins`,
found from the same config as the broker's): a user must be added before
the API, which refuses everything without one, can be used.  ``admin
add`` takes the password from ``TBMQ_ADMIN_PASSWORD``, else asks for it
twice on a terminal (and refuses two different answers), else reads the
first line of standard input.

``sessions`` and ``retained`` talk to a running node through its REST API:
sessions and subscriptions live on the bus (``tbmq.client.session``,
``tbmq.client.subscriptions``), which only a node reads and keeps current,
and a disconnect or removal must reach the node holding the session, which
only the cluster can do.  The URL is ``--url``, else the config's
``http.endpoint`` on this host.  They log in with ``--user`` (or
``TBMQ_ADMIN_USER``) and the password of ``TBMQ_ADMIN_PASSWORD`` or the
first line of standard input (``--password-stdin``), or use a token
(``--token``, ``TBMQ_ADMIN_TOKEN``).

Exit status: 0 done, 1 refused (unknown id, API error, node unreachable),
2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import datetime
import getpass
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from tbmq.errors import ConfigError
from tbmq.ops import blocked_cli

#: the commands this module adds to ``tbmq``
COMMANDS = ("admin", "sessions", "retained", blocked_cli.COMMAND)


class CommandError(Exception):
    """A refused command (exit status 1)."""


def add_commands(commands, store_options) -> None:
    """Add ``admin``, ``sessions`` and ``retained`` to the ``tbmq`` parser.

    :param commands: the parser's subparsers.
    :param store_options: ``store_options(parser, top=False)`` adds
        ``--config`` and ``--data-dir``.
    """
    admin = commands.add_parser("admin", help="add, list or remove admin users of the API")
    store_options(admin, top=False)
    actions = admin.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="add an admin user (bcrypt password)")
    store_options(add, top=False)
    add.add_argument("name")
    add.add_argument("--role", choices=["admin", "viewer"], default="admin",
                     help="admin: read and change (default); viewer: read only")
    add.add_argument("--password-stdin", action="store_true",
                     help="read the password from the first line of standard input")
    add.add_argument("--replace", action="store_true", help="change an existing user")
    add.add_argument("--rounds", type=int, default=12, help="the bcrypt cost factor (12)")
    store_options(actions.add_parser("list", help="list the admin users"), top=False)
    remove = actions.add_parser("remove", help="remove an admin user")
    store_options(remove, top=False)
    remove.add_argument("name")

    def client_options(parser) -> None:
        store_options(parser, top=False)
        parser.add_argument("--url", default=argparse.SUPPRESS,
                            help="the node's HTTP URL (default: http.endpoint)")
        parser.add_argument("--user", default=argparse.SUPPRESS,
                            help="admin user name (or TBMQ_ADMIN_USER)")
        parser.add_argument("--password-stdin", action="store_true", default=argparse.SUPPRESS,
                            help="read the password from standard input "
                                 "(else TBMQ_ADMIN_PASSWORD)")
        parser.add_argument("--token", default=argparse.SUPPRESS,
                            help="a login token (or TBMQ_ADMIN_TOKEN)")

    sessions = commands.add_parser("sessions", help="list, show, disconnect or remove "
                                                    "sessions of the cluster (through a node)")
    client_options(sessions)
    actions = sessions.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="list sessions")
    client_options(listing)
    listing.add_argument("--q", help="client id, address, user name or credentials name "
                                     "containing this")
    listing.add_argument("--node", help="held by this node (service id)")
    state = listing.add_mutually_exclusive_group()
    state.add_argument("--connected", action="store_true", default=None)
    state.add_argument("--disconnected", action="store_true", default=None)
    listing.add_argument("--limit", type=int, default=1000)
    listing.add_argument("--json", action="store_true")
    for name, text in (("show", "print one session as JSON"),
                       ("disconnect", "close the client's connection wherever it is"),
                       ("remove", "remove an offline session")):
        one = actions.add_parser(name, help=text)
        client_options(one)
        one.add_argument("client_id")

    retained = commands.add_parser("retained", help="list or delete retained messages")
    client_options(retained)
    actions = retained.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="list retained messages")
    client_options(listing)
    listing.add_argument("--filter", default="#", help="a topic filter (#)")
    listing.add_argument("--limit", type=int, default=1000)
    listing.add_argument("--json", action="store_true")
    delete = actions.add_parser("delete", help="delete the retained message of a topic")
    client_options(delete)
    delete.add_argument("topic")
    blocked_cli.add_command(commands, client_options)


def _config(args):
    from tbmq.config import load_config  # noqa: PLC0415

    overrides = {"data_dir": args.data_dir} if getattr(args, "data_dir", None) else None
    return load_config(getattr(args, "config", None), overrides=overrides)


def _read_secret(prompt: str) -> str:
    if sys.stdin.isatty():
        return getpass.getpass(prompt)
    line = sys.stdin.readline()
    return line[:-1] if line.endswith("\n") else line


def _new_secret(prompt: str) -> str:
    """A new password: asked twice on a terminal (a typing mistake would
    otherwise lock the user out), read once from a pipe.

    :raises CommandError: when the two answers differ."""
    if not sys.stdin.isatty():
        return _read_secret(prompt)
    first = getpass.getpass(prompt)
    if getpass.getpass("the same password again: ") != first:
        raise CommandError("the two passwords differ; nothing changed")
    return first


# -- admin users --------------------------------------------------------------------


def run_admin(args, out) -> int:
    from tbmq.ops.admins import AdminError, open_admin_store  # noqa: PLC0415

    store = open_admin_store(_config(args))
    try:
        if args.action == "add":
            password = _new_secret(f"password of {args.name}: ") if args.password_stdin \
                else os.environ.get("TBMQ_ADMIN_PASSWORD") or _new_secret(
                    f"password of {args.name}: ")
            user = store.add_sync(args.name, password, args.role, args.rounds, args.replace)
            print(f"{'changed' if args.replace else 'added'} admin user {user.name} "
                  f"({user.role})", file=out)
        elif args.action == "list":
            users = store.list_sync()
            rows = [("NAME", "ROLE", "CREATED")] + [
                (u.name, u.role, _time(u.created_time)) for u in users]
            print(_columns(rows), file=out)
        else:
            if not store.remove_sync(args.name):
                raise CommandError(f"no admin user {args.name!r}")
            print(f"removed admin user {args.name}", file=out)
    except AdminError as e:
        raise CommandError(str(e)) from None
    return 0


# -- the REST client -------------------------------------------------------------------


class ApiClient:
    """A blocking client of a node's admin API.

    :param url: the node's base URL (``http://127.0.0.1:8083``).
    :param token: a login token, or None (then :meth:`login`).
    :param timeout: seconds per request.
    """

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None, query: dict | None = None) -> Any:
        """:returns: the decoded JSON answer.
        :raises CommandError: with the API's error message, or when the node
            cannot be reached."""
        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as e:
            try:
                message = json.loads(e.read())["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = e.reason
            raise CommandError(f"{e.code}: {message}") from None
        except (urllib.error.URLError, OSError) as e:
            raise CommandError(f"cannot reach {self.url}: {getattr(e, 'reason', e)}") from None

    def login(self, user: str, password: str) -> None:
        self.token = self.call("POST", "/api/auth/login",
                               {"username": user, "password": password})["token"]


def base_url(config) -> str:
    """:returns: the URL of this host's node from ``http.endpoint``.
    :raises ConfigError: when it is not set or not TCP."""
    endpoint = config.http.endpoint
    if endpoint is None:
        raise ConfigError("http.endpoint: not set; give the node's --url", key="http.endpoint")
    parts = endpoint.split(":")
    if parts[0].lower() not in ("tcp", "tcp6") or len(parts) < 2:
        raise ConfigError(f"http.endpoint: {endpoint!r} is not tcp:PORT; give the node's --url",
                          key="http.endpoint")
    host = "127.0.0.1"
    for option in parts[2:]:
        if option.startswith("interface="):
            host = option.split("=", 1)[1]
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://{'[' + host + ']' if ':' in host else host}:{parts[1]}"


def _client(args) -> ApiClient:
    url = getattr(args, "url", None) or base_url(_config(args))
    token = getattr(args, "token", None) or os.environ.get("TBMQ_ADMIN_TOKEN")
    client = ApiClient(url, token)
    if not token:
        user = getattr(args, "user", None) or os.environ.get("TBMQ_ADMIN_USER")
        if not user:
            raise CommandError("give --user (or TBMQ_ADMIN_USER) or --token")
        password = (_read_secret(f"password of {user}: ")
                    if getattr(args, "password_stdin", False)
                    else os.environ.get("TBMQ_ADMIN_PASSWORD")
                    or _read_secret(f"password of {user}: "))
        client.login(user, password)
    return client


def _time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S")


def _columns(rows: list[tuple]) -> str:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()
                     for row in rows)


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


def run_sessions(args, out) -> int:
    client = _client(args)
    if args.action == "list":
        connected = True if args.connected else (False if args.disconnected else None)
        page = client.call("GET", "/api/sessions", query={
            "q": args.q, "node": args.node, "limit": args.limit,
            "connected": None if connected is None else str(connected).lower()})
        if args.json:
            print(json.dumps(page["items"], indent=2, ensure_ascii=False), file=out)
            return 0
        rows = [("CLIENT ID", "NODE", "STATE", "PERSISTENT", "TYPE", "SUBS", "SINCE",
                 "ADDRESS", "USER", "CREDENTIALS")]
        for s in page["items"]:
            rows.append((s["client_id"], s["node"],
                         "connected" if s["connected"] else "disconnected",
                         "yes" if s["persistent"] else "no", s["client_type"],
                         s["subscriptions"],
                         _time(s["connected_at"] if s["connected"] else s["disconnected_at"]),
                         s["address"] or "-", s["username"] or "-",
                         s["credentials_name"] or "-"))
        print(_columns(rows), file=out)
        if page["total"] > len(page["items"]):
            print(f"({len(page['items'])} of {page['total']})", file=out)
        return 0
    path = "/api/sessions/" + _quote(args.client_id)
    if args.action == "show":
        print(json.dumps(client.call("GET", path), indent=2, ensure_ascii=False), file=out)
    elif args.action == "disconnect":
        answer = client.call("POST", path + "/disconnect")
        print(f"{answer['status']} {args.client_id}", file=out)
    else:
        answer = client.call("DELETE", path)
        print(f"{answer['status']} {args.client_id}", file=out)
    return 0


def run_retained(args, out) -> int:
    client = _client(args)
    if args.action == "list":
        page = client.call("GET", "/api/retained",
                           query={"filter": args.filter, "limit": args.limit})
        if args.json:
            print(json.dumps(page["items"], indent=2, ensure_ascii=False), file=out)
            return 0
        rows = [("TOPIC", "QOS", "SIZE", "PAYLOAD")]
        for m in page["items"]:
            text = m["payload"] if m["payload"] is not None else "(binary)"
            rows.append((m["topic"], m["qos"], m["payload_size"],
                         text if len(text) <= 60 else text[:57] + "..."))
        print(_columns(rows), file=out)
        return 0
    client.call("DELETE", "/api/retained", query={"topic": args.topic})
    print(f"deleted the retained message of {args.topic}", file=out)
    return 0


def execute(args, out=None, err=None) -> int:
    """Run an ``admin``, ``sessions`` or ``retained`` command.

    :returns: the exit status (see the module's docstring).
    """
    out = out or sys.stdout
    err = err or sys.stderr
    runner = {"admin": run_admin, "sessions": run_sessions, "retained": run_retained,
              blocked_cli.COMMAND: blocked_cli.run}
    try:
        return runner[args.command](args, out)
    except ConfigError as e:
        print(f"tbmq: {e}", file=err)
        return 2
    except CommandError as e:
        print(f"tbmq: {e}", file=err)
        return 1
