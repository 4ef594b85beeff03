"""The training role of a simulated node: one data-parallel shard, one rank per GPU.

Each step, every rank computes (forward + backward) for ``compute_s / clock_ratio * slowdown`` and
then joins an all-reduce; the collective completes only when the slowest rank arrives, so the job's
step time is ``max(compute) + comm``. Per rank we record (docs/metrics.md):

* ``training_step_duration_seconds``: the rank's own busy time in the step (its compute + the
  collective's transfer time, without waiting for slower ranks), the per-rank signal a profiler
  shows, so a straggler's value stands out from the job median;
* ``nccl_collective_duration_seconds{collective="allreduce"}``: wall time inside the collective,
  including waiting for the slowest rank (so healthy ranks show the straggler's cost);
* ``training_steps_total`` and ``training_mfu_ratio`` (model FLOPs utilisation = achieved / peak).

A collective hang stops every step: no step completes, MFU drops to 0, and the GPUs spin in the NCCL
kernel (GPU_UTIL ~100 % while SM_ACTIVE and power collapse, the "utilisation lies" case).
The label is ``training_job`` rather than ``job`` because a scraped ``job`` label
collides with Prometheus's own target label and would be renamed ``exported_job``.
"""

from __future__ import annotations

import numpy as np

from gpuobs.exporter.histogram import (
    COLLECTIVE_BUCKETS,
    STEP_BUCKETS,
    Histogram,
)

#: MFU of a healthy step on H100 for a dense 70B model (typical large-scale pretraining: 35-45 %).
PEAK_STEP_MFU = 0.42


class TrainingShard:
    """Training state of one node: ``ranks`` (global rank per local GPU) of job ``job_name``."""

    def __init__(self, job_name: str, ranks: list[int], seed: int, compute_s: float = 1.7, comm_s: float = 0.3):
        self.job_name = job_name
        self.ranks = ranks
        self.compute_s = compute_s
        self.comm_s = comm_s
        self.rng = np.random.default_rng(seed)
        n = len(ranks)
        self.step_hist = [Histogram(STEP_BUCKETS) for _ in range(n)]
        self.coll_hist = [Histogram(COLLECTIVE_BUCKETS) for _ in range(n)]
        self.steps = 0
        self.mfu = [PEAK_STEP_MFU] * n
        self._phase = 0.0

    def advance(self, dt: float, clock_ratios: list[float], slowdowns: list[float], hung: bool) -> None:
        """Run ``dt`` seconds. ``clock_ratios``/``slowdowns`` per local rank; ``hung`` stops all progress."""
        if hung:
            self.mfu = [0.0] * len(self.ranks)
            return
        compute = np.array([self.compute_s * s / max(c, 1e-3) for c, s in zip(clock_ratios, slowdowns)])
        step_time = float(compute.max()) + self.comm_s
        ideal = self.compute_s + self.comm_s
        self.mfu = [PEAK_STEP_MFU * ideal / step_time * (0.98 + 0.04 * self.rng.random()) for _ in self.ranks]
        self._phase += dt
        while self._phase >= step_time:
            self._phase -= step_time
            self.steps += 1
            jitter = self.rng.lognormal(0.0, 0.03, len(self.ranks))
            own = (compute + self.comm_s) * jitter
            wait = (step_time - compute) * jitter
            for i in range(len(self.ranks)):
                self.step_hist[i].observe_many(own[i:i + 1])
                self.coll_hist[i].observe_many(wait[i:i + 1])
