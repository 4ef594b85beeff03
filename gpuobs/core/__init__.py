"""Leaf helpers shared by every part of gpuobs; nothing here imports another gpuobs package.

log (JSON log lines), files (atomic writes), durations (the one duration grammar), errors (the one
error hierarchy and exit-code table), httpd (the HTTP base every gpuobs server uses), assets
(where the rule files, Alertmanager config, runbooks and dashboards are: checkout or package data),
fleet (the fleet config: identity label, target selectors, signal paths, runbook base; the one type
every renderer and runtime user of those facts receives).
"""
