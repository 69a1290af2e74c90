"""Pipeline files: the statements of a SQL file, in order, for ``sparkfill run``.

Invariant: splitting at ``;`` never cuts inside a quoted string ('...',
"..."), a quoted identifier (`...`) or a comment (``--``, ``/* */``); comments
are dropped and each statement keeps the line it starts on. Every statement is
parsed before any of them runs, so a file with a syntax error changes nothing.

Besides sparkfill's SQL, a pipeline may say ``STEP [n]``: run ``n`` epochs
(default 1) before the next statement — to let sources flow before an MV is
created over them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import SqlError
from ..sql.frontend import Command, parse_statement

__all__ = ["Statement", "split_statements", "parse_pipeline"]

_STEP = re.compile(r"^\s*STEP(?:\s+(?P<n>\d+))?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Statement:
    """One statement of a pipeline file."""

    text: str
    line: int
    #: ``STEP n``: the number of epochs to run; None for a SQL statement
    step: int | None = None
    command: Command | None = None

    @property
    def summary(self) -> str:
        first = " ".join(self.text.split())
        return first if len(first) <= 100 else first[:97] + "..."


def split_statements(text: str) -> list[tuple[str, int]]:
    """``(statement, first line)`` for each non-empty statement, comments removed."""
    out: list[tuple[str, int]] = []
    buf: list[str] = []
    line = 1
    start_line: int | None = None
    i, n = 0, len(text)
    quote = ""
    while i < n:
        ch = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if quote:
            buf.append(ch)
            if ch == "\\" and quote in "'\"" and nxt:
                buf.append(nxt)
                line += nxt == "\n"
                i += 2
                continue
            if ch == quote:
                quote = ""
        elif ch == "-" and nxt == "-":
            while i < n and text[i] != "\n":
                i += 1
            continue
        elif ch == "/" and nxt == "*":
            end = text.find("*/", i + 2)
            if end < 0:
                raise SqlError(f"line {line}: unterminated /* comment")
            line += text.count("\n", i, end)
            buf.append(" ")
            i = end + 2
            continue
        elif ch == ";":
            stmt = "".join(buf).strip()
            if stmt:
                out.append((stmt, start_line or line))
            buf, start_line = [], None
            i += 1
            continue
        else:
            if ch in "'\"`":
                quote = ch
            buf.append(ch)
        if start_line is None and not ch.isspace():
            start_line = line
        line += ch == "\n"
        i += 1
    if quote:
        raise SqlError(f"line {start_line}: unterminated {quote} quote")
    stmt = "".join(buf).strip()
    if stmt:
        out.append((stmt, start_line or line))
    return out


def parse_pipeline(text: str, where: str = "pipeline") -> list[Statement]:
    """Split and parse every statement; ``SqlError`` names the file and line."""
    try:
        parts = split_statements(text)
    except SqlError as exc:
        raise SqlError(f"{where}: {exc}") from exc
    statements = []
    for stmt, line in parts:
        m = _STEP.match(stmt)
        if m:
            statements.append(Statement(stmt, line, step=int(m.group("n") or 1)))
            continue
        try:
            command = parse_statement(stmt)
        except SqlError as exc:
            raise type(exc)(f"{where}:{line}: {exc}") from exc
        statements.append(Statement(stmt, line, command=command))
    return statements
