"""Storage: where relations and the engine's own state live.

``relation_store`` (each relation as a Delta table of changelog files, vnode
partitioned), ``meta_store`` (SQLite: epochs, catalog rows, progress, staged
batches), ``catalog`` (relations loaded from the meta store), ``metadata`` (SHOW and
EXPLAIN from the meta store, no Spark), ``dml`` (staging and applying DML),
``schema`` (columns, types, the physical layout), ``keyrange`` (positions in a
relation's key order and the range filters built from them), ``lock`` (the
warehouse's writer lock).
"""
