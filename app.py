"""Start the localpaged chat app: `python app.py [--model ...] [--port ...]` (see --help)."""

import sys

from localpaged.cli import main

if __name__ == "__main__":
    sys.exit(main())
