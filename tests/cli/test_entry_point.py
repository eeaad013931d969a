"""Ctrl-C while the CLI is still loading its commands ends in one line and exit 130, no traceback."""

import subprocess
import sys

INTERRUPTED_IMPORT = """
import builtins
real = builtins.__import__

def interrupted(name, globals=None, locals=None, fromlist=(), level=0):
    if name == "moespec.cli" and fromlist and "batch" in fromlist:  # the commands' registration
        raise KeyboardInterrupt
    return real(name, globals, locals, fromlist, level)

builtins.__import__ = interrupted
import moespec.cli.main
"""


def test_an_interrupt_while_the_commands_load_is_one_line():
    done = subprocess.run([sys.executable, "-c", INTERRUPTED_IMPORT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip() == "interrupted while moespec was starting; nothing was run: run the command again to resume"
