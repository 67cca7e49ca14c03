"""gpufleet's invoke tasks (``invoke --list``). The code lives in gpufleet_workshop.tasks."""

from invoke import Collection

from gpufleet_workshop.tasks import bench, demo, gpu, health, image, local, node, quota, render, sim, stack, status, train

ns = Collection(demo.install, demo.demo, bench.bench, render.render, render.config, status.status, stack.preview,
                stack.up, stack.destroy)
for collection in (local.ns, image.ns, train.train, quota.quota, node.node, gpu.gpu, health.ns, sim.sim):
    ns.add_collection(collection)
ns.configure({"run": {"echo": False, "pty": False}})
