"""The serving engine page of one node (job ``vllm``): vLLM V1 metrics and the build info gauge.

The simulated :class:`~gpuobs.exporter.sim.engine.Engine` holds state; this module turns it into families
(only :mod:`gpuobs.exporter.exposition` writes text).
"""

from __future__ import annotations

from gpuobs.exporter.exposition import Family, label_string
from gpuobs.exporter.histogram import histogram_family
from gpuobs.exporter.sim.engine import Engine
from gpuobs.exporter.sim.node import Node


def engine_families(engine: Engine, version: str, extra_labels: list[tuple[str, str]] | None = None) -> list[Family]:
    """vLLM V1 metric families of ``engine`` (labels ``model_name``, ``engine``) plus gpuobs_engine_build_info.

    Names, types and HELP as vLLM V1 writes them (vllm/v1/metrics/loggers.py)."""
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
        Family("gpuobs_engine_build_info", "gauge", "Serving engine release deployed on this node (value 1).",
               None, [(label_string(base + [("version", version)]), 1)]),
    ]
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
            return engine_families(self.node.engine, self.node.version)
