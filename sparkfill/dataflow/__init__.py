"""Dataflow: an MV's operators over one epoch's changes (``mv``) and consolidated
changelogs (``changelog``)."""
