"""What one reconciliation pass decides for each model it touches.

A pass (`agent.models.reconcile`) plans before it acts: one `Action` per name in Triton, each
an event of `agent.phases` (the orphan's POD_GONE, a reload's TRITON_RESTARTED, an eviction's
OVER_REQUEST, a leftover crash marker's CRASH_SUSPECTED, an on-demand model's IDLE) or a
`Check` of what Triton runs (`agent.models.vouching`). Two actions for one name (a recheck and
an eviction, say) would race for it, so a plan holds one.
The parts that plan beside the reconciler build these too: `agent.models.aftercrash` (crash
markers and suspects), `agent.models.overrequest` (models over their GPU memory request, or
their namespace's share of Triton's host memory).
This module only describes; it decides and does nothing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from agent.gpus.memory import Excess
from agent.models.tritonram import OverShare
from agent.phases import Event
from agent.pods.provenpods import Proven
from agent.quarantine.crashledger import Marker


class Check(enum.Enum):
    """What a pass asks of the agent beyond the lifecycle's events: whether it vouches for what
    Triton runs (raising ADOPTED or UNVOUCHED)."""

    ADOPT = "adopt"
    RECHECK = "recheck"


@dataclass(frozen=True)
class Action:
    """One model's part of a pass: the event (or check) raised for it, its owner and, for an
    eviction, the excess measured."""

    name: str
    cause: Event | Check
    owner: Proven | None = None
    excess: Excess | None = None
    host: OverShare | None = None
    """For an eviction for Triton's host memory, the namespace's excess."""
    marker: Marker | None = None
    alone: bool = True
    """For a crash: the marker's files were the most recent load there (else only suspected)."""
    restore: bool = False
    """A reload of a model Triton held before it restarted, under no suspicion: no change, so
    its READY is not watched (`agent.quarantine.crashledger`)."""
