"""Why a checkpoint cannot be exported: one exception per stage of the export, each a one-line message.

`export_checkpoint` turns every one of them into `ExportError`, which the CLI prints as
`spmd_serve export: error: <message>` (exit status 2).
"""

from __future__ import annotations


class ExportError(Exception):
    """The checkpoint cannot be exported; the message says why."""


class CheckpointError(Exception):
    """The directory cannot be read as a checkpoint; the message says why (one line)."""


class UnsupportedModel(ValueError):
    """config.json describes a model the stages cannot compute (message says what and why)."""


class ShardingError(ValueError):
    """The model cannot be split over this many ranks (message says why and what would work)."""


class QuantError(ValueError):
    """The model cannot be quantised this way (message says why and what would work)."""


# what export_checkpoint reports as ExportError
REFUSALS = (CheckpointError, UnsupportedModel, ShardingError, QuantError)
