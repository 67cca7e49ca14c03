"""gpufleet: provision and operate one GPU Kubernetes cluster shared by training and inference."""
