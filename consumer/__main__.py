"""``python -m consumer``: run the recorder (same as ``bulk-recorder consume``)."""

import sys

from consumer.cli import main

sys.exit(main(["consume", *sys.argv[1:]]))
