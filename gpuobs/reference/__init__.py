"""Sourced facts and their loaders, one ``data/`` folder: the Xid catalogue (:mod:`.xid`),
CUDA/driver/GPU/engine tables (:mod:`.compat`), dcgm-exporter's counters files, Xid texts and
clock-event bits (:mod:`.dcgm_exporter`), vLLM's buckets (:mod:`.buckets`) and the release catalogue
(:mod:`.releases`)."""
