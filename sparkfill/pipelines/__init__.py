"""Pipelines: running epochs.

``coordinator`` (the epoch loop's one step: plan, Δ per relation in topological order,
commit), ``refresh`` (how a created MV takes an epoch's change: incremental or
recomputed), ``cost`` (costs measured per relation, fitted), ``live`` (epochs one after
another with a live display, ``sparkfill run``), ``pipeline`` (pipeline files: a SQL
file's statements and ``STEP``), ``pipeline_check`` (a pipeline's dry run).
"""
