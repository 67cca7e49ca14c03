"""The engine's explicit provider takes its settings from the project file, as `pulumi up` does."""

from __future__ import annotations

import pytest

from gpufleet_admin.stack.engine import PROJECT_FILE, EngineError, project_setting


def test_configmaps_are_mutable_from_the_project_file_alone():
    assert project_setting("kubernetes:enableConfigMapMutable") is True
    assert PROJECT_FILE.name == "Pulumi.yaml"


def test_a_missing_setting_names_the_file_and_key(tmp_path):
    project = tmp_path / "Pulumi.yaml"
    project.write_text("name: gpufleet\nconfig:\n  kubernetes:other:\n    value: 1\n")
    with pytest.raises(EngineError, match=r"Pulumi.yaml: expected config.kubernetes:enableConfigMapMutable"):
        project_setting("kubernetes:enableConfigMapMutable", project)


@pytest.mark.parametrize("text", ["true", "{value: true}", "{default: true}"])
def test_every_form_pulumi_accepts_is_read(tmp_path, text):
    project = tmp_path / "Pulumi.yaml"
    project.write_text(f"name: gpufleet\nconfig:\n  kubernetes:enableConfigMapMutable: {text}\n")
    assert project_setting("kubernetes:enableConfigMapMutable", project) is True
