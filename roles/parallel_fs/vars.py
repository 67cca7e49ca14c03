"""Typed variables of the parallel_fs role (defaults and documentation: defaults.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from gpufleet_admin.inventory.types import STRICT, DnsLabel, NonNegativeInt, PositiveInt, Quantity


class Vars(BaseModel):
    """Variables of the parallel_fs role."""

    model_config = STRICT

    parallel_fs_enabled: bool
    parallel_fs_backend: Literal["weka", "hostpath"]
    parallel_fs_storage_class: DnsLabel
    parallel_fs_csi_driver: str
    parallel_fs_weka_filesystem_group: str
    parallel_fs_volume_size: Quantity
    parallel_fs_mount_path: str = Field(pattern=r"^/")
    parallel_fs_type: str
    parallel_fs_min_write_mib_per_second: NonNegativeInt
    parallel_fs_probe_mib: PositiveInt
