"""The commands' orchestration: each reads as its phases over the library's public pieces.

* :mod:`.recipe`, :mod:`.recipe_flags`: a run's inputs (the recipe file, and what the command
  line changes of it);
* :mod:`.run`: one ``calibrate`` resolved: every name an object, every file read, once;
* :mod:`.calibrate`: ``calibrate`` (load -> probe -> policy -> float references -> quantize ->
  save -> measure -> export -> accept), phases sharing one :class:`~.context.RunContext`;
* :mod:`.measured`: the measured search's walk (``budget.metric``);
* :mod:`.exports`, :mod:`.model_exports`: calibrate's export steps (the policy's files, what the
  model exports need from the float model, the model exports);
* :mod:`.probe`: ``probe`` (a recipe's or a model's probe job);
* :mod:`.evaluate`: ``evaluate`` (what the candidate directory is, its float source, the report);
* :mod:`.export_weights`: ``export-weights`` (model exports from a calibrate output);
* :mod:`.policy_build`: ``policy build`` (a probe report, another budget or target);
* :mod:`.timings`: ``timings.json``.

The CLI parses options, calls one of these and prints; nothing below imports this package.
"""
