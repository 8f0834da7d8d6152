"""`python -m kvengine.kveval`: the engine-only part of the eval."""
from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
