"""spmd_serve: an MPI-launched SPMD LLM server for PaddlePaddle static-graph models.

Importing the package (every rank, HTTP worker and command does, before Paddle) filters the
warnings other packages print in every process that say nothing about the run: Paddle's "No ccache
found" at import (only builds of C++ extensions care, and ops/paddle_ext.py builds its library once
and caches it), setuptools' "replacing distutils" (a transitive import of Paddle's), and Paddle's
"Tensor do not have 'place' interface" (its own layers ask while an export traces them).  Every
other warning still shows.
"""

import warnings

__version__ = "0.1.0"

for _message in (
    "No ccache found",
    "Setuptools is replacing distutils",
    "Tensor do not have 'place' interface for pir graph mode",
):
    warnings.filterwarnings("ignore", message=_message, category=UserWarning)
