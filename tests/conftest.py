import pathlib
import sys

# The first-party plugins of this checkout, before any installed copy (an
# editable install may point at another checkout).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "plugins"))

from tests.kafka import kafka_bootstrap, kafka_server  # noqa: E402, F401
from tests.postgres import postgres_dsn, reactor_thread, started  # noqa: E402, F401
from tests.redis_server import redis_server, redis_url  # noqa: E402, F401
