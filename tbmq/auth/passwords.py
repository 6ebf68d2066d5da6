"""Password hashing for the credential types of :class:`tbmq.model.CredentialsType`.

MQTT_BASIC credentials keep a bcrypt hash of the password (TBMQ stores
Spring's ``BCryptPasswordEncoder`` output, ``$2a$10$...``, which
:func:`check_password` accepts).  bcrypt is slow on purpose (about 70 ms at
10 rounds), so the broker checks passwords with :func:`check_password_async`,
in a thread: a flood of wrong passwords never blocks the reactor.

SCRAM credentials keep what RFC 5802 §3 lets a server keep instead of the
password: a salt, the iteration count, ``StoredKey`` and ``ServerKey``
(:func:`scram_credentials`, computed by :mod:`scramp`, RFC 7677 for
SCRAM-SHA-256, the same construction with SHA-512).
"""

from __future__ import annotations

import base64
import hmac
from typing import Any, Callable, Mapping

import bcrypt
from scramp import ScramException, ScramMechanism
from twisted.internet import defer, threads

from tbmq.errors import CredentialsError

__all__ = [
    "BCRYPT_MAX_PASSWORD_BYTES",
    "DEFAULT_ROUNDS",
    "SCRAM_ALGORITHMS",
    "SCRAM_MIN_ITERATIONS",
    "UNKNOWN_USER_HASH",
    "check_password",
    "check_password_async",
    "check_scram_password",
    "hash_password",
    "scram_auth_info",
    "scram_credentials",
]

#: bcrypt's cost factor by default (2**10 iterations), Spring's default
#: strength and so TBMQ's.
DEFAULT_ROUNDS = 10

#: A bcrypt hash, at :data:`DEFAULT_ROUNDS`, of a password no client sends:
#: the password of a client no provider recognised is checked against it, so
#: that refusing an unknown user name takes as long as refusing a wrong
#: password (of credentials hashed at the default cost) and the time does
#: not tell which user names exist.
UNKNOWN_USER_HASH = "$2b$10$ZoX/Aly4tWXwiRIdkkbIB.k10yHPV4aoCOObw012NjXcOWqbHstwa"

#: bcrypt reads at most this many bytes of a password.
BCRYPT_MAX_PASSWORD_BYTES = 72

#: The SCRAM algorithms of TBMQ's SCRAM credentials → the SASL mechanism.
SCRAM_ALGORITHMS = {"SHA256": "SCRAM-SHA-256", "SHA512": "SCRAM-SHA-512"}

#: RFC 7677 §4: the iteration count "SHOULD be at least 4096"; scramp
#: enforces it.
SCRAM_MIN_ITERATIONS = 4096


def _password_bytes(password: bytes | str) -> bytes:
    """:returns: ``password`` as bytes (a str is UTF-8 encoded)."""
    if isinstance(password, str):
        return password.encode("utf-8")
    if isinstance(password, (bytes, bytearray, memoryview)):
        return bytes(password)
    raise TypeError(f"password must be bytes or str, not {type(password).__name__}")


def hash_password(password: bytes | str, rounds: int = DEFAULT_ROUNDS) -> str:
    """Hash a password with bcrypt and a new random salt.

    This blocks for the whole hash (tens of milliseconds at 10 rounds): call
    it from the CLI or a thread, not from the reactor.

    :param password: the password; a str is UTF-8 encoded (the MQTT
        password field is binary data, [MQTT-3.1.3.5]).
    :param rounds: the bcrypt cost factor, 4..31 (2**rounds iterations).
    :returns: the modular crypt string, ``$2b$<rounds>$<salt><hash>``.
    :raises CredentialsError: when the password is longer than 72 bytes
        (bcrypt would ignore the rest) or ``rounds`` is out of range.
    """
    data = _password_bytes(password)
    if len(data) > BCRYPT_MAX_PASSWORD_BYTES:
        raise CredentialsError(
            f"password is {len(data)} bytes; bcrypt takes at most "
            f"{BCRYPT_MAX_PASSWORD_BYTES}"
        )
    if not 4 <= rounds <= 31:
        raise CredentialsError(f"bcrypt rounds must be between 4 and 31, not {rounds}")
    return bcrypt.hashpw(data, bcrypt.gensalt(rounds)).decode("ascii")


def check_password(password: bytes | str, hashed: str | bytes | None) -> bool:
    """Check a password against a bcrypt hash, in constant time (bcrypt
    compares the digests with a constant-time comparison).

    Blocks for the whole hash: the broker uses :func:`check_password_async`.

    :param password: the CONNECT password; a str is UTF-8 encoded.
    :param hashed: the stored hash (``$2a$``, ``$2b$`` or ``$2y$``).
    :returns: True when they match; False for a wrong password, a missing
        or malformed hash, or a password longer than 72 bytes (no hash
        made by :func:`hash_password` can match it).
    """
    if not hashed:
        return False
    try:
        data = _password_bytes(password)
        if len(data) > BCRYPT_MAX_PASSWORD_BYTES:
            return False
        digest = hashed.encode("ascii") if isinstance(hashed, str) else bytes(hashed)
        return bcrypt.checkpw(data, digest)
    except (ValueError, TypeError, UnicodeError):
        return False


