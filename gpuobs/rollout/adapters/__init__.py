"""Adapters that wire the rollout interfaces to a real backend: the native stack's nodes
(:mod:`.native`), the flag file (:mod:`.flags`) and Prometheus signals (:mod:`.prometheus`)."""
