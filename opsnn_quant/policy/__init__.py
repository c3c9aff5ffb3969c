"""Precision policy: its schema (``policy.yaml``), the targets, the search and its baselines,
the measured walk of candidates, and the summaries of a decided policy. The files Ascend tools
read from a policy are the formats' (:mod:`opsnn_quant.formats.policy_files`)."""
