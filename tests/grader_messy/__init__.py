"""The grader end to end on messy and adversarial submissions: intake, repairs, sandbox, limits, copy detection, shards, deployment."""
