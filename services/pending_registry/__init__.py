"""pending-registry: routes asks/confirms to exactly one front-end; keeps task questions and answers."""
