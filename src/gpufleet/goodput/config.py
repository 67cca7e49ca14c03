"""The goodput accountant's configuration: one typed, frozen model, its defaults and its checks.

``gpufleet goodput --config FILE`` reads it (:func:`load`); the goodput
role builds it from the inventory and stack config (``roles/goodput/config.py``)
and renders it into each accountant's ConfigMap (one per team namespace; the
namespace itself is the instance's ``--namespace`` flag, as the metrics port
is the process's). A flag given overrides the file. The default is written
here only (the role's ``defaults.yaml`` documents it).
"""

from __future__ import annotations


from pydantic import BaseModel

from gpufleet import componentconfig as cc

#: ``kind`` of the file.
KIND = "GoodputConfiguration"


class Configuration(BaseModel):
    """Everything ``gpufleet goodput`` is configured with.

    Attributes:
        interval_seconds: seconds between passes over every job's account.
    """

    model_config = cc.STRICT

    interval_seconds: cc.PositiveSeconds = 15.0


#: The defaults: what an accountant started without ``--config`` runs with.
DEFAULTS = Configuration()


#: The file: ``load(path)`` reads and checks one, ``dump(config)`` writes one.
FILE = cc.ConfigFile(Configuration, KIND)
load = FILE.load
dump = FILE.dump
