"""invoke task modules; ``tasks.py`` at the checkout root composes them."""

from gpufleet.tasks import flags

flags.install()
