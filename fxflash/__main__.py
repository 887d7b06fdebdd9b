"""``python -m fxflash explain path/to/script.py:function`` (see fxflash.cli)."""
import sys

from .cli import main

sys.exit(main())
