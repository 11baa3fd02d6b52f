"""trimq's command-line tools (click), apart from the SDK and the daemons' library code.

=====================  ==========================  ==============================
command                module                      library it drives
=====================  ==========================  ==============================
``trimq-broker``       :mod:`trimq.tools.broker`    :class:`trimq.broker.broker.Broker`
``trimq-namesrv``      :mod:`trimq.tools.namesrv`   the name server
``trimq-producer``     :mod:`trimq.tools.producer`  :class:`trimq.client.producer.Producer`
``trimq-consumer``     :mod:`trimq.tools.consumer`  :class:`trimq.client.push_consumer.PushConsumer`
``trimq-admin``        :mod:`trimq.tools.admin`     :class:`trimq.client.admin.Admin`
=====================  ==========================  ==============================

Every command takes ``--version``. ``trimq-audit`` (argparse, it also runs under ``spark-submit``) lives
with the audit in :mod:`trimq.spark_jobs.cli`.
"""
