"""gpufleet's Pulumi program (Pulumi.yaml: ``main: stacks/``)."""

from gpufleet_admin.stack.program import main

main()
