"""The cloud pipeline's optimisations: each a named policy, in one place, with an off switch.

`Policies` is decided once, by the agent, and written into the execution
input (`"policies": {name: true|false}`, every name:
braid.pipeline.execution_input). The planner applies it where it decides
and writes each outcome into what it produces (an item's `packs` and `cut`,
a "sleeping" status); workers, Finalize and the state machine read those
outcomes and never recompute them, so a policy cannot change under a
running backup. Off (`braid backup --no-policy NAME`): what a plain planner
does. Each stays only while it pays (issue 22's bar, measured by `scripts/bench
cloud-model`: docs/design/2026-11-28-optimisations.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from braid.contract import CHUNKS_PER_PACK
from braid.errors import IntegrityError, UsageError
from braid.format.fields import Fields


@dataclass(frozen=True)
class Policies:
    # Streaming rounds' items stop at a pack boundary once the stream has ended; finishing items spread the rest wide.
    cut_items: bool = True
    # A planner far from its next round sleeps until the agent wakes it (SleepUntilWoken, pipeline.pacing.sleep_plan).
    sleep_until_woken: bool = True
    # After each map the planner merges its finished items' results into one fold, the results index, which Finalize
    # reads instead of a record per item (braid.pipeline.replan; off: only the cut results the planner planned after).
    results_index: bool = True

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def without(cls, names: list[str] | tuple[str, ...]) -> Policies:
        """Every policy on but `names` (a UsageError names an unknown one)."""
        unknown = sorted(set(names) - set(cls.names()))
        if unknown:
            raise UsageError(f"unknown policy {', '.join(unknown)}: the policies are {', '.join(cls.names())}")
        return cls(**{name: name not in names for name in cls.names()})

    def packs(self, count: int) -> tuple[int, ...]:
        """The pack sizes of a planned item of `count` chunks, as these policies decide them."""
        from braid.format.staging.rounds import pack_sizes  # the planner's: the agent only writes Policies into the input

        return tuple(pack_sizes(count, CHUNKS_PER_PACK))

    def to_json(self) -> dict[str, bool]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Any) -> Policies:
        """Strict: a JSON object naming every policy, each true or false (UsageError otherwise)."""
        try:
            f = Fields(doc, "the execution input's policies", cls.names())
            return cls(**{name: f.flag(name) for name in cls.names()})
        except IntegrityError as exc:
            raise UsageError(f"invalid pipeline input: {exc.message}") from None


ALL_ON = Policies()  # the default: every optimisation that stayed
