"""``local.up --descheduler-policy FILE`` is checked before the running descheduler is replaced."""

from __future__ import annotations

import pytest
import yaml

from gpufleet_workshop.local.descheduler import check_policy, default_policy
from roles.descheduler.manifests import policy as role_policy
from roles.registry import load


def test_the_default_and_the_roles_policies_pass(tmp_path):
    for i, doc in enumerate((default_policy(), role_policy(load("local")))):
        path = tmp_path / f"p{i}.yaml"
        path.write_text(yaml.safe_dump(doc))
        check_policy(path)


@pytest.mark.parametrize("text, message", [
    ("kind: Foo\n", "kind: 'Foo': expected 'DeschedulerPolicy'"),
    ("profiles: [\n", "not valid YAML (line 2, column 1: while parsing a flow node"),
    ("apiVersion: descheduler/v1alpha2\nkind: DeschedulerPolicy\nprofiles: []\n", "expected a non-empty list"),
    ("apiVersion: descheduler/v1alpha2\nkind: DeschedulerPolicy\nprofiles: [{name: x}]\n",
     "profiles[0]: expected a mapping with name and plugins"),
])
def test_bad_files_are_refused_naming_file_and_key(tmp_path, text, message):
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"--descheduler-policy .*policy.yaml: ") as err:
        check_policy(path)
    assert message in str(err.value)
