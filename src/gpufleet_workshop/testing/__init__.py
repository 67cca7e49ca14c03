"""Test doubles of gpufleet's own seams, for unit tests (client-go keeps its fakes in ``fake/`` and ``testing/``).

* :class:`~gpufleet_workshop.testing.fakekube.FakeKube`: an in-memory API
  server behind :class:`gpufleet.kube.Kube`'s transport, so every verb,
  informers and controllers run unchanged against it;
* :class:`~gpufleet_workshop.testing.fakeprom.FakeProm`: answers for
  :class:`gpufleet.prom.client.PromClient`'s queries.
"""

from __future__ import annotations

from .fakekube import Action, FakeKube, Kind, Unmodelled

__all__ = ["Action", "FakeKube", "Kind", "Unmodelled"]
