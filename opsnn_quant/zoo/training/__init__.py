"""How the zoo's models were made: training stages and the quality gate report.

Runnable (``python -m opsnn_quant.zoo.training.train_shapes``,
``... .train_shapes_dit``, ``... .shapes_report``) and never imported by the library or the
zoo's loaders: using the toolkit loads none of it (``tests/test_lean_import.py``).
"""
