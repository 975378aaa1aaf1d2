"""python -m trident_analyze ... is the same as trident-analyze ..."""
import sys

from .cli import main

sys.exit(main())
