"""``sparkfill ui``: a live web page of a warehouse — its dataflow graph, each creating
job's progress, the epoch timeline, warnings and errors — plus the same facts as JSON
(``/api/status``, ``/api/watch``) and Prometheus metrics (``/metrics``).

Invariant: the UI only reads. It opens the meta store read-only (no writer lock)
and reads Delta logs for sizes; it never starts Spark and never writes to the
warehouse, so it runs beside a running writer, on a read-only copy, and against a
PostgreSQL meta store. ``facts`` builds the JSON, ``metrics`` the Prometheus text,
``server`` serves them and the page (``static/``, with uPlot vendored: no CDN, the
page works offline).
"""
