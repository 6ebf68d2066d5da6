"""The admin API's routes: one table that both the dispatcher
(:class:`tbmq.ops.api.app.AdminApi`) and the OpenAPI document
(:mod:`tbmq.ops.api.openapi`) read, so they cannot disagree.

A path is a tuple of segments after ``/api/``; ``{name}`` matches one
segment, percent-decoded after the path is split on ``/`` (a client id
``a/b`` is ``a%2Fb``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: who may call a route: nobody needs a token, any admin user, role admin only
PUBLIC, READ, WRITE = "public", "read", "write"


@dataclass(frozen=True)
class Route:
    """:ivar method: the HTTP method.
    :ivar path: segments after ``/api/``.
    :ivar handler: the name of the :class:`~tbmq.ops.api.app.AdminApi` method.
    :ivar access: :data:`PUBLIC`, :data:`READ` or :data:`WRITE`.
    :ivar summary: one line for the OpenAPI document.
    :ivar body: the request body's schema name, or None.
    :ivar response: the answer's schema name.
    :ivar status: the status of a success.
    :ivar query: query parameters: ``(name, JSON type, description)``.
    :ivar errors: the error statuses it may answer besides 401/403.
    """

    method: str
    path: tuple[str, ...]
    handler: str
    access: str
    summary: str
    body: str | None = None
    response: str = "Accepted"
    status: int = 200
    query: tuple = ()
    errors: tuple[int, ...] = field(default=())


_PAGING = (("offset", "integer", "items to skip (0)"),
           ("limit", "integer", "items at most (50, up to 1000)"))

ROUTES: tuple[Route, ...] = (
    Route("POST", ("auth", "login"), "login", PUBLIC,
          "Log in with an admin user's name and password; returns a token",
          body="Login", response="Token", errors=(400, 401, 403, 422)),
    Route("GET", ("auth", "me"), "me", READ, "The user of the token", response="User"),
    Route("GET", ("sessions",), "list_sessions", READ,
          "Sessions of the whole cluster, by client id",
          response="SessionPage", errors=(400,), query=(
              ("q", "string", "client id, address, user name or credentials name "
                              "containing this (case-insensitive)"),
              ("node", "string", "held by this node (service id)"),
              ("connected", "boolean", "connected (true) or not (false)"),
              ("persistent", "boolean", "persistent (true) or not (false)"),
              ("client_type", "string", "DEVICE or APPLICATION")) + _PAGING),
    Route("GET", ("sessions", "{client_id}"), "show_session", READ,
          "One session: its subscriptions, queued messages and node",
          response="SessionDetail", errors=(404,)),
    Route("POST", ("sessions", "{client_id}", "disconnect"), "disconnect_session", WRITE,
          "Close the client's connection wherever it is "
          "(DISCONNECT 0x98 Administrative action in MQTT 5)",
          response="Accepted", errors=(404, 409)),
    Route("DELETE", ("sessions", "{client_id}"), "remove_session", WRITE,
          "Remove an offline session: its subscriptions and stored messages",
          response="Accepted", errors=(404, 409)),
    Route("GET", ("sessions", "{client_id}", "subscriptions"), "session_subscriptions", READ,
          "The subscriptions of a client", response="SubscriptionList", errors=(404,)),
    Route("GET", ("retained",), "list_retained", READ,
          "Retained messages matching a topic filter", response="RetainedPage",
          errors=(400,), query=(("filter", "string", "a topic filter (#)"),) + _PAGING),
    Route("DELETE", ("retained",), "delete_retained", WRITE,
          "Delete the retained message of a topic, on every node", response="Accepted",
          errors=(400, 404), query=(("topic", "string", "the topic name (required)"),)),
    Route("GET", ("credentials",), "list_credentials", READ,
          "Every client credentials record, by name", response="CredentialsList"),
    Route("POST", ("credentials",), "add_credentials", WRITE, "Add client credentials",
          body="CredentialsInput", response="Credentials", status=201,
          errors=(400, 409, 422)),
    Route("GET", ("credentials", "{id}"), "show_credentials", READ,
          "One credentials record (by id or name)", response="Credentials", errors=(404,)),
    Route("PATCH", ("credentials", "{id}"), "change_credentials", WRITE,
          "Change a credentials record; fields left out keep their value",
          body="CredentialsChange", response="Credentials", errors=(400, 404, 409, 422)),
    Route("DELETE", ("credentials", "{id}"), "remove_credentials", WRITE,
          "Remove a credentials record", response="Accepted", errors=(404,)),
    Route("GET", ("nodes",), "list_nodes", READ, "The nodes of the cluster",
          response="NodeList"),
    Route("GET", ("metrics",), "metrics", READ,
          "A snapshot of this node's and the cluster's figures",
          response="MetricsSnapshot"),
    Route("GET", ("metrics", "history"), "metrics_history", READ,
          "Per-second rates of this node over the last minutes", response="MetricsHistory"),
    Route("GET", ("metrics", "cluster"), "cluster_metrics", READ,
          "The cluster's message totals and rates, summed over the live nodes' heartbeats, "
          "per node, and over the last minutes", response="ClusterMetrics", errors=(404,)),
    Route("GET", ("kafka",), "kafka", READ,
          "The bus's topics (partitions, latest offsets) and consumer groups (lag per "
          "topic and partition)", response="KafkaOverview", errors=(404, 501, 503)),
    Route("GET", ("integrations",), "list_integrations", READ,
          "This node's integrations (config integrations) with their counters and buffer",
          response="IntegrationList"),
    Route("POST", ("integrations",), "put_integration", WRITE,
          "Add or replace an integration on every node (through the bus topic "
          "tbmq.integrations); the keys are those of the config file's integrations",
          body="IntegrationInput", response="Accepted", status=202, errors=(400, 409, 422)),
    Route("DELETE", ("integrations", "{name}"), "remove_integration", WRITE,
          "Remove an integration added through the API, on every node",
          response="Accepted", status=202, errors=(404, 409)),
    Route("GET", ("audit",), "audit", READ, "The last changes made through the API, newest first",
          response="AuditList"),
    # the client lists (tbmq.ops.api.blocked)
    Route("GET", ("blocked-clients",), "list_blocked", READ,
          "The blocked clients of the cluster (CONNACK 0x8A Banned)",
          response="BlockedClientList"),
    Route("POST", ("blocked-clients",), "add_blocked", WRITE,
          "Block clients by client id, user name, IP address or regex, on every node; "
          "connected ones are disconnected (0x98)", body="BlockedClientInput",
          response="BlockedClient", status=201, errors=(400, 422)),
    Route("DELETE", ("blocked-clients", "{id}"), "remove_blocked", WRITE,
          "Remove a blocked client entry on every node", response="Accepted", errors=(404,)),
    Route("GET", ("unauthorized-clients",), "list_unauthorized", READ,
          "The last refused connection attempt per client id, on every node",
          response="UnauthorizedClientList"),
    Route("DELETE", ("unauthorized-clients",), "clear_unauthorized", WRITE,
          "Forget the refused connection attempts on every node", response="Accepted"),
)


def match(method: str, segments: list[str]) -> tuple[Route | None, dict, list[str]]:
    """Find the route of a request.

    :param segments: the path after ``/api/``, decoded.
    :returns: ``(route, parameters, allowed methods)``; ``route`` None when
        nothing matches (``allowed`` then lists the methods of the path, if
        any: a 405).
    """
    allowed = []
    for route in ROUTES:
        if len(route.path) != len(segments):
            continue
        params = {}
        for pattern, segment in zip(route.path, segments):
            if pattern.startswith("{"):
                if not segment:
                    break
                params[pattern[1:-1]] = segment
            elif pattern != segment:
                break
        else:
            if route.method == method:
                return route, params, []
            allowed.append(route.method)
    return None, {}, allowed
