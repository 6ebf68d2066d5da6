"""Makes ``twistd tbmq`` start a tbmq node (see :mod:`tbmq.tap`)."""

from twisted.application.service import ServiceMaker

tbmq = ServiceMaker("tbmq", "tbmq.tap", "An MQTT 3.1/3.1.1/5.0 broker (TBMQ's design)", "tbmq")
