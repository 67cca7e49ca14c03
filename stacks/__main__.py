"""gpufleet's Pulumi program (Pulumi.yaml: ``main: stacks/``)."""

from gpufleet.stack.program import main

main()
