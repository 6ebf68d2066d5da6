"""``tbmq blocked``: the blocked clients of the cluster, through a running
node's REST API (``/api/blocked-clients``), as ``tbmq sessions`` does
(:mod:`tbmq.ops.cli`: ``--url``, ``--user``, ``--token``...)::

    tbmq blocked add --type client_id|username|ip_address|regex --value V
                     [--regex-target client_id|username|ip_address]
                     [--expires SECONDS] [--description TEXT]
    tbmq blocked list [--json]
    tbmq blocked remove ID

``--expires`` is a duration: the entry ends that many seconds from now.
Exit status: 0 done, 1 refused (a bad entry, an unknown id, the node
unreachable), 2 usage or configuration error.
"""

from __future__ import annotations

import json
import time

from tbmq.cluster.client_records import BLOCKED_TYPES, REGEX_TARGETS

#: the command this module adds to ``tbmq``
COMMAND = "blocked"


def add_command(commands, client_options) -> None:
    """Add ``blocked`` to the ``tbmq`` parser.

    :param commands: the parser's subparsers.
    :param client_options: ``client_options(parser)`` adds the API client's
        options (:func:`tbmq.ops.cli.add_commands`).
    """
    blocked = commands.add_parser(COMMAND, help="add, list or remove blocked clients of the "
                                                "cluster (through a node)")
    client_options(blocked)
    actions = blocked.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="block clients (CONNACK 0x8A Banned; connected "
                                         "ones are disconnected)")
    client_options(add)
    add.add_argument("--type", required=True, choices=BLOCKED_TYPES)
    add.add_argument("--value", required=True,
                     help="the client id, user name, IP address or regular expression")
    add.add_argument("--regex-target", choices=REGEX_TARGETS,
                     help="for --type regex: the field matched (client_id)")
    add.add_argument("--expires", type=float, metavar="SECONDS",
                     help="the entry ends this many seconds from now (default: never)")
    add.add_argument("--description", help="a note")
    listing = actions.add_parser("list", help="list the blocked clients")
    client_options(listing)
    listing.add_argument("--json", action="store_true")
    remove = actions.add_parser("remove", help="remove an entry")
    client_options(remove)
    remove.add_argument("id")


def run(args, out) -> int:
    """Carry out ``tbmq blocked``.

    :raises tbmq.ops.cli.CommandError: the API refused, or the node is out
        of reach.
    """
    from tbmq.ops import cli  # noqa: PLC0415 (it imports this module)

    client = cli._client(args)
    if args.action == "add":
        if args.expires is not None and args.expires <= 0:
            raise cli.CommandError("--expires: must be more than 0 seconds")
        entry = client.call("POST", "/api/blocked-clients", {
            "type": args.type, "value": args.value, "regex_target": args.regex_target,
            "expires_at": None if args.expires is None else time.time() + args.expires,
            "description": args.description})
        print(f"blocked {entry['type']} {entry['value']} ({entry['id']})", file=out)
    elif args.action == "list":
        items = client.call("GET", "/api/blocked-clients")["items"]
        if args.json:
            print(json.dumps(items, indent=2, ensure_ascii=False), file=out)
            return 0
        rows = [("ID", "TYPE", "VALUE", "TARGET", "EXPIRES", "CREATED")]
        for e in items:
            rows.append((e["id"], e["type"], e["value"], e["regex_target"] or "-",
                         cli._time(e["expires_at"]), cli._time(e["created_at"])))
        print(cli._columns(rows), file=out)
    else:
        client.call("DELETE", "/api/blocked-clients/" + cli._quote(args.id))
        print(f"removed {args.id}", file=out)
    return 0
