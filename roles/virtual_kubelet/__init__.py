"""Role virtual_kubelet."""
