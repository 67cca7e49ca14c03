"""Names and intervals the flip components share (DESIGN.md, "Names shared by all parts")."""

from __future__ import annotations

#: The taint the taint controller manages on virtual nodes while the cluster has free GPUs.
FREE_GPUS_TAINT = "gpufleet.io/cluster-has-free-gpus"
#: Its effect: NoSchedule only, never NoExecute (pods outside keep serving until moved one budget at a time).
FREE_GPUS_EFFECT = "NoSchedule"
#: Virtual nodes carry this label (the virtual-kubelet convention) and their pool's name.
VIRTUAL_LABEL = ("type", "virtual-kubelet")
POOL_LABEL = "gpufleet.io/pool"
GPU = "nvidia.com/gpu"
#: Taint put on an in-cluster node the flip-out reserves for one pending high-priority pod
#: (value: that pod's UID); the pod gets the matching toleration.
RESERVED_TAINT = "gpufleet.io/reserved-for"
#: Label the flip-back puts on a pod outside it releases for eviction (the descheduler's
#: DefaultEvictor ``labelSelector`` selects it).
RELEASE_LABEL = ("gpufleet.io/flip-back", "released")
#: Taints that do not make a node unschedulable for the free-GPU signal: the GPU node taint (every
#: GPU pod tolerates it) and the degraded taint (inference tolerates it).
BENIGN_TAINTS = ("nvidia.com/gpu", "gpufleet.io/degraded")
#: Seconds between controller ticks (signal sample, decision, reconcile).
TICK_SECONDS = 1.0
#: Lease of the taint controller (leader election).
LEASE_NAME = "gpufleet-taint-controller"
