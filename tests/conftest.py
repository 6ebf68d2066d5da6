import os
import sys

# the first-party plugins of this checkout, not those of an installed tbmq
_PLUGINS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugins")
if _PLUGINS not in sys.path:
    sys.path.insert(0, _PLUGINS)

from tests.kafka import kafka_bootstrap, kafka_server  # noqa: E402, F401
from tests.postgres import postgres_dsn, reactor_thread  # noqa: E402, F401
