"""Backfill: how a creating materialized view takes in its upstreams' existing rows
while their changes keep flowing.

``state`` (the states every strategy shares — ``NotStarted``, ``InProgress``,
``Done`` — and the per-epoch rule), ``scan`` (the default strategies over one
whole-order position: ``no_shuffle``, ``blocking``, ``buffer``), ``arrangement``
(one position per vnode), ``snapshot`` (the snapshot strategy's phase 1: its own
thread and checkpoints), ``snapshot_jobs`` (phases 2 and 3, in the epoch loop).
"""
