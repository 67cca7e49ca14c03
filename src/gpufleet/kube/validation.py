"""Kubernetes' name rules, as apimachinery's ``pkg/util/validation`` states them (``IsDNS1123Label``).

One owner for "is this a valid object name part": the inventory's typed
variables, the day-2 operations and the controllers all ask here.
"""

from __future__ import annotations

import re

#: RFC 1123 label: ``[a-z0-9]([-a-z0-9]*[a-z0-9])?``, at most 63 characters (apimachinery ``DNS1123LabelMaxLength``).
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL_MAX_LENGTH = 63


def dns_label(value: str) -> str:
    """``value`` if it is an RFC 1123 label: what Kubernetes accepts as a namespace or object name part.

    Raises:
        ValueError: ``value`` is not one (the message says what is expected).
    """
    if len(value) > DNS1123_LABEL_MAX_LENGTH or not _DNS1123_LABEL.match(value):
        raise ValueError("a DNS label (RFC 1123): lower-case letters, digits and '-', at most 63 characters")
    return value
