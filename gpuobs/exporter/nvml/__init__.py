"""Real GPUs through NVML: field reads (:mod:`.fields`), the source (:mod:`.source`), the exporter
process (:mod:`.serve`) and the device check of that page against ``nvidia-smi`` (:mod:`.check`)."""
