"""Builds from pinned Go modules, apart from the code that runs what they build.

:mod:`~gpufleet.build.gobuild` (modules, caches, ``go build``),
:mod:`~gpufleet.build.components` (the local cluster's components: module,
version, commands), :mod:`~gpufleet.build.install` (``invoke install``: build
or verify them all) and :mod:`~gpufleet.build.pulumi` (the Pulumi CLI,
language host and pulumi-kubernetes provider).
"""
