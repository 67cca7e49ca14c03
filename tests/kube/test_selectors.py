"""Label selectors matched as apimachinery matches them (``gpufleet.kube.selectors``)."""

from __future__ import annotations

import pytest

from gpufleet.kube.selectors import selector_matches


@pytest.mark.parametrize(("selector", "labels", "expected"), [
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]}, {"tier": "b"}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}, {}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, {}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, {"tier": "x"}, False),
    ({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]}, {"a": "1", "b": ""}, True),
    ({}, {"any": "pod"}, True),
    (None, {"any": "pod"}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "Gt", "values": ["1"]}]}, {"tier": "2"}, False),
])
def test_label_selectors_match_as_apimachinery_does(selector, labels, expected):
    assert selector_matches(selector, labels) is expected
