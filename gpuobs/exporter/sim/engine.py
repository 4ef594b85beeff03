"""The serving engine of one simulated node: a vLLM-like request model feeding vLLM V1 metrics.

Per tick, arrivals are Poisson with the node's current rate; each request draws a prompt and a
generation length (lognormal), a queue time, a TTFT and per-token inter-token latencies from
:mod:`gpuobs.exporter.sim.latency`, stretched by the node's state:

* SM clock: the slowest GPU of the tensor-parallel group gates prefill and decode (``clock_ratio``);
* KV-cache demand: concurrency (Little's law: rate x mean E2E) x tokens per sequence x the
  ``kv-pressure`` factor, over the cache capacity. Above 95 % the scheduler preempts and queues;
* the deployed release's hidden profile combined with those of the feature flags that are on
  (TTFT/ITL multipliers, added error ratio, added error ratio on long prompts).

Metric names, types and bucket boundaries follow vllm/v1/metrics/loggers.py (docs/metrics.md; read at
vllm-project/vllm commits a6f0308cfe80 and 005a810bc40f): besides the latency histograms, the per-request
ones vLLM's example Grafana dashboard plots, observed per finished request as vLLM's
``PrometheusStatLogger.record`` does: ``request_prefill_time_seconds`` (time in PREFILL: first token
minus scheduling, here TTFT minus queue time) and ``request_decode_time_seconds`` (first to last token)
on the request-latency buckets, ``request_prompt_tokens``, ``request_generation_tokens`` and
``request_max_num_generation_tokens`` (the request's ``max_tokens``) on ``build_1_2_5_buckets(max_model_len)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpuobs.exporter.histogram import (
    ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    Histogram,
)
from gpuobs.exporter.sim.behaviour import Profile
from gpuobs.reference.buckets import buckets_1_2_5
from gpuobs.exporter.sim.latency import (
    ITL_MEDIAN_S,
    TTFT_MEDIAN_S,
    sample_itl,
    sample_ttft,
)

FINISHED_REASONS = ("stop", "length", "abort", "error")
QUEUE_BUCKETS = REQUEST_LATENCY_BUCKETS  # vLLM uses its request-latency buckets for queue time


@dataclass(frozen=True)
class EngineConfig:
    """Workload of one engine: mean arrival rate (req/s), length distributions, KV capacity (tokens)."""

    rate_rps: float = 4.0
    model_name: str = "meta-llama/Llama-3.1-70B-Instruct"
    prompt_median_tokens: float = 600.0
    gen_median_tokens: float = 180.0
    max_tokens: int = 1024
    #: The model's context length (Llama 3.1's 131,072 tokens), which sets vLLM's token-count buckets.
    max_model_len: int = 131_072
    kv_capacity_tokens: float = 40_000.0
    base_error_ratio: float = 0.0002
    abort_ratio: float = 0.003


class Engine:
    """Mutable engine state and its cumulative metrics. Not thread-safe: the node's lock guards it."""

    def __init__(self, cfg: EngineConfig, seed: int):
        self.cfg = cfg
        self.rng = np.random.default_rng(seed)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.tpot = Histogram(ITL_BUCKETS)  # vLLM: request_time_per_output_token uses 0.01 .. 80
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.queue = Histogram(QUEUE_BUCKETS)
        self.prefill = Histogram(REQUEST_LATENCY_BUCKETS)
        self.decode = Histogram(REQUEST_LATENCY_BUCKETS)
        token_buckets = buckets_1_2_5(cfg.max_model_len)
        self.prompt_len = Histogram(token_buckets)
        self.generation_len = Histogram(token_buckets)
        self.max_generation_len = Histogram(token_buckets)
        self.finished = dict.fromkeys(FINISHED_REASONS, 0)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.running = 0.0
        self.waiting = 0.0
        self.kv_usage = 0.0

    def _service_s(self, clock_ratio: float, profile: Profile) -> float:
        """Nominal in-engine time of a request, seconds: prefill + mean generation x ITL (lognormal
        means), stretched by a lower clock and the release profile but not by KV pressure."""
        cfg = self.cfg
        gen_mean = cfg.gen_median_tokens * float(np.exp(0.7 ** 2 / 2))
        prefill = TTFT_MEDIAN_S * float(np.exp(0.6 ** 2 / 2)) * profile.ttft_multiplier
        decode = gen_mean * ITL_MEDIAN_S * float(np.exp(0.3 ** 2 / 2)) * profile.itl_multiplier
        return (prefill + decode) / max(clock_ratio, 0.1)

    @property
    def in_flight(self) -> float:
        """Requests in the engine now (running + waiting)."""
        return self.running + self.waiting

    def drain(self, dt: float, clock_ratio: float, profile: Profile) -> float:
        """Serve ``dt`` seconds with no arrivals (the node is cordoned or draining): the requests in
        flight finish, modelled as running and waiting decaying exponentially with the nominal service
        time as time constant, and reported 0 once fewer than 0.5 remain. Their latencies were observed
        when they arrived, so no histogram changes. Returns the decay factor applied (0..1]."""
        k = math.exp(-dt / max(self._service_s(clock_ratio, profile), 1e-3))
        self.running *= k
        self.waiting *= k
        self.kv_usage *= k
        if self.in_flight < 0.5:
            self.running = self.waiting = self.kv_usage = 0.0
        return k

    def advance(self, dt: float, rate_scale: float, clock_ratio: float, kv_factor: float, profile: Profile) -> None:
        """Serve ``dt`` seconds of traffic at ``cfg.rate_rps * rate_scale``.

        ``clock_ratio`` = slowest GPU's SM clock / max (0..1]; ``kv_factor`` >= 1 multiplies KV
        demand per sequence.
        """
        cfg, rng = self.cfg, self.rng
        rate = cfg.rate_rps * max(0.0, rate_scale)
        n = int(rng.poisson(rate * dt))
        prompt = np.clip(rng.lognormal(np.log(cfg.prompt_median_tokens), 0.8, n), 16, 32768).astype(np.int64)
        gen = np.clip(rng.lognormal(np.log(cfg.gen_median_tokens), 0.7, n), 1, cfg.max_tokens).astype(np.int64)
        # KV demand: sequences in flight (Little's law with the nominal in-engine time, so that
        # slowdowns caused by the pressure itself do not feed back into demand) x tokens held per
        # sequence (prompt + about half the generation).
        concurrency = rate * self._service_s(clock_ratio, profile)
        tokens_per_seq = (cfg.prompt_median_tokens * 1.4 + cfg.gen_median_tokens * 0.6) * kv_factor
        demand = concurrency * tokens_per_seq / cfg.kv_capacity_tokens
        overflow = max(0.0, demand - 0.95)
        self.kv_usage = float(min(0.995, demand * (1 + 0.02 * rng.standard_normal())))
        self.kv_usage = max(0.0, self.kv_usage)
        self.running = concurrency / (1.0 + overflow / 0.95 * 4)
        self.waiting = concurrency - self.running
        self.preemptions += int(rng.poisson(dt * self.running * overflow * 0.5))
        if n == 0:
            return
        queue = rng.exponential(0.01 + 0.5 * overflow, n)
        ttft = queue + sample_ttft(rng, n, profile.ttft_multiplier * (1 + 0.5 * overflow), clock_ratio)
        total_tokens = int(gen.sum())
        itl = sample_itl(rng, total_tokens, profile.itl_multiplier * (1 + 0.2 * min(demand, 1.0) + overflow),
                         clock_ratio)
        starts = np.concatenate(([0], np.cumsum(gen)[:-1]))
        per_req_itl = np.add.reduceat(itl, starts)
        # The first token of each request comes from prefill: drop one ITL sample per request.
        first = starts
        keep = np.ones(total_tokens, dtype=bool)
        keep[first] = False
        decode = per_req_itl - itl[first]
        e2e = ttft + decode
        self.ttft.observe_many(ttft)
        self.itl.observe_many(itl[keep])
        multi = gen > 1
        self.tpot.observe_many(decode[multi] / (gen[multi] - 1))
        self.e2e.observe_many(e2e)
        self.queue.observe_many(queue)
        err_p = min(1.0, cfg.base_error_ratio + profile.error_rate_delta)
        if profile.long_prompt_error_delta and profile.long_prompt_tokens > 0:  # e.g. a flag failing on long prompts
            err_p = np.minimum(1.0, err_p + np.where(prompt > profile.long_prompt_tokens,
                                                     profile.long_prompt_error_delta, 0.0))
        u = rng.random(n)
        errors = u < err_p
        aborts = (~errors) & (u < err_p + cfg.abort_ratio)
        length = (~errors) & (~aborts) & (gen >= cfg.max_tokens)
        self.prefill.observe_many(ttft - queue)
        self.decode.observe_many(decode)
        self.prompt_len.observe_many(prompt.astype(float))
        self.generation_len.observe_many(np.where(errors, 0, gen).astype(float))  # a failed request generated nothing
        self.max_generation_len.observe_many(np.full(n, float(cfg.max_tokens)))
        self.finished["error"] += int(errors.sum())
        self.finished["abort"] += int(aborts.sum())
        self.finished["length"] += int(length.sum())
        self.finished["stop"] += int(n - errors.sum() - aborts.sum() - length.sum())
        self.prompt_tokens += int(prompt.sum())
        self.generation_tokens += int(gen[~errors].sum())
