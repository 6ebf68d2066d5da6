"""Operating a node: Prometheus metrics (:mod:`~tbmq.ops.metrics`), the
``$SYS`` topics (:mod:`~tbmq.ops.sys_topics`), the REST admin API
(:mod:`~tbmq.ops.api`) and the web console (``console/``), served by the
node's HTTP listener (:mod:`~tbmq.ops.http`, ``http.endpoint``), with admin
users and their tokens (:mod:`~tbmq.ops.admins`).  Everything here reads
the broker; nothing runs on the message path.
"""
