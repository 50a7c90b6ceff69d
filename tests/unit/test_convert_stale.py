"""start_server names the conversions an earlier version left next to a downloaded model
(launcher/convert.py: `stale_conversions`), and only those."""

from __future__ import annotations

from spmd_serve.launcher.convert import converted_path, stale_conversions
from spmd_serve.manifest import MANIFEST_VERSION


def test_only_other_formats_conversions_of_this_model_are_stale(tmp_path):
    folder = tmp_path / "org" / "model[1]"  # glob characters in the name match themselves only
    folder.mkdir(parents=True)
    old = [folder.with_name(f"model[1].spmd_serve-tp{tp}-v{MANIFEST_VERSION - 1}") for tp in (1, 2)]
    current = converted_path(folder, 2)
    other_model = folder.with_name(f"model1.spmd_serve-tp1-v{MANIFEST_VERSION - 1}")
    for d in (*old, current, other_model):
        d.mkdir()
    folder.with_name(f"model[1].spmd_serve-tp1-v{MANIFEST_VERSION - 2}.lock").write_text("")  # a file: not one
    assert stale_conversions(folder) == old
