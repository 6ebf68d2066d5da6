"""tbmq's first-party plugins, installed as the package ``tbmq_plugins`` and
loaded through the entry points of the group ``tbmq``, as anyone's plugins
are (see ``setup.py`` and :mod:`tbmq.plugins`).

Each module defines a plugin object, ``plugin``, whose hook implementations
(:mod:`tbmq.hookspecs`) provide a backend or a decision: the PostgreSQL
credential and device stores (:mod:`tbmq_plugins.postgres`), the Redis
device store (:mod:`tbmq_plugins.redis_store`), the authentication
providers (``auth_basic``, ``auth_x509``, ``auth_scram``, ``auth_jwt``).
Importing this package imports none of them: each brings its own optional
dependencies (``pip install 'tbmq[postgres]'``, ``'tbmq[redis]'``).
"""
