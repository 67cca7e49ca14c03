"""gpufleet's image and the real node: image size and build times, local.up with the real node.

Prints:

- the image's size (compressed: what a pull transfers; unpacked: the
  layers' tars) and its build time per step: a rebuild of the app layer
  (``--force``; the Debian base from the cache), and with ``--cold`` the base
  too (mmdebstrap from the mirror);
- ``local.up`` of a cluster of its own with the real node: from purged
  state (containerd empty: images imported) and again after ``local.down``
  (warm: images present), and ``local.down``.
"""

from __future__ import annotations

import argparse
import time

from gpufleet_admin.build import image as images
from gpufleet_workshop.local import cluster as local

NAME = "gpufleet-bench-image"


def main() -> None:
    """Run the measurements (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cold", action="store_true", help="also rebuild the Debian base from the mirror")
    ap.add_argument("--nodes", type=int, default=2, help="simulated nodes of the local.up measurement")
    args = ap.parse_args()

    built = images.build(force=True, refresh_base=args.cold)
    print(f"image {built.reference} {built.digest}")
    print(f"  compressed {built.compressed_bytes / 2**20:.1f} MiB, unpacked {built.unpacked_bytes / 2**20:.1f} MiB")
    print(f"  build {'(base too)' if args.cold else '(app layer; base cached)'}: {built.seconds:.1f}s  {built.steps}")
    t = time.monotonic()
    again = images.build()
    print(f"  cached build: {time.monotonic() - t:.2f}s (cached={again.cached})")

    from roles.registry import node_specs

    specs = node_specs("local", args.nodes)
    local.down(NAME, purge=True)
    try:
        t = time.monotonic()
        local.up(NAME, specs=specs, fresh=True)
        print(f"local.up with the real node, purged state: {time.monotonic() - t:.1f}s")
        t = time.monotonic()
        local.down(NAME)
        print(f"local.down: {time.monotonic() - t:.1f}s")
        t = time.monotonic()
        local.up(NAME, specs=specs)
        print(f"local.up with the real node, warm (images present): {time.monotonic() - t:.1f}s")
    finally:
        local.down(NAME, purge=True)


if __name__ == "__main__":
    main()
