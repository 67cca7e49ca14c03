"""gpufleet_admin: what a platform engineer runs to provision and operate gpufleet, on their own machine.

The inventory loader, the object builders roles share, the Pulumi program,
training job rendering and submission, and the builds an operator needs
(the Pulumi CLI, gpufleet's image). It depends on :mod:`gpufleet` (the
product that runs in clusters) and never the other way round; the roles
(``roles/``) build on it; :mod:`gpufleet_workshop` (the local environment,
simulations and tasks) sits above both.
"""
