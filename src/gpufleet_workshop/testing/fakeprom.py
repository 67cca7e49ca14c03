"""Answers for :class:`gpufleet.prom.client.PromClient` without a Prometheus, for unit tests of its callers.

:class:`FakeProm` is a ``PromClient`` whose one HTTP exchange
(:meth:`~gpufleet.prom.client.PromClient.api`) is answered from a table
of query -> result, so ``query``, ``value`` and ``query_value`` run their
real code. A result is a list of series as Prometheus' HTTP API returns
them (``{"metric": {...}, "value": [t, "v"]}`` for a vector,
``{"metric": {...}, "values": [[t, "v"], ...]}`` for a matrix); a query
not in the table has an empty vector, as Prometheus answers a selector
that matches nothing. :meth:`FakeProm.fail` makes a query answer with an
error (:class:`~gpufleet.prom.client.PromError`), as an unreachable or
refusing Prometheus does. What it does not do: evaluate PromQL (the rules'
expressions are tested against a real Prometheus in
``tests/node_health/test_health_prometheus.py``).
"""

from __future__ import annotations

import threading
from typing import Any

from gpufleet.prom.client import PromClient, PromError


class FakeProm(PromClient):
    """A :class:`~gpufleet.prom.client.PromClient` answered from memory (module docstring).

    Attributes:
        queries: every ``(expression, time)`` asked, in order.
    """

    def __init__(self, answers: dict[str, list[dict[str, Any]]] | None = None, url: str = "fake://prometheus"):
        self.url = url
        self._answers: dict[str, list[dict[str, Any]]] = dict(answers or {})
        self._errors: dict[str, str] = {}
        self._lock = threading.Lock()
        self.queries: list[tuple[str, float | None]] = []

    def set(self, expr: str, series: list[dict[str, Any]]) -> None:
        """Answer ``expr`` with ``series`` from now on (and no longer fail it)."""
        with self._lock:
            self._answers[expr] = list(series)
            self._errors.pop(expr, None)

    def fail(self, expr: str | None = None, error: str = "connection refused") -> None:
        """Answer ``expr`` (None: every query) with an error from now on."""
        with self._lock:
            self._errors["*" if expr is None else expr] = error

    def clear(self) -> None:
        """Forget every answer and error."""
        with self._lock:
            self._answers.clear()
            self._errors.clear()

    def close(self) -> None:
        """Nothing to close."""

    def ready(self) -> bool:
        """Always ready (unless every query fails)."""
        return "*" not in self._errors

    def api(self, path: str, **params: Any) -> Any:
        """Answer ``/api/v1/<path>``: ``query`` from the table; anything else is an error naming it.

        Raises:
            PromError: the query was made to fail, or a path the fake does not answer.
        """
        if path != "query":
            raise PromError(f"{self.url}: {path} {params}: not answered by the fake")
        expr = params["query"]
        at = float(params["time"]) if "time" in params else None
        with self._lock:
            self.queries.append((expr, at))
            error = self._errors.get(expr, self._errors.get("*"))
            if error is not None:
                raise PromError(f"{self.url}: {path} {params}: {error}")
            result = list(self._answers.get(expr, []))
        matrix = any("values" in s for s in result)
        return {"resultType": "matrix" if matrix else "vector", "result": result}
