"""The serving engine page of one node (job ``vllm``): vLLM V1 metrics and the build info gauge.

The simulated :class:`~gpuobs.exporter.sim.engine.Engine` holds state; this module turns it into families
(only :mod:`gpuobs.exporter.exposition` writes text).
"""

from __future__ import annotations

from gpuobs.exporter.exposition import Family, label_string
from gpuobs.exporter.histogram import histogram_family
from gpuobs.exporter.sim.engine import Engine
from gpuobs.exporter.sim.node import Node


def engine_families(engine: Engine, version: str, extra_labels: list[tuple[str, str]] | None = None,
                    flags: dict[str, bool] | None = None) -> list[Family]:
    """vLLM V1 metric families of ``engine`` (labels ``model_name``, ``engine``) plus gpuobs_engine_build_info
    and, when ``flags`` is given, ``gpuobs_feature_flag_enabled{flag}`` (1 on, 0 off).

    Names, types and HELP as vLLM V1 writes them (vllm/v1/metrics/loggers.py). The flag gauge has one
    series per catalogue flag whatever its state (bounded by the catalogue; no series appears or
    vanishes on a flip, so ``sum by (flag)`` counts the nodes a flag is on for and ``changes()`` sees
    flips); a 0/1 gauge rather than an ``_info`` metric because the value, not a label, is the state
    (Prometheus naming: https://prometheus.io/docs/practices/naming/; the OpenFeature semantic
    conventions name the flag ``feature_flag.key``, here the label ``flag``)."""
    base = [("model_name", engine.cfg.model_name), ("engine", "0")] + (extra_labels or [])
    ls = label_string(base)
    fams = [
        Family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", None,
               [(ls, round(engine.running))]),
        Family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", None,
               [(ls, round(engine.waiting))]),
        Family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", None,
               [(ls, engine.kv_usage)]),
        Family("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", None,
               [(ls, engine.preemptions)]),
        Family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", None,
               [(ls, engine.prompt_tokens)]),
        Family("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", None,
               [(ls, engine.generation_tokens)]),
        Family("vllm:request_success_total", "counter", "Count of successfully processed requests.", None,
               [(label_string(base + [("finished_reason", r)]), c)
                for r, c in engine.finished.items()]),
        histogram_family("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         [(base, engine.ttft)]),
        histogram_family("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                         [(base, engine.itl)]),
        histogram_family("vllm:request_time_per_output_token_seconds",
                         "Histogram of time_per_output_token_seconds per request.", [(base, engine.tpot)]),
        histogram_family("vllm:e2e_request_latency_seconds",
                         "Histogram of e2e request latency in seconds.", [(base, engine.e2e)]),
        histogram_family("vllm:request_queue_time_seconds",
                         "Histogram of time spent in WAITING phase for request.", [(base, engine.queue)]),
        histogram_family("vllm:request_prefill_time_seconds",
                         "Histogram of time spent in PREFILL phase for request.", [(base, engine.prefill)]),
        histogram_family("vllm:request_decode_time_seconds",
                         "Histogram of time spent in DECODE phase for request.", [(base, engine.decode)]),
        histogram_family("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                         [(base, engine.prompt_len)]),
        histogram_family("vllm:request_generation_tokens", "Number of generation tokens processed.",
                         [(base, engine.generation_len)]),
        histogram_family("vllm:request_max_num_generation_tokens",
                         "Histogram of maximum number of requested generation tokens.",
                         [(base, engine.max_generation_len)]),
        Family("gpuobs_engine_build_info", "gauge", "Serving engine release deployed on this node (value 1).",
               None, [(label_string(base + [("version", version)]), 1)]),
    ]
    if flags is not None:
        fams.append(Family("gpuobs_feature_flag_enabled", "gauge",
                           "Whether the feature flag is on for this engine (1) or off (0), as evaluated "
                           "through OpenFeature against the fleet's flagd flag file.", None,
                           [(label_string(base + [("flag", f)]), int(on)) for f, on in sorted(flags.items())]))
    return fams


class EngineCollector:
    """The serving engine page of one node: vLLM V1 metrics + build info."""

    def __init__(self, node: Node):
        if node.engine is None:
            raise ValueError(f"{node.hostname} has role {node.cfg.role!r}; only serving nodes have an engine page")
        self.node = node

    def collect(self) -> list[Family]:
        """vLLM families for the node's engine. Thread-safe."""
        with self.node.lock:
            return engine_families(self.node.engine, self.node.version, flags=self.node.flags)
