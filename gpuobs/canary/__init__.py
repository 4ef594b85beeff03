"""Release safety: compatibility gate (compat), canary analysis and rollout."""
