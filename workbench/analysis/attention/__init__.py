"""What attention does: per-head statistics, roles, rollout and flow, value norms, positions, logit lens."""
