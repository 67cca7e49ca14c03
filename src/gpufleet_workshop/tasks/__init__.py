"""invoke task modules; ``tasks.py`` at the checkout root composes them."""

from gpufleet_workshop.tasks import flags

flags.install()
