"""PySpark analytics of the exported event log (``docs/events.md``).

Never imported by the broker.  The layers:

* :mod:`tbmq.analytics.schema` -- the explicit schema of the log (version 1);
* :mod:`tbmq.analytics.reading` -- reading JSON Lines or Parquet from any
  Hadoop path, splitting valid events from bad input;
* :mod:`tbmq.analytics.transforms` -- pure transforms, one table each;
* :mod:`tbmq.analytics.jobs` -- the thin job writing every table (Parquet,
  CSV) and :mod:`tbmq.analytics.report`, the HTML report with its charts;
* :mod:`tbmq.analytics.cli` -- the ``tbmq-analytics`` command (also run by
  ``spark-submit``);
* :mod:`tbmq.analytics.generator` -- synthetic logs for tests and benchmarks.
"""
