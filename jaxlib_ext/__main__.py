"""``python -m jaxlib_ext``: see :mod:`jaxlib_ext.cli`."""

import sys

from jaxlib_ext.cli import main

if __name__ == "__main__":
    sys.exit(main())
