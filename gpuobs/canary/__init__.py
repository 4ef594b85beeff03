"""Canary analysis over any Prometheus-API backend: the config (:mod:`.config`), the statistics
(:mod:`.stats`: estimators from buckets and paired series; :mod:`.histstats`: the tests on bucketed latency
histograms; :mod:`.sequential`: group-sequential boundaries and alpha spending), verdicts
(:mod:`.verdict`), the analyzer that queries and decides (:mod:`.analyzer`), ``gpuobs canary serve``
for Argo Rollouts and Flagger (:mod:`.serve`) and its durable runs (:mod:`.runs`).

The compatibility gate is :mod:`gpuobs.compat`, rollouts are :mod:`gpuobs.rollout`.
"""
