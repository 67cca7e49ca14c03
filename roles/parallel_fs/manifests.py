"""What the parallel_fs role declares: the checkpoint StorageClass and one shared
ReadWriteMany checkpoint volume per team namespace (Weka CSI), or nothing
cluster-side for a host-mounted parallel FS (pods use hostPath)."""

from __future__ import annotations

from gpufleet_admin.inventory import Inventory
from gpufleet_admin.manifests import Obj, meta

#: Name of the checkpoint PersistentVolumeClaim in every team namespace.
PVC_NAME = "gpufleet-checkpoints"


def team_namespaces(inv: Inventory) -> list[str]:
    """Namespaces that run training: those with a LocalQueue."""
    return list(dict.fromkeys(lq.namespace for lq in inv.role("kueue").kueue_local_queues))


def objects(inv: Inventory) -> list[Obj]:
    """StorageClass (Weka CSI, filesystem group from the inventory) and a PVC per team."""
    v = inv.role("parallel_fs")
    if not v.parallel_fs_enabled or v.parallel_fs_backend != "weka":
        return []
    sc = {
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": meta(v.parallel_fs_storage_class, component="parallel-fs"),
        "provisioner": v.parallel_fs_csi_driver,
        "reclaimPolicy": "Retain", "volumeBindingMode": "Immediate", "allowVolumeExpansion": True,
        "parameters": {"volumeType": "dir/v1", "filesystemName": "checkpoints",
                       "filesystemGroupName": v.parallel_fs_weka_filesystem_group,
                       "capacityEnforcement": "HARD"},
    }
    pvcs = [{
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta(PVC_NAME, ns, component="parallel-fs"),
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": v.parallel_fs_storage_class,
                 "resources": {"requests": {"storage": v.parallel_fs_volume_size}}},
    } for ns in team_namespaces(inv)]
    return [sc, *pvcs]


def volume(inv: Inventory) -> Obj:
    """The pod volume that mounts checkpoints: the team PVC, or hostPath for host-mounted FS."""
    v = inv.role("parallel_fs")
    if v.parallel_fs_backend == "weka":
        return {"name": "checkpoints", "persistentVolumeClaim": {"claimName": PVC_NAME}}
    return {"name": "checkpoints", "hostPath": {"path": v.parallel_fs_mount_path, "type": "Directory"}}
