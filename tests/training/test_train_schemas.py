"""Every rendered training object validates against the pinned upstream schemas (gpufleet_admin.schemas).

JobSet: the pinned JobSet CRD; Job and Service: the pinned Kubernetes
OpenAPI; PyTorchJob: the Kubeflow training-operator CRD (``training_operator``
in versions.yaml; a kind without a pinned schema fails).
"""

from __future__ import annotations

import pytest
import yaml

from gpufleet_admin.schemas import validate
from gpufleet_admin.training import render as r

CASES = [("local", None, 2), ("local", None, 16), ("staging", "h100-sxm-80gb", 2), ("staging", "a100-sxm-80gb", 1),
         ("prod", None, 128)]


@pytest.mark.parametrize("template", list(r.TEMPLATES))
@pytest.mark.parametrize(("env", "flavor", "nodes"), CASES)
def test_rendered_objects_are_schema_valid(inventory, env, flavor, nodes, template):
    sets = ["simulated_duration_seconds=30", "args=--steps 10"]
    text = r.render(env, template, "run1", nodes, flavor=flavor, sets=sets, inventory=inventory(env))
    for obj in (d for d in yaml.safe_load_all(text) if d):
        errors = validate(obj)  # UnknownKind: versions.yaml lacks the pin of this kind's CRDs
        assert errors == [], f"{obj['kind']}: {errors}"


def test_schema_validation_sees_a_bad_template_field(inventory):
    (js,) = yaml.safe_load_all(r.render("local", "jobset", "run1", 2, inventory=inventory("local")))
    js["spec"]["failurePolicy"]["maxRestart"] = 3  # typo of maxRestarts
    assert any("maxRestart" in e for e in validate(js))
