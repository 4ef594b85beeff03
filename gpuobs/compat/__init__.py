"""Compatibility of a release with the fleet (pure functions over :mod:`gpuobs.reference.compat`):
the gate (:mod:`.gate`), the judgement of a whole fleet's inventory (:mod:`.inventory`), and the
driver-upgrade plan (:mod:`.upgrade_plan`)."""
