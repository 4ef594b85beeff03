"""The simulated GPU fleet: GPU physics (:mod:`.gpu`), nodes (:mod:`.node`), faults (:mod:`.faults`),
MIG (:mod:`.mig`), the vLLM engine (:mod:`.engine`, :mod:`.latency`), training ranks
(:mod:`.training`), Kubernetes names (:mod:`.k8s`), GPU identity (:mod:`.identity`), release and flag
behaviour (:mod:`.behaviour`) and the exporter profiles: which counters file it serves and
how it prints the host label (:mod:`.profiles`)."""
