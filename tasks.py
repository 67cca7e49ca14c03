"""gpufleet's invoke tasks (``invoke --list``). The code lives in gpufleet.tasks."""

from invoke import Collection

from gpufleet.tasks import health, node, quota, render, status, train

ns = Collection(render.render, status.status)
ns.add_collection(train.train)
ns.add_collection(quota.quota)
ns.add_collection(node.node)
ns.add_collection(health.ns)
ns.configure({"run": {"echo": False, "pty": False}})
