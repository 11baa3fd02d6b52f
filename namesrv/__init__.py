"""The name server (trimq.namesrv): RocketMQ's namesrv beside the broker. Route tables (``routes``, a pure
core), the request handlers and the daemon (``service``), its settings (``config``) and metrics
(``metrics``). It imports ``trimq.protocol`` and ``trimq.runtime`` only; a broker with ``embedded_namesrv``
builds a NameServer on its own port.
"""
