"""trimq's command-line tools (click), apart from the SDK and the daemons' library code.

* ``trimq-broker`` (:mod:`trimq.tools.broker`) runs :class:`trimq.broker.broker.Broker`;
* ``trimq-namesrv`` (:mod:`trimq.tools.namesrv`) runs a standalone name server;
* ``trimq-producer`` (:mod:`trimq.tools.producer`) sends through :class:`trimq.client.producer.Producer`;
* ``trimq-consumer`` (:mod:`trimq.tools.consumer`) consumes with
  :class:`trimq.client.push_consumer.PushConsumer`;
* ``trimq-admin`` (:mod:`trimq.tools.admin`) prints the results of :class:`trimq.client.admin.Admin`.

Shared helpers are in :mod:`trimq.tools.common`, the producer's and consumer's record files in
:mod:`trimq.tools.records`. Every command takes ``--version``. ``trimq-audit`` (argparse; it also runs
under ``spark-submit``) lives with the audit, in :mod:`trimq.spark_jobs.cli`.
"""