def check_password_async(
    password: bytes | str,
    hashed: str | bytes | None,
    reactor: Any = None,
    threadpool: Any = None,
    cancelled: Callable[[], bool] | None = None,
) -> defer.Deferred:
    """:func:`check_password` in a thread, so the reactor goes on serving
    other clients while bcrypt works.

    :param password: the CONNECT password.
    :param hashed: the stored bcrypt hash.
    :param reactor: the reactor to report to; the global one when None.
    :param threadpool: the pool to run in; the reactor's own pool
        (:func:`twisted.internet.threads.deferToThread`) when None.  The
        broker passes the pool of :class:`tbmq.auth.guard.PasswordChecks`.
    :param cancelled: called in the thread before hashing; when it returns
        True the check is skipped and answers False (its connection is
        gone: nobody waits for the answer).
    :returns: a Deferred firing in the reactor thread with the bool.
    """
    if not hashed:
        return defer.succeed(False)
    if cancelled is None:
        check, args = check_password, (password, hashed)
    else:
        check, args = _check_unless_cancelled, (password, hashed, cancelled)
    if threadpool is None and reactor is None:
        return threads.deferToThread(check, *args)
    if reactor is None:
        from twisted.internet import reactor  # noqa: PLC0415
    if threadpool is None:
        threadpool = reactor.getThreadPool()
    return threads.deferToThreadPool(reactor, threadpool, check, *args)


def _check_unless_cancelled(password, hashed, cancelled: Callable[[], bool]) -> bool:
    return False if cancelled() else check_password(password, hashed)


def _mechanism(algorithm: str) -> ScramMechanism:
    """:returns: scramp's mechanism for TBMQ's algorithm name.
    :raises CredentialsError: for an unknown algorithm."""
    name = SCRAM_ALGORITHMS.get(str(algorithm).upper().replace("-", "").replace("_", ""))
    if name is None:
        raise CredentialsError(
            f"SCRAM algorithm must be one of {', '.join(SCRAM_ALGORITHMS)}, "
            f"not {algorithm!r}"
        )
    return ScramMechanism(name)


def scram_credentials(
    password: str,
    algorithm: str = "SHA256",
    iterations: int = SCRAM_MIN_ITERATIONS,
    salt: bytes | None = None,
) -> dict:
    """Derive what a SCRAM server stores for a password (RFC 5802 §3):
    ``SaltedPassword = Hi(Normalize(password), salt, i)``,
    ``StoredKey = H(HMAC(SaltedPassword, "Client Key"))``,
    ``ServerKey = HMAC(SaltedPassword, "Server Key")``; the password is
    SASLprep'ed (RFC 4013) first.

    Blocks for ``iterations`` PBKDF2 rounds: call it from the CLI or a
    thread.

    :param password: the password, a str.
    :param algorithm: ``"SHA256"`` (SCRAM-SHA-256, RFC 7677) or
        ``"SHA512"`` (SCRAM-SHA-512).
    :param iterations: the PBKDF2 iteration count, >= 4096 (RFC 7677 §4).
    :param salt: the salt; a random one of the hash's size when None
        (scramp's choice; tests pass one).
    :returns: ``{"salt", "storedKey", "serverKey"}`` as base64 strings,
        ``"iterations"`` (int) and ``"algorithm"`` (``SHA256``/``SHA512``),
        the fields of a SCRAM credentials value.
    :raises CredentialsError: for an unknown algorithm, too few iterations
        or a password SASLprep refuses.
    """
    mechanism = _mechanism(algorithm)
    algorithm_name = mechanism.name.removeprefix("SCRAM-").replace("-", "")
    try:
        salt_bytes, stored_key, server_key, count = mechanism.make_auth_info(
            password, iteration_count=iterations, salt=salt
        )
    except ScramException as e:
        raise CredentialsError(f"SCRAM credentials: {e}") from None
    except (ValueError, TypeError) as e:
        raise CredentialsError(f"SCRAM credentials: {e}") from None
    return {
        "salt": base64.b64encode(salt_bytes).decode("ascii"),
        "storedKey": base64.b64encode(stored_key).decode("ascii"),
        "serverKey": base64.b64encode(server_key).decode("ascii"),
        "iterations": count,
        "algorithm": algorithm_name,
    }


def scram_auth_info(value: Mapping) -> tuple[bytes, bytes, bytes, int]:
    """Decode a SCRAM credentials value for a SCRAM server (e.g. the
    ``auth_fn`` of :meth:`scramp.ScramMechanism.make_server`).

    :param value: the credentials value with ``salt``, ``storedKey``,
        ``serverKey`` (base64) and ``iterations``.
    :returns: ``(salt, stored_key, server_key, iterations)``.
    :raises CredentialsError: when a field is missing or not base64.
    """
    try:
        return (
            base64.b64decode(value["salt"], validate=True),
            base64.b64decode(value["storedKey"], validate=True),
            base64.b64decode(value["serverKey"], validate=True),
            int(value["iterations"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CredentialsError(f"SCRAM credentials value is invalid: {e!r}") from None


def check_scram_password(password: str, value: Mapping) -> bool:
    """Check a password against stored SCRAM credentials (for tools and
    tests; MQTT clients prove it through the AUTH exchange instead).

    :param password: the password.
    :param value: a SCRAM credentials value (see :func:`scram_credentials`).
    :returns: True when the password derives the same ``StoredKey`` and
        ``ServerKey`` (compared in constant time); False otherwise,
        including for a malformed value.
    """
    try:
        salt, stored_key, server_key, iterations = scram_auth_info(value)
        derived = scram_credentials(
            password, value.get("algorithm", "SHA256"), iterations, salt
        )
    except CredentialsError:
        return False
    return hmac.compare_digest(
        derived["storedKey"], base64.b64encode(stored_key).decode("ascii")
    ) and hmac.compare_digest(
        derived["serverKey"], base64.b64encode(server_key).decode("ascii")
    )
