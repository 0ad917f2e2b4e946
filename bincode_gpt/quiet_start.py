"""
A script's first import, for its effect: a Ctrl-C during the slow imports after it (torch's take seconds) ends
the script with one line and exit 130, as exits.run_main ends one, not with a traceback (exits.quiet_interrupt).
It acts only where the program is one of this repository's scripts (at the root, or a tool): imported under a
test runner or by another program, it leaves Ctrl-C as it was.
"""

import os
import sys

from bincode_gpt.exits import quiet_interrupt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = getattr(sys.modules.get("__main__"), "__file__", None)

if PROGRAM and os.path.dirname(os.path.abspath(PROGRAM)) in (ROOT, os.path.join(ROOT, "tools")):
    quiet_interrupt()
