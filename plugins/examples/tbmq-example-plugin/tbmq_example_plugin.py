"""An example third-party tbmq plugin, installed as its own distribution and
found through the ``tbmq`` entry-point group.

Settings (``plugins: {example: {...}}`` in the broker's config):

``audit_file``
    a path; every connect and every published message appends a line.
``deny_prefix``
    a topic prefix nobody may publish under (a decision hook: it answers
    False there and None elsewhere, passing to the other plugins).
"""

from tbmq.hookspecs import hookimpl


class ExamplePlugin:
    def __init__(self):
        self.audit_file = None
        self.deny_prefix = None

    @hookimpl
    def tbmq_configure(self, config):
        settings = config.plugins.get("example", {})
        self.audit_file = settings.get("audit_file")
        self.deny_prefix = settings.get("deny_prefix")

    def _audit(self, line):
        if self.audit_file:
            with open(self.audit_file, "a", encoding="utf-8") as f:
                f.write(line + "\n")

    @hookimpl
    def tbmq_broker_started(self, broker):
        self._audit(f"started {broker.service_id}")

    @hookimpl
    def tbmq_client_connected(self, session, connect, address):
        self._audit(f"connected {session.client_id}")

    @hookimpl
    def tbmq_message_published(self, session, message):
        self._audit(f"published {message.publisher} {message.topic}")

    @hookimpl
    def tbmq_authorize_publish(self, session, auth, topic):
        if self.deny_prefix and topic.startswith(self.deny_prefix):
            return False
        return None


plugin = ExamplePlugin()
