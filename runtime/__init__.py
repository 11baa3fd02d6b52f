"""trimq's shared runtime, below both daemons and the SDK: the one transport (``server``: RemotingServer,
``client``: RemotingClient), TLS (``tls``), the metrics HTTP endpoint (``metrics_http``) and RPC latency
metrics (``rpc_metrics``), the settings machinery (``settings``), structured logs (``logs``) and the helpers
both daemons share (``daemon``). It imports only ``trimq.protocol``; docs/ARCHITECTURE.md has the layers.
"""
