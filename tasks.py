"""gpufleet's invoke tasks (``invoke --list``). The code lives in gpufleet.tasks."""

from invoke import Collection

from gpufleet.tasks import render

ns = Collection(render.render)
ns.configure({"run": {"echo": False, "pty": False}})
