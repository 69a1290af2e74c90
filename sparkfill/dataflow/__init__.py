"""Dataflow: an MV's operators over one epoch's changes, one module per operator.

``mv`` (``MvDataflow``: the operators of one MV composed in order — rows, then the
aggregate or the window functions), ``project`` (filter/project, the row stage),
``union`` (UNION ALL), ``join`` (two-way joins and their state tables), ``aggregate``
(GROUP BY, running values), ``window`` (window functions), ``topn`` (ORDER BY ...
LIMIT), ``recompute`` (an MV's and its state tables' rows from whole inputs, and their
difference from the last epoch), ``change`` (a change as before/after images, signed
changes), ``keys`` (partition keys as JSON, touched keys), ``changelog`` (consolidated
changelogs), ``statement`` (a rule as one SQL statement over its input frames,
analysed once).
"""
