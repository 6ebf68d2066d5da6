"""Admin users of the REST API and the web console, and their login tokens.

**Where they live.**  Beside the credentials, in a table of their own:
``<data_dir>/admins.sqlite3`` for the embedded node (``auth.credentials``
``sqlite`` or ``memory``), and the PostgreSQL database of ``postgres.dsn``
when ``auth.credentials: postgres``, so that every node of a cluster knows
the same users and signs tokens with the same key.  Admin users are not
MQTT credentials: they never authenticate an MQTT client, and MQTT
credentials never log in here.  The table is ``tbmq_admin_users (name,
role, password, created_time, updated_time)``; ``tbmq_admin_settings``
holds the token signing key, made once.

**Roles.**  ``admin`` may read and change everything; ``viewer`` may read
(every change is refused with 403).

**Tokens.**  ``POST /api/auth/login`` checks the bcrypt password (in a
thread) and returns a JSON Web Token (HS256, PyJWT) naming the user, valid
``http.token_ttl`` seconds.  Each request's token is checked for its
signature and expiry, and its user must still exist (users are re-read at
most every :data:`USERS_TTL` seconds): a removed user's tokens stop working
within that time.  With no admin user at all the API refuses every request.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import jwt
from twisted.internet import defer, threads

from tbmq.auth.passwords import check_password, hash_password
from tbmq.errors import ConfigError

#: the roles of admin users
ROLES = ("admin", "viewer")
#: the file of the embedded node's admin users, in ``data_dir``
FILE_NAME = "admins.sqlite3"
#: seconds the API keeps the list of users before reading it again
USERS_TTL = 2.0
#: a valid bcrypt hash that matches no password: an unknown user's login
#: costs the same bcrypt work as a known one's
_DUMMY_HASH = "$2b$12$7MUxcXD7kmtwAXEYN6UQj.xHB9uiv.LzuQx129ySyqgw3qEEYfpwy"

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS tbmq_admin_users (name TEXT PRIMARY KEY, role TEXT NOT NULL, "
    "password TEXT NOT NULL, created_time DOUBLE PRECISION NOT NULL, "
    "updated_time DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS tbmq_admin_settings (name TEXT PRIMARY KEY, "
    "value TEXT NOT NULL)",
)

#: PostgreSQL: the transaction-scoped advisory lock taken before the schema
#: statements (``b"tbmqadmn"`` as a big-endian bigint).  ``CREATE TABLE IF
#: NOT EXISTS`` is not safe against itself: two nodes starting together
#: could both create the table's row type, and one failed to start with a
#: unique violation of ``pg_type_typname_nsp_index``.
SCHEMA_LOCK = ("SELECT pg_advisory_xact_lock(%d)"
               % (int.from_bytes(b"tbmqadmn", "big") - (1 << 63)),)


class AdminError(Exception):
    """A refused admin-user operation (unknown user, bad name or role)."""


@dataclass(frozen=True)
class AdminUser:
    """:ivar name: the login name.
    :ivar role: ``admin`` or ``viewer``.
    :ivar created_time: seconds since the epoch.
    :ivar updated_time: seconds since the epoch."""

    name: str
    role: str
    created_time: float
    updated_time: float


class AdminStore:
    """Admin users in SQL (DB-API): SQLite or PostgreSQL.

    The blocking methods (``*_sync``) serve the ``tbmq admin`` command; the
    node calls the others, which run them in a thread.

    :param connect: ``connect() -> DB-API connection``.
    :param paramstyle: ``qmark`` (sqlite3) or ``format`` (psycopg2).
    :param schema_lock: statements run first in every transaction, before
        the schema's (PostgreSQL: :data:`SCHEMA_LOCK`, so nodes starting
        together create the tables one after the other).
    """

    def __init__(self, connect: Callable[[], Any], paramstyle: str = "qmark",
                 schema_lock: tuple[str, ...] = ()) -> None:
        self.connect = connect
        self.paramstyle = paramstyle
        self.schema_lock = schema_lock

    def _sql(self, statement: str) -> str:
        return statement if self.paramstyle == "qmark" else statement.replace("?", "%s")

    def _run(self, work: Callable[[Any], Any]) -> Any:
        conn = self.connect()
        try:
            cursor = conn.cursor()
            for statement in self.schema_lock + _SCHEMA:
                cursor.execute(statement)
            result = work(cursor)
            conn.commit()
            return result
        finally:
            conn.close()

    # -- blocking ------------------------------------------------------------------

    def add_sync(self, name: str, password: str, role: str = "admin",
                 rounds: int = 12, replace: bool = False) -> AdminUser:
        """Add (or with ``replace``, change) a user.

        :param name: 1..64 printable characters, no spaces.
        :param password: 8..72 bytes of UTF-8.
        :param role: one of :data:`ROLES`.
        :param rounds: the bcrypt cost factor.
        :raises AdminError: for a bad name, role or password, or an existing
            user without ``replace``.
        """
        if not name or len(name) > 64 or not name.isprintable() or " " in name:
            raise AdminError("an admin user name is 1 to 64 printable characters, no spaces")
        if role not in ROLES:
            raise AdminError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
        if len(password.encode("utf-8")) < 8:
            raise AdminError("an admin password has at least 8 characters")
        hashed = hash_password(password, rounds)
        now = time.time()

        def work(cursor):
            cursor.execute(self._sql("SELECT created_time FROM tbmq_admin_users WHERE name = ?"),
                           (name,))
            row = cursor.fetchone()
            if row is not None and not replace:
                raise AdminError(f"admin user {name!r} exists (--replace changes it)")
            created = row[0] if row is not None else now
            cursor.execute(self._sql("DELETE FROM tbmq_admin_users WHERE name = ?"), (name,))
            cursor.execute(self._sql(
                "INSERT INTO tbmq_admin_users (name, role, password, created_time, updated_time) "
                "VALUES (?, ?, ?, ?, ?)"), (name, role, hashed, created, now))
            return AdminUser(name, role, created, now)

        return self._run(work)

    def remove_sync(self, name: str) -> bool:
        """:returns: True when the user existed."""
        def work(cursor):
            cursor.execute(self._sql("DELETE FROM tbmq_admin_users WHERE name = ?"), (name,))
            return cursor.rowcount > 0

        return self._run(work)

    def list_sync(self) -> list[AdminUser]:
        """:returns: every user, by name."""
        def work(cursor):
            cursor.execute("SELECT name, role, created_time, updated_time FROM tbmq_admin_users "
                           "ORDER BY name")
            return [AdminUser(*row) for row in cursor.fetchall()]

        return self._run(work)

    def password_of_sync(self, name: str) -> tuple[AdminUser, str] | None:
        """:returns: ``(user, bcrypt hash)``, or None for an unknown name."""
        def work(cursor):
            cursor.execute(self._sql("SELECT name, role, created_time, updated_time, password "
                                     "FROM tbmq_admin_users WHERE name = ?"), (name,))
            row = cursor.fetchone()
            return None if row is None else (AdminUser(*row[:4]), row[4])

        return self._run(work)

    def secret_sync(self) -> str:
        """:returns: the token signing key, made (once, for every node) if
        there is none yet."""
        def work(cursor):
            cursor.execute(self._sql(
                "INSERT INTO tbmq_admin_settings (name, value) VALUES (?, ?) "
                "ON CONFLICT (name) DO NOTHING"), ("token_secret", secrets.token_hex(32)))
            cursor.execute(self._sql("SELECT value FROM tbmq_admin_settings WHERE name = ?"),
                           ("token_secret",))
            return cursor.fetchone()[0]

        return self._run(work)

    # -- in a thread ------------------------------------------------------------------

    def list(self) -> defer.Deferred:
        """:returns: Deferred firing with :meth:`list_sync`'s answer."""
        return threads.deferToThread(self.list_sync)

    def secret(self) -> defer.Deferred:
        """:returns: Deferred firing with :meth:`secret_sync`'s answer."""
        return threads.deferToThread(self.secret_sync)

    def check(self, name: str, password: str) -> defer.Deferred:
        """Check a login (bcrypt in a thread; an unknown name costs the same).

        :returns: Deferred firing with the :class:`AdminUser`, or None when
            the name or the password is wrong.
        """
        def work():
            found = self.password_of_sync(name)
            hashed = found[1] if found is not None else _DUMMY_HASH
            ok = check_password(password, hashed)
            return found[0] if (ok and found is not None) else None

        return threads.deferToThread(work)


