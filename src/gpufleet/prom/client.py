"""The one client of Prometheus' HTTP API (``/api/v1/*``) in gpufleet.

Used by the taint controller's PromQL signal, the remediation controller's
rules, the test/bench Prometheus servers (:mod:`gpufleet.prom.server`) and
anything else that asks Prometheus a question. Reference:
https://prometheus.io/docs/prometheus/latest/querying/api/
"""

from __future__ import annotations

from typing import Any

import httpx


class PromError(RuntimeError):
    """Prometheus unreachable, or it answered with an error (the message has the URL, the query and the error)."""


def number(data: dict[str, Any]) -> float | None:
    """The number in a query's ``data``: a scalar, or the sum of a vector; None when empty or another type.

    Raises:
        ValueError / KeyError / IndexError / TypeError: malformed ``data``.
    """
    result = data.get("result")
    if data.get("resultType") == "scalar":
        return float(result[1])
    if data.get("resultType") == "vector":
        return sum(float(s["value"][1]) for s in result) if result else None
    return None


class PromClient:
    """Queries against one Prometheus.

    Args:
        url: base URL, e.g. ``http://prometheus.monitoring:9090``.
        timeout: seconds per request.
    """

    def __init__(self, url: str, timeout: float = 10.0):
        self.url = url.rstrip("/")
        self._http = httpx.Client(timeout=timeout)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def api(self, path: str, **params: Any) -> Any:
        """GET ``/api/v1/<path>`` with ``params``; returns the answer's ``data``.

        Raises:
            PromError: transport failure, an answer that is not JSON, or a non-success status.
        """
        try:
            body = self._http.get(f"{self.url}/api/v1/{path}", params=params).json()
        except (httpx.HTTPError, ValueError) as exc:
            raise PromError(f"{self.url}: {path} {params}: {exc}") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            got = body if not isinstance(body, dict) else f"{body.get('errorType')}: {body.get('error')}"
            raise PromError(f"{self.url}: {path} {params}: {got}")
        return body["data"]

    def query_data(self, expr: str, at: float | None = None) -> dict[str, Any]:
        """The ``data`` (``resultType``, ``result``) of instant query ``expr`` at ``at`` (Unix seconds; default now)."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.api("query", **params)

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Evaluate ``expr`` at ``at``; returns ``data.result``.

        A range selector (``metric[60s]``) gives a matrix: each series has
        ``values`` (raw samples); anything else a vector with ``value``.

        Raises:
            PromError: transport failure or a non-success answer.
        """
        return list(self.query_data(expr, at)["result"])

    def value(self, expr: str) -> float | None:
        """A scalar query's value, or the sum of a vector's (:func:`number`); None when the result is empty.

        Raises:
            PromError: transport failure, an error answer, or a result that is not a number.
        """
        data = self.query_data(expr)
        try:
            return number(data)
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise PromError(f"{self.url}: {expr}: not a number: {exc}") from None

    def query_value(self, expr: str) -> float | None:
        """The single series' value of an instant query, None when it returns nothing.

        Raises:
            PromError: more than one series, or see :meth:`query`.
        """
        result = self.query(expr)
        if not result:
            return None
        if len(result) > 1:
            raise PromError(f"{expr}: {len(result)} series, expected one")
        return float(result[0]["value"][1])

    def targets(self) -> list[dict[str, Any]]:
        """Active scrape targets (``/api/v1/targets``)."""
        return list(self.api("targets")["activeTargets"])

    def rules(self) -> list[dict[str, Any]]:
        """Loaded rule groups (``/api/v1/rules``)."""
        return list(self.api("rules")["groups"])

    def ready(self) -> bool:
        """Whether ``/-/ready`` answers 200 (False when unreachable)."""
        try:
            return self._http.get(f"{self.url}/-/ready").status_code == 200
        except httpx.TransportError:
            return False
