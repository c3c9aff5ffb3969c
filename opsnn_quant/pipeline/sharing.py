"""A calibrate (or probe) run whose calibration data is shared by the ranks of a distributed
world: every rank runs the probe's pass 1 over its share of the batches, rank 0 merges the
statistics and does the rest alone.

The ranks meet three times (a :class:`~opsnn_quant.distributed.Lockstep`): ``ready`` (every rank
loaded the data and the model; rank 0 also checked the output, so bad input stops every rank
before any work), ``statistics`` (each rank's pass-1 statistics to rank 0, in rank order) and
``done`` (rank 0 wrote the output, or failed: every rank exits with its status).

Pass 1 is the probe's only pass over the data whose statistics the rest depends on, and every
statistic of it merges exactly (:mod:`opsnn_quant.core.stream`, :meth:`~opsnn_quant.probe.passes.
Watches.merge`): the policy, checkpoint and exports are those of one process over the same data.
What follows (the attribution's replays of the recorded calls, the policy, quantize, exports,
an acceptance run) runs on rank 0 alone, on the merged statistics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opsnn_quant.distributed import Lockstep, World
from opsnn_quant.errors import ConfigError
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.probe.api import Shard
from opsnn_quant.probe.passes import Watches
from opsnn_quant.types import ForwardLoop

POINTS = ("ready", "statistics", "done")


@dataclass(frozen=True)
class Sharing:
    """This rank's place in a run that shares its calibration data.

    Attributes:
        world: the distributed world.
        lockstep: the meeting points (:data:`POINTS`).
    """

    world: World
    lockstep: Lockstep

    @classmethod
    def of(cls, world: World) -> Sharing:
        """The sharing of a run in ``world``."""
        return cls(world, Lockstep(world, POINTS, to_main=("statistics",)))

    def ready(self, adapter: ModelAdapter, records: Sequence[Any]) -> None:
        """Check that the data can be shared, and meet the others (every rank loaded).

        Raises:
            ConfigError: the model's forward loop cannot be shared, or a rank would have no
                batch.
            DistributedError: another rank failed.
        """
        check_processes(self.world.size, len(records), _batch_of(adapter))
        self.lockstep.meet("ready")

    def loop(self, adapter: ModelAdapter, records: Sequence[Any]) -> ForwardLoop:
        """The forward loop over this rank's share: a contiguous run of whole batches,
        numbered (and seeded) as in the loop over all ``records``."""
        batch = _batch_of(adapter)
        part = self.world.shard(len(records), batch)
        share = list(records)[part.start : part.stop]
        return adapter.forward_loop(share, first_batch=part.start // batch)

    def shard(self, adapter: ModelAdapter, records: Sequence[Any]) -> Shard:
        """Rank 0's pass 1: its own share, then the other ranks' statistics."""
        return Shard(self.loop(adapter, records), self._others)

    def send(self, watches: Watches) -> None:
        """A rank but 0: send its share's statistics to rank 0."""
        self.lockstep.meet("statistics", watches)

    def done(self) -> None:
        """Meet the others at the end (rank 0 wrote the output)."""
        self.lockstep.meet("done")

    def _others(self) -> list[Watches]:
        parts = self.lockstep.meet("statistics", None)
        return [p for p in parts[1:] if p is not None]


def check_processes(processes: int, records: int, batch: int) -> None:
    """Refuse a process count that leaves a rank without a batch of calibration data.

    Raises:
        ConfigError: fewer than 1 process, or more than the data's batches.
    """
    batches = -(-records // max(batch, 1))
    if processes < 1:
        raise ConfigError(f"--nproc must be at least 1, got {processes}")
    if batches < processes:
        raise ConfigError(
            f"{processes} processes share {records} calibration records in batches of "
            f"{batch}: {batches} batch(es), and a batch is never split; use at most "
            f"{batches} processes (or a smaller batch_size)"
        )


def _batch_of(adapter: ModelAdapter) -> int:
    batch = adapter.calibration_batch()
    if batch is None:
        raise ConfigError(
            f"{adapter.model_id}: its forward loop is the caller's own, so its batches cannot be "
            "shared across processes; run it in one process"
        )
    return max(int(batch), 1)
