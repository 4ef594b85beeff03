"""The native stack: supervisor, pager (Alertmanager webhook receiver) and drills."""
