"""A minimal client of Prometheus' HTTP API (``/api/v1/query``), enough for the remediation rules."""

from __future__ import annotations

from typing import Any

import httpx


class PromError(RuntimeError):
    """Prometheus unreachable, or it answered with an error (the message has its errorType and error)."""


class PromClient:
    """Instant queries against one Prometheus.

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

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Evaluate ``expr`` at ``at`` (Unix seconds; default now); returns ``data.result``.

        A range selector (``metric[60s]``) gives a matrix: each series has
        ``values`` (raw samples); anything else a vector with ``value``.

        Raises:
            PromError: transport failure or a non-success answer.
        """
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        try:
            resp = self._http.get(f"{self.url}/api/v1/query", params=params)
            body = resp.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise PromError(f"{self.url}: {expr}: {exc}") from None
        if body.get("status") != "success":
            raise PromError(f"{self.url}: {expr}: {body.get('errorType')}: {body.get('error')}")
        return list(body["data"]["result"])
