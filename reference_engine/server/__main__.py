"""python -m reference_engine.server [--model DIR] [--port N] [--shutdown-timeout S] ...: see runner.main."""
import sys

from .runner import main

sys.exit(main())
