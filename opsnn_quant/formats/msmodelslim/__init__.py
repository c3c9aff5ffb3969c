"""msModelSlim's one-click ``modelslim_v1`` YAML of a policy (:mod:`.export`), its table entry
(:mod:`.format`)."""
