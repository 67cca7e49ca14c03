"""Label selectors matched as apimachinery matches them (``gpufleet.kube.selectors``)."""

from __future__ import annotations

import pytest

from gpufleet.kube.selectors import node_selector_matches, selector_matches


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


@pytest.mark.parametrize("terms, labels, name, expected", [
    (None, {}, "n", True),  # no required affinity: every node
    ({"nodeSelectorTerms": []}, {"a": "1"}, "n", False),  # no terms: none
    ({"nodeSelectorTerms": [{}]}, {"a": "1"}, "n", False),  # an empty term selects nothing
    ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}]}, {"a": "1"}, "n", True),
    ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}]}, {}, "n", True),
    ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Exists"}]}]}, {}, "n", False),
    ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}]}, {}, "n", True),
    ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["7"]}]}]}, {"gpus": "8"}, "n", True),
    ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpus", "operator": "Lt", "values": ["7"]}]}]}, {"gpus": "8"}, "n", False),
    ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["7"]}]}]}, {"gpus": "x"}, "n", False),
    # terms are ORed; inside one, expressions and fields are ANDed
    ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "In", "values": ["2"]}]},
                            {"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}],
                             "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}]},
     {"a": "1"}, "n", True),
    ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}],
                             "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["m"]}]}]},
     {"a": "1"}, "n", False),
])
def test_a_required_node_affinity_matches_as_the_scheduler_reads_it(terms, labels, name, expected):
    assert node_selector_matches(terms, labels, name) is expected
