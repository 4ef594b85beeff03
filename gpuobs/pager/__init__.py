"""The pager: the Alertmanager webhook receiver (:mod:`.server`), its SQLite store (:mod:`.store`),
incidents (:mod:`.incidents`), escalation (:mod:`.escalation`), reconciliation with Alertmanager
(:mod:`.reconcile`), their background loop (:mod:`.periodic`), each incident's impact measured from
Prometheus (:mod:`.impact`), the incident console (:mod:`.console`), postmortems (:mod:`.postmortem`)
and the runbooks it serves (:mod:`.runbooks`)."""
