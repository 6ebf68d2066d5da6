"""tbmq: an MQTT 3.1/3.1.1/5.0 broker on Twisted with the design of TBMQ."""

__version__ = "0.1.0"
