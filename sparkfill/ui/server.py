"""The ``sparkfill ui`` server: the page, its JSON and Prometheus metrics, over HTTP.

Invariant: the server only reads (see ``sparkfill.ui``): one meta-store connection
opened read-only, without the writer lock, used by one request at a time, and
reopened after an error (a PostgreSQL server restarted, a warehouse copied over).
A SQLite meta store replaced under it (``make demo`` starts again with a new
warehouse) is reopened too. It never starts Spark. It listens on loopback unless
told otherwise.

Routes: ``/`` the page (``static/index.html``, which polls ``/api/watch``),
``/static/...`` its script, style and the vendored uPlot, ``/api/status`` the facts
of ``sparkfill status --json``, ``/api/watch?epochs=N`` the page's facts (the
status, the dataflow graph, the last N epochs, warnings, errors), ``/metrics``
Prometheus text format. A read that fails answers 503 with ``{"error": ...}``.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

from ..errors import SparkfillError
from ..storage.warehouse import Warehouse
from .facts import SizeCache, open_meta, status_facts, watch_facts
from .metrics import CONTENT_TYPE, metrics_text

__all__ = ["FactsReader", "UiServer", "make_app", "DEFAULT_PORT", "STATIC_DIR"]

DEFAULT_PORT = 8765
STATIC_DIR = Path(__file__).parent / "static"
#: the epochs the page charts by default, and at most
DEFAULT_EPOCHS = 120
MAX_EPOCHS = 2000


class FactsReader:
    """A warehouse's facts, read from its meta store opened read-only."""

    def __init__(self, warehouse: Warehouse, meta_url: str | None = None) -> None:
        self.warehouse = warehouse
        self.meta_url = meta_url
        self.sizes = SizeCache(warehouse)
        self._meta: Any = None
        #: the SQLite file the meta store was opened from: (device, inode)
        self._file: tuple[int, int] | None = None
        self._lock = threading.Lock()

    def check(self) -> None:
        """Open the meta store and read the facts once now (the first page then finds
        the code loaded and sizes read): raises ``SparkfillError`` for a folder that is
        not a warehouse, a wrong ``meta_url`` or an unreachable PostgreSQL server."""
        self.watch()

    def _sqlite_file(self) -> tuple[int, int] | None:
        local = self.warehouse.local_path
        if self.meta_url is not None or local is None:
            return None
        try:
            st = os.stat(local / "meta.sqlite")
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    def _open(self) -> Any:
        found = self._sqlite_file()
        if self._meta is not None and found != self._file:
            self._close()  # the warehouse was removed or made anew: read the new one
        if self._meta is None:
            self._meta = open_meta(self.warehouse, self.meta_url)
            self._file = found
        return self._meta

    def _read(self, build: Any) -> dict[str, Any]:
        with self._lock:
            meta = self._open()
            try:
                return build(meta)  # type: ignore[no-any-return]
            except BaseException:
                self._close()  # reopened by the next read
                raise

    def _close(self) -> None:
        if self._meta is not None:
            try:
                self._meta.close()
            except Exception:  # noqa: BLE001 - a broken connection: dropped either way
                pass
            self._meta = None

    def status(self) -> dict[str, Any]:
        return self._read(lambda meta: status_facts(meta, self.warehouse))

    def watch(self, epochs: int = DEFAULT_EPOCHS) -> dict[str, Any]:
        return self._read(lambda meta: watch_facts(meta, self.warehouse, self.sizes, epochs))

    def close(self) -> None:
        with self._lock:
            self._close()


def make_app(reader: FactsReader) -> Any:
    """The Starlette application serving ``reader``'s facts and the page."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import FileResponse, JSONResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    no_cache = {"Cache-Control": "no-store"}

    def answer(build: Any, render: Any) -> Response:
        try:
            return render(build())  # type: ignore[no-any-return]
        except Exception as exc:  # noqa: BLE001 - the page shows it and keeps polling
            text = str(exc) if isinstance(exc, SparkfillError) \
                else f"{type(exc).__name__}: {exc}"
            return JSONResponse({"error": f"cannot read the meta store: {text}"},
                                status_code=503, headers=no_cache)

    def as_json(facts: dict[str, Any]) -> Response:
        return Response(json.dumps(facts, default=str), media_type="application/json",
                        headers=no_cache)

    def index(request: Request) -> Response:
        return FileResponse(STATIC_DIR / "index.html", headers=no_cache)

    def status(request: Request) -> Response:
        return answer(reader.status, as_json)

    def watch(request: Request) -> Response:
        try:
            epochs = int(request.query_params.get("epochs", DEFAULT_EPOCHS))
        except ValueError:
            return JSONResponse({"error": "epochs must be a number"}, status_code=400)
        epochs = max(1, min(MAX_EPOCHS, epochs))
        return answer(lambda: reader.watch(epochs), as_json)

    def metrics(request: Request) -> Response:
        return answer(reader.watch, lambda facts: Response(
            metrics_text(facts), media_type=CONTENT_TYPE, headers=no_cache))

    return Starlette(routes=[
        Route("/", index),
        Route("/api/status", status),
        Route("/api/watch", watch),
        Route("/metrics", metrics),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
    ])


class UiServer:
    """``sparkfill ui``'s HTTP server (uvicorn) over a warehouse: ``run()`` in the
    foreground (the command line), or ``start()``/``stop()`` in a thread (tests,
    the benchmark). ``port`` 0 takes a free port (``url`` tells which)."""

    def __init__(self, warehouse: Warehouse, meta_url: str | None = None,
                 host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> None:
        import uvicorn

        self.reader = FactsReader(warehouse, meta_url)
        self.reader.check()
        try:
            self._socket = socket.create_server((host, port), reuse_port=False)
        except OSError as exc:
            self.reader.close()
            raise SparkfillError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") \
                from None
        bound = self._socket.getsockname()
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        self.url = f"http://{shown}:{bound[1]}/"
        config = uvicorn.Config(make_app(self.reader), log_level="warning", access_log=False,
                                lifespan="off", http="h11", ws="none")
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        """Serve until interrupted (Ctrl-C)."""
        try:
            self._server.run(sockets=[self._socket])
        finally:
            self.close()

    def start(self) -> str:
        """Serve from a thread; returns the URL once the server answers."""
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._socket]},
                                        name="sparkfill-ui", daemon=True)
        self._thread.start()
        for _ in range(200):
            if self._server.started:
                return self.url
            if not self._thread.is_alive():
                break
            threading.Event().wait(0.05)
        raise SparkfillError(f"the UI server did not start on {self.url}")

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.close()

    def close(self) -> None:
        self._socket.close()
        self.reader.close()
