"""What the API server's validation refuses: Kubernetes' name rules, as apimachinery's ``pkg/util/validation``
states them (``IsDNS1123Label``), and the fields of an object it refuses to change.

One owner for "is this a valid object name part": the inventory's typed
variables, the day-2 operations and the controllers all ask here; and for
"which declared change can only be made by replacing the object": the
stack's declarations and the simulations' applies ask here.
"""

from __future__ import annotations

import re

#: RFC 1123 label: ``[a-z0-9]([-a-z0-9]*[a-z0-9])?``, at most 63 characters (apimachinery ``DNS1123LabelMaxLength``).
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL_MAX_LENGTH = 63

#: ``(apiVersion, kind)`` of the workloads whose ``spec.selector`` the API server refuses to change
#: (apps/v1 validation: "field is immutable").
IMMUTABLE_SELECTOR_KINDS = frozenset({("apps/v1", "Deployment"), ("apps/v1", "ReplicaSet"),
                                      ("apps/v1", "StatefulSet"), ("apps/v1", "DaemonSet")})

#: The highest value of a PriorityClass whose name does not start with ``system-`` (scheduling/v1
#: ``HighestUserDefinablePriority``).
HIGHEST_USER_PRIORITY = 1_000_000_000

#: A PriorityClass's fields the API server refuses to change (scheduling/v1 ``ValidatePriorityClassUpdate``: 422).
PRIORITY_CLASS_IMMUTABLE = ("value", "preemptionPolicy")


def dns_label(value: str) -> str:
    """``value`` if it is an RFC 1123 label: what Kubernetes accepts as a namespace or object name part.

    Raises:
        ValueError: ``value`` is not one (the message says what is expected).
    """
    if len(value) > DNS1123_LABEL_MAX_LENGTH or not _DNS1123_LABEL.match(value):
        raise ValueError("a DNS label (RFC 1123): lower-case letters, digits and '-', at most 63 characters")
    return value
