"""What ``gpufleet goodput`` is configured with, from the inventory: the variable behind each field.

The model, its default and its checks are the component's
(:mod:`gpufleet.goodput.config`); the role renders this configuration into
ConfigMap ``gpufleet-goodput-config`` of every team namespace it runs an
accountant in (the namespace and the metrics port are the instance's flags).
"""

from __future__ import annotations

from gpufleet.goodput.config import Configuration
from gpufleet_admin import configs
from gpufleet_admin.inventory import Inventory

#: Configuration field -> the inventory variable that feeds it.
VARIABLES: configs.Variables = {
    "interval_seconds": "goodput_interval_seconds",
}


def configuration(inv: Inventory) -> Configuration:
    """The accountant's configuration for ``inv``.

    Raises:
        gpufleet_admin.inventory.InventoryError: a value the configuration refuses, named by variable.
    """
    return configs.build(inv, Configuration, VARIABLES)
