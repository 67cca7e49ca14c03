"""The taint decision: a small hysteresis state machine over the free-GPU signal, clock injected.

States: ``tainted`` (inference stays in-cluster: the virtual nodes carry
``gpufleet.io/cluster-has-free-gpus:NoSchedule``) and ``untainted``
(inference may run outside), plus ``None`` (unknown) before the first
decision when the controller could not read the nodes' current state.

Rules, for samples ``(free_gpus, now)``:

* ``free > high`` continuously for ``add_hold`` seconds -> ``tainted``;
* ``free < low`` continuously for ``remove_hold`` seconds -> ``untainted``;
* ``low <= free <= high`` (the band) is no evidence either way: both
  streaks restart;
* a missing sample (``None``: the signal is unavailable) restarts both
  streaks and changes nothing (no decision on stale data);
* while *tainted*, a sample below ``low`` taken while inference is coming
  back in-cluster (``returning`` > 0: pods still outside that the flip-back
  is moving) and nothing else waits for GPUs is no evidence either: the
  GPUs the returning pods take are not a shortage. Without this, at exact
  capacity the last pods coming back would push the free GPUs below the
  low-water mark, reopen the virtual nodes and stop the flip-back with pods
  left outside and their GPUs idle in-cluster. The caller says
  ``returning`` = 0 as soon as another pod waits for GPUs (a training pod,
  an inference replica the cluster cannot place): that is a shortage;
* ``displaced`` > 0 (inference pods on nodes the flip-out reserved for
  training, still to move) untaints at once, whatever the free GPUs, and
  keeps the state untainted: the flip-out reserves a node only when the
  scheduler found no place for a training pod and no node fits it as it
  is, so inference must make room, and in make before break its
  replacement may only start on a virtual node. Waiting for the free GPUs
  to fall would make training wait for its own pods' creation: a gang's
  pods are placed on the nodes its admission chose (Kueue's topology
  assignment) while the nodes it will take next still count as free;
* ``arriving`` > 0 (training pods created and not yet tried or placed) makes a
  sample above ``high`` no evidence: the free GPUs are about to be taken by
  pods that are already there, and tainting would send inference back onto
  nodes a gang is filling.

"Continuously" means every sample since the streak's first one satisfied
the condition, and the last one is at least the hold time after the first.
The two hold times are separate (``taint_controller_add_hold_seconds``,
``taint_controller_remove_hold_seconds``): removing the taint sends
inference outside, which costs money and a migration, while adding it keeps
inference in, which is cheap; a site may want to react to training taking
GPUs at once and wait longer before calling the cluster free again, or the
reverse. With ``low < high`` the machine cannot flap: leaving a state needs
a sustained excursion across the *other* mark. A hold of 0 decides on the
first sample.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    """What one sample led to.

    Attributes:
        tainted: the desired state after the sample (None: still unknown).
        changed: whether this sample changed it.
        since: when the streak that caused a change began (seconds, the
            injected clock), else None; ``now - since`` is the reaction time.
        reason: a one-line explanation (for logs and Events).
    """

    tainted: bool | None
    changed: bool
    since: float | None
    reason: str


class Hysteresis:
    """The state machine (see the module docstring).

    Args:
        high: high-water mark in free GPUs (taint above it).
        low: low-water mark in free GPUs (untaint below it); must be < ``high``.
        hold: seconds a condition must hold, both ways unless given apart.
        tainted: the initial state (from the nodes), or None if unknown.
        add_hold: seconds above ``high`` before tainting (default ``hold``).
        remove_hold: seconds below ``low`` before untainting (default ``hold``).

    The values come checked from :class:`gpufleet.taint_controller.config.Configuration`
    (marks and hold times >= 0, ``low < high``), the one place they are validated.
    """

    def __init__(self, high: float, low: float, hold: float, tainted: bool | None = None, *,
                 add_hold: float | None = None, remove_hold: float | None = None):
        add_hold = hold if add_hold is None else add_hold
        remove_hold = hold if remove_hold is None else remove_hold
        self.high, self.low, self.hold = high, low, hold
        self.add_hold, self.remove_hold = add_hold, remove_hold
        self.tainted = tainted
        self.above_since: float | None = None
        self.below_since: float | None = None
        self.transitions = 0

    def observe(self, free: float | None, now: float, *, returning: int = 0, displaced: int = 0,
                arriving: int = 0) -> Decision:
        """Feed one sample taken at ``now`` (seconds). Returns the :class:`Decision`.

        Args:
            returning: pods outside that the flip-back is bringing back while no other pod waits for GPUs.
            displaced: inference pods the flip-out must move off nodes it reserved for training.
            arriving: training pods (the flip-out's priority classes) created and not yet bound.
            (Module docstring: what each does.)
        """
        if displaced > 0:
            self.above_since = self.below_since = None
            reason = f"{displaced} inference pods must leave nodes reserved for training"
            if self.tainted is not False:
                return self._go(False, now, reason)
            return Decision(False, False, None, f"{reason}: no change")
        if free is None:
            self.above_since = self.below_since = None
            return Decision(self.tainted, False, None, "signal unavailable: no decision")
        if free < self.low and returning > 0 and self.tainted:
            self.above_since = self.below_since = None
            return Decision(self.tainted, False, None,
                            f"{free:g} free GPUs < low-water {self.low:g}, but {returning} pods are coming back "
                            "in-cluster and no other pod waits for GPUs: no change")
        if free > self.high and arriving > 0:
            self.above_since = self.below_since = None
            return Decision(self.tainted, False, None, f"{free:g} free GPUs > high-water {self.high:g}, but {arriving} "
                                                       "training pods are still to be placed: no change")
        if free > self.high:
            self.below_since = None
            if self.above_since is None:
                self.above_since = now
            if self.tainted is not True and now - self.above_since >= self.add_hold:
                return self._go(True, self.above_since, f"{free:g} free GPUs > high-water {self.high:g} "
                                                        f"for {now - self.above_since:.1f}s")
        elif free < self.low:
            self.above_since = None
            if self.below_since is None:
                self.below_since = now
            if self.tainted is not False and now - self.below_since >= self.remove_hold:
                return self._go(False, self.below_since, f"{free:g} free GPUs < low-water {self.low:g} "
                                                         f"for {now - self.below_since:.1f}s")
        else:
            self.above_since = self.below_since = None
        return Decision(self.tainted, False, None, f"{free:g} free GPUs: no change")

    def _go(self, tainted: bool, since: float, reason: str) -> Decision:
        self.tainted = tainted
        self.transitions += 1
        self.above_since = self.below_since = None
        return Decision(tainted, True, since, reason)
