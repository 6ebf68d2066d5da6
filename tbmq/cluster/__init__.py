"""What nodes share through the bus (ARCHITECTURE §1, §2): the record types
and their encodings (:mod:`tbmq.cluster.records`) and TBMQ's topic catalogue
(:mod:`tbmq.cluster.topics`).  Later: the session registry, session events
and takeover, delivery targets and sinks, all on the bus interface only.
"""
