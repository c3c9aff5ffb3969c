"""``python -m opsnn_quant``: the CLI, as ``torchrun -m opsnn_quant evaluate ...`` starts it."""

import sys

from opsnn_quant.cli import main

if __name__ == "__main__":
    sys.exit(main())