def open_admin_store(config) -> AdminStore:
    """The admin store of ``config`` (see the module's docstring).

    :raises ConfigError: when PostgreSQL is named and psycopg2 is missing.
    """
    if config.auth.credentials == "postgres":
        try:
            import psycopg2  # noqa: PLC0415
        except ImportError:
            raise ConfigError("auth.credentials: postgres needs psycopg2 for the admin "
                              "users (pip install 'tbmq[postgres]')",
                              key="auth.credentials") from None
        dsn = config.postgres.dsn
        return AdminStore(lambda: psycopg2.connect(dsn), "format", SCHEMA_LOCK)
    path = os.path.join(config.data_dir, FILE_NAME)

    def connect():
        os.makedirs(config.data_dir, exist_ok=True)
        return sqlite3.connect(path, timeout=10)

    return AdminStore(connect, "qmark")


class TokenError(Exception):
    """A login token that is missing, malformed, expired or of no user.

    :ivar status: the HTTP status to answer with (401 or 403).
    """

    def __init__(self, message: str, status: int = 401) -> None:
        super().__init__(message)
        self.status = status


class AdminAuth:
    """Logins and tokens of the API.

    :param store: the :class:`AdminStore`.
    :param ttl: seconds a token is valid.
    :param wall: ``wall() -> float``, seconds since the epoch.
    """

    ALGORITHM = "HS256"

    def __init__(self, store: AdminStore, ttl: float, wall=time.time) -> None:
        self.store = store
        self.ttl = ttl
        self.wall = wall
        self._secret: str | None = None
        self._users: dict[str, AdminUser] = {}
        self._users_at = float("-inf")

    async def users(self) -> dict[str, AdminUser]:
        """:returns: name → user, read again when older than :data:`USERS_TTL`."""
        if self.wall() - self._users_at > USERS_TTL:
            self._users = {u.name: u for u in await self.store.list()}
            self._users_at = self.wall()
        return self._users

    async def _key(self) -> str:
        if self._secret is None:
            self._secret = await self.store.secret()
        return self._secret

    async def login(self, name: str, password: str) -> dict:
        """:returns: ``{token, expires_at, user: {name, role}}``.
        :raises TokenError: 403 when no admin user exists, 401 for a wrong
            name or password."""
        if not await self.users():
            raise TokenError("no admin user is defined: add one with 'tbmq admin add'", 403)
        user = await self.store.check(name, password)
        if user is None:
            raise TokenError("wrong user name or password")
        self._users[user.name] = user
        now = self.wall()
        expires = now + self.ttl
        token = jwt.encode({"sub": user.name, "role": user.role, "iat": int(now),
                            "exp": int(expires), "jti": uuid.uuid4().hex},
                           await self._key(), algorithm=self.ALGORITHM)
        return {"token": token, "expires_at": int(expires),
                "user": {"name": user.name, "role": user.role}}

    async def authenticate(self, authorization: str | None) -> AdminUser:
        """The user of an ``Authorization: Bearer <token>`` header.

        :raises TokenError: 403 when no admin user exists; 401 for a
            missing, malformed, expired or unknown token, or a user removed
            since."""
        users = await self.users()
        if not users:
            raise TokenError("no admin user is defined: add one with 'tbmq admin add'", 403)
        if not authorization or not authorization.startswith("Bearer "):
            raise TokenError("a login token is needed (Authorization: Bearer <token>)")
        try:
            claims = jwt.decode(authorization[7:].strip(), await self._key(),
                                algorithms=[self.ALGORITHM], options={"require": ["exp", "sub"]})
        except jwt.ExpiredSignatureError:
            raise TokenError("the login token has expired") from None
        except jwt.InvalidTokenError as e:
            raise TokenError(f"invalid login token: {e}") from None
        user = users.get(claims["sub"])
        if user is None:
            raise TokenError("the login token's user no longer exists")
        return user
