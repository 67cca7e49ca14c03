"""Ansible's host range patterns (``gpu-a-[001:032]``), expanded without Ansible.

The inventory must mean to gpufleet what it means to Ansible (testinfra reads
it with ``--ansible-inventory``), but the controllers that load it run from
gpufleet's image, which carries no Ansible. This is the grammar of
``ansible.plugins.inventory.expand_hostname_range`` (ansible-core 2.19), and
``tests/inventory/test_hostranges.py`` checks it against Ansible's own:

- ``head[beg:end]tail`` or ``head[beg:end:step]tail``; the first ``[...]`` is
  expanded first, then the rest recursively (``db[1:2]-[a:b]``);
- numeric ranges are inclusive; a ``beg`` with a leading zero pads every
  number to its width, and then ``end`` must have the same width;
- a single-letter ``beg`` and ``end`` make an alphabetic range over
  ``a..zA..Z``; an empty ``beg`` means 0.
"""

from __future__ import annotations

import string


class HostRangeError(ValueError):
    """A host pattern that is not a valid range.

    Attributes:
        pattern: the pattern as written.
        expected: what a valid range looks like, for the message.
    """

    def __init__(self, pattern: str, expected: str):
        super().__init__(f"{pattern}: expected {expected}")
        self.pattern = pattern
        self.expected = expected


def has_range(pattern: str) -> bool:
    """True when ``pattern`` contains a range (Ansible's test: a ``[``)."""
    return "[" in pattern


def expand(pattern: str) -> list[str]:
    """Every host name a pattern stands for, in Ansible's order.

    Args:
        pattern: a host name, with or without ``[beg:end(:step)]`` ranges.

    Returns:
        ``[pattern]`` when it has no range, else the expanded names.

    Raises:
        HostRangeError: unbalanced brackets, not ``beg:end[:step]``, no end,
            begin and end of unequal width with zero padding, begin after end
            of an alphabetic range, or a bound that is neither a number nor a letter.
    """
    if not has_range(pattern):
        return [pattern]
    parts = pattern.replace("[", "|", 1).replace("]", "|", 1).split("|")
    if len(parts) != 3:
        raise HostRangeError(pattern, "a range [begin:end] or [begin:end:step] with matching brackets")
    head, body, tail = parts
    bounds = body.split(":")
    if len(bounds) not in (2, 3):
        raise HostRangeError(pattern, "a range [begin:end] or [begin:end:step]")
    beg, end = bounds[0] or "0", bounds[1]
    step_text = bounds[2] if len(bounds) == 3 else "1"
    if not end:
        raise HostRangeError(pattern, "a range with an end value")
    width = len(beg) if beg[0] == "0" and len(beg) > 1 else 0
    if width and width != len(end):
        raise HostRangeError(pattern, "a zero-padded range with begin and end of equal width ([001:032])")
    try:
        step = int(step_text)
        if beg in string.ascii_letters and end in string.ascii_letters:
            i_beg, i_end = string.ascii_letters.index(beg), string.ascii_letters.index(end)
            if i_beg > i_end:
                raise HostRangeError(pattern, "an alphabetic range with begin <= end")
            seq: list[str] = list(string.ascii_letters[i_beg:i_end + 1:step])
        else:
            seq = [str(i).zfill(width) for i in range(int(beg), int(end) + 1, step)]
    except ValueError as exc:
        if isinstance(exc, HostRangeError):
            raise
        raise HostRangeError(pattern, "range bounds that are numbers or single letters, and a numeric step") from None
    out: list[str] = []
    for item in seq:
        out.extend(expand(f"{head}{item}{tail}"))
    return out
