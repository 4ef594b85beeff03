"""Training ranks' metrics on the DCGM page of a training node: step time, steps, MFU, NCCL collective time.

State lives in :class:`~gpuobs.exporter.sim.training.TrainingShard`; this module turns it into families.
"""

from __future__ import annotations

from gpuobs.exporter.exposition import Family, label_string
from gpuobs.exporter.histogram import histogram_family
from gpuobs.exporter.sim.training import TrainingShard


def training_families(shard: TrainingShard, gpu_labels: list[list[tuple[str, str]]]) -> list[Family]:
    """Families for every local rank of ``shard``; ``gpu_labels[i]`` are the identity labels of rank i's GPU."""
    per = [labels + [("training_job", shard.job_name), ("rank", str(r))] for labels, r in zip(gpu_labels, shard.ranks)]
    coll = [labels + [("collective", "allreduce")] for labels in per]
    return [
        histogram_family("training_step_duration_seconds",
                         "Per-rank busy time of a training step (compute + collective transfer), seconds.",
                         list(zip(per, shard.step_hist))),
        Family("training_steps_total", "counter", "Training steps completed by the job.", None,
               [(label_string(labels), shard.steps) for labels in per]),
        Family("training_mfu_ratio", "gauge", "Model FLOPs utilisation of the rank, ratio 0..1.", None,
               [(label_string(labels), m) for labels, m in zip(per, shard.mfu)]),
        histogram_family("nccl_collective_duration_seconds",
                         "Wall time inside NCCL collectives, including waiting for slower ranks, seconds.",
                         list(zip(coll, shard.coll_hist))),
    ]
