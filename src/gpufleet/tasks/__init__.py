"""invoke task modules; ``tasks.py`` at the checkout root composes them."""
