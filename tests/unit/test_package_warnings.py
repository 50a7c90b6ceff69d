"""Importing spmd_serve first keeps Paddle's and setuptools' import-time warnings (ccache missing,
distutils replaced) out of every process's log, and leaves other warnings alone."""

from __future__ import annotations

import shutil
import subprocess
import sys

CHILD = """
import warnings, spmd_serve, paddle, setuptools
warnings.warn("a warning of our own")
"""


def test_paddles_import_warnings_stay_out_of_the_log_and_ours_do_not():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "a warning of our own" in done.stderr  # the filter is by message, not everything
    assert "No ccache found" not in done.stderr and "replacing distutils" not in done.stderr, done.stderr


def test_paddle_alone_still_warns_where_ccache_is_missing():
    """The filter above is what keeps the line out (where ccache is installed Paddle has nothing to say)."""
    done = subprocess.run([sys.executable, "-c", "import paddle"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert ("No ccache found" in done.stderr) == (shutil.which("ccache") is None), done.stderr
