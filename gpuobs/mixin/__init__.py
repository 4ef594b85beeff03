"""Everything generated from code and the fleet config (:mod:`gpuobs.core.fleet`): the rule files
(:mod:`.gpu_rules`, :mod:`.kernel_log_rules`, :mod:`.slo_rules`), the drill rule profile
(:mod:`.profile`), Alertmanager's config (:mod:`.alertmanager`), the dashboards (:mod:`.dashboards`),
runbook URLs (:mod:`.runbooks`), the alert families (:mod:`.families`), the HA rule placement
(:mod:`.placement`) and the Kubernetes manifests (:mod:`.kubernetes`); :mod:`.render` writes and
``--check``s them all."""
