"""Builds an operator needs, from pinned inputs: Go modules (:mod:`~gpufleet_admin.build.gobuild`), the
Pulumi CLI, language host and pulumi-kubernetes provider (:mod:`~gpufleet_admin.build.pulumi`) and
gpufleet's image (:mod:`~gpufleet_admin.build.image`). The local cluster's own components are built by
:mod:`gpufleet_workshop.local.components` and :mod:`gpufleet_workshop.local.install` on top of these.
"""
