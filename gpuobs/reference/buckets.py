"""Histogram bucket boundaries, seconds: vLLM V1's (facts about the engine, read by the simulator, the SLO
rule generator and the canary) and gpuobs's own training metrics."""

# vLLM V1 bucket boundaries, seconds (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


def buckets_1_2_5(max_value: int) -> tuple[int, ...]:
    """vLLM V1's token-count buckets for a model of context ``max_value`` tokens: 1, 2, 5, 10, 20, 50, ...
    up to ``max_value`` (``build_1_2_5_buckets(max_model_len)`` of vllm/v1/metrics/loggers.py, used for
    ``vllm:request_prompt_tokens``, ``request_generation_tokens`` and ``request_max_num_generation_tokens``)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


# Training step and collective durations (gpuobs's own metrics), seconds.
STEP_BUCKETS = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0)
COLLECTIVE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
