"""GPU models gpufleet knows, and how each one appears on a Kubernetes node.

The product strings are what NVIDIA's GPU feature discovery writes into the
``nvidia.com/gpu.product`` node label (spaces replaced by dashes), so the
ResourceFlavors and node selectors we declare match labels on real nodes.
NVLink counts per GPU come from NVIDIA's product briefs (H100/H200 SXM: 18
fourth-generation links; A100 SXM: 12 third-generation links).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict


class GpuModel(BaseModel):
    """One GPU model: its flavor name, product label, memory (GiB) and NVLinks per GPU."""

    model_config = ConfigDict(frozen=True)

    name: str
    flavor: str
    product: str
    memory_gib: int
    nvlinks: int


GPU_MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel(name="H100-SXM-80GB", flavor="h100-sxm-80gb", product="NVIDIA-H100-80GB-HBM3", memory_gib=80, nvlinks=18),
        GpuModel(name="H200-SXM-141GB", flavor="h200-sxm-141gb", product="NVIDIA-H200", memory_gib=141, nvlinks=18),
        GpuModel(name="A100-SXM-80GB", flavor="a100-sxm-80gb", product="NVIDIA-A100-SXM4-80GB", memory_gib=80, nvlinks=12),
        GpuModel(name="L40S-48GB", flavor="l40s-48gb", product="NVIDIA-L40S", memory_gib=48, nvlinks=0),
    )
}


def known_gpu_model(value: str) -> str:
    """``value`` if it names a model of :data:`GPU_MODELS`.

    Raises:
        ValueError: it does not (the message lists the known ones).
    """
    if value not in GPU_MODELS:
        raise ValueError(f"one of {', '.join(sorted(GPU_MODELS))}")
    return value


#: A GPU model gpufleet knows (``H100-SXM-80GB``, ...): the key into the catalog.
KnownGpuModel = Annotated[str, AfterValidator(known_gpu_model)]
