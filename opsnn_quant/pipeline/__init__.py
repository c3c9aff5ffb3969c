"""The commands' orchestration: each reads as its phases over the library's public pieces.

* :mod:`.calibrate`: ``calibrate`` (load -> probe -> policy -> float references -> quantize ->
  save -> measure -> export -> accept), phases sharing one :class:`~.context.RunContext`;
* :mod:`.exports`: calibrate's export steps (the policy's files, what the model exports need
  from the float model, the model exports);
* :mod:`.probe`: ``probe`` (a recipe's or a model's probe job);
* :mod:`.evaluate`: ``evaluate`` (what the candidate directory is, its float source, the report);
* :mod:`.export_weights`: ``export-weights`` (model exports from a calibrate output);
* :mod:`.outputs`: the layout of a calibrate output and what a directory a user passes is;
* :mod:`.timings`: ``timings.json``.

The CLI parses options, calls one of these and prints; nothing below imports this package.
"""
