"""gpufleet_workshop: how gpufleet is developed, tested and demonstrated, beside the product.

The loopback cluster and its real node (:mod:`~gpufleet_workshop.local`),
simulations and scenario drivers (:mod:`~gpufleet_workshop.sim`), fixture
nodes and tool stand-ins (:mod:`~gpufleet_workshop.fixtures`), the inference
stand-in, and the invoke tasks. It depends on :mod:`gpufleet` and
:mod:`gpufleet_admin`; nothing below imports it, and gpufleet's image does
not carry it.
"""
