"""Prometheus text format (version 0.0.4) of a warehouse's facts (``watch_facts``):
``sparkfill ui``'s ``/metrics``.

Invariant: a pure function of the facts — it reads nothing itself — so the metrics
always agree with ``/api/watch`` and ``/api/status`` built from the same read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["metrics_text", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Out:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, help_: str, samples: Sequence[tuple[dict[str, str], Any]],
               kind: str = "gauge") -> None:
        """One metric family; samples whose value is None are left out."""
        self.lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        for labels, value in samples:
            if value is None:
                continue
            shown = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            self.lines.append(f"{name}{{{shown}}} {_number(float(value))}" if shown
                              else f"{name} {_number(float(value))}")


def metrics_text(facts: dict[str, Any]) -> str:
    """The facts as Prometheus metrics: the committed epoch and the last epoch's
    parts, the time since the last commit, each creating job's progress, rate,
    ETA, stall and lag, each relation's rows, each sink's lag and each source's
    rows and dead letters."""
    status = facts["status"]
    timeline = facts["timeline"]
    out = _Out()
    committed = status["committed_epoch"]
    out.family("sparkfill_committed_epoch", "The last committed epoch.", [({}, committed)])

    def last(series: str) -> Any:
        values = [v for v in timeline[series] if v is not None]
        return values[-1] if values else None

    epochs = timeline["epoch"]
    latest = epochs[-1] == committed if epochs else False
    out.family("sparkfill_epoch_seconds",
               "Seconds the last committed epoch took to compute and append its changes.",
               [({}, timeline["seconds"][-1] if latest else None)])
    out.family("sparkfill_epoch_backfill_seconds",
               "Of sparkfill_epoch_seconds, the creating jobs' own share.",
               [({}, timeline["backfill_seconds"][-1] if latest else None)])
    out.family("sparkfill_epoch_commit_seconds",
               "Seconds of the last recorded commit and the work after it (housekeeping, "
               "sinks, sampled VERIFY): recorded once the next epoch commits.",
               [({}, last("commit_seconds"))])
    out.family("sparkfill_epoch_changes", "Rows the last committed epoch's changes held.",
               [({}, timeline["changes"][-1] if latest else None)])
    out.family("sparkfill_epoch_spark_jobs", "Spark jobs the last committed epoch ran.",
               [({}, timeline["spark_jobs"][-1] if latest else None)])
    commit_at = facts.get("last_commit_at")
    out.family("sparkfill_last_commit_timestamp_seconds",
               "When the last committed epoch finished (Unix time).", [({}, commit_at)])
    out.family("sparkfill_commit_lag_seconds",
               "Seconds since the last epoch committed (how stale the warehouse is).",
               [({}, None if commit_at is None else max(0.0, facts["now"] - commit_at))])
    pending = facts.get("pending")
    out.family("sparkfill_epoch_in_flight",
               "1 while an epoch is planned and not yet committed.",
               [({}, 0 if pending is None else 1)])
    jobs = status["jobs"]

    def per_job(key: str, scale: float = 1.0) -> list[tuple[dict[str, str], Any]]:
        return [({"mv": j["name"], "strategy": j["strategy"]},
                 None if j[key] is None else float(j[key]) * scale) for j in jobs]

    out.family("sparkfill_job_progress_ratio",
               "A creating MV's job: upstream snapshot rows scanned, of about how many (0-1).",
               per_job("percent", 0.01))
    out.family("sparkfill_job_rows_done", "A creating MV's job: upstream snapshot rows scanned.",
               per_job("rows_done"))
    out.family("sparkfill_job_rows_estimate", "A creating MV's job: about the rows to scan.",
               per_job("rows_total_estimate"))
    out.family("sparkfill_job_rows_per_second",
               "A creating MV's job: rows scanned per second over its last epochs.",
               per_job("rows_per_second"))
    out.family("sparkfill_job_eta_seconds", "A creating MV's job: seconds left at its rate.",
               per_job("eta_seconds"))
    out.family("sparkfill_job_running_seconds", "A creating MV's job: seconds since it began.",
               per_job("running_seconds"))
    out.family("sparkfill_job_stalled", "A creating MV's job: 1 when stalled.",
               [(labels, int(bool(v))) for labels, v in per_job("stalled")])
    out.family("sparkfill_job_paused", "A creating MV's job: 1 when paused (rate limit 0).",
               [(labels, int(bool(v))) for labels, v in per_job("paused")])
    out.family("sparkfill_job_lag_epochs",
               "A snapshot job catching up: committed epochs it has not consumed yet.",
               per_job("lag_epochs"))
    out.family("sparkfill_relation_rows", "Rows of a table or materialized view.",
               [({"relation": r["name"], "kind": r["kind"], "state": r["state"]}, r["rows"])
                for r in status["relations"] if r["kind"] != "state"])
    out.family("sparkfill_sink_epoch_written", "The epoch a sink's Delta table holds.",
               [({"sink": s["name"], "mv": s["from"]}, s["epoch_written"])
                for s in status["sinks"]])
    out.family("sparkfill_sink_lag_epochs", "Committed epochs a sink has not written yet.",
               [({"sink": s["name"], "mv": s["from"]},
                 committed - (s["epoch_written"] or 0)) for s in status["sinks"]])
    out.family("sparkfill_source_rows_total", "Rows a source table has taken.",
               [({"source": s["name"], "connector": s["connector"]}, s["rows"])
                for s in status["sources"]], kind="counter")
    out.family("sparkfill_source_dead_letters_total", "Malformed records a source sent aside.",
               [({"source": s["name"], "connector": s["connector"]}, s["dead_letters"])
                for s in status["sources"]], kind="counter")
    out.family("sparkfill_warnings", "Warnings the page shows (work after a commit that "
               "failed, sinks behind, VERIFY differences, stalled jobs, dead letters).",
               [({}, len(facts["warnings"]))])
    out.family("sparkfill_errors", "Errors the page shows (an epoch that does not commit).",
               [({}, len(facts["errors"]))])
    return "\n".join(out.lines) + "\n"
