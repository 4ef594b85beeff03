"""Clients of HTTP APIs: the Prometheus query API (:mod:`.prometheus`), Prometheus's alerts and the
pager's pages (:mod:`.alertmanager`), Alertmanager's silences API v2 (:mod:`.silences`) and the
exporter's admin API (:mod:`.exporter_admin`)."""
