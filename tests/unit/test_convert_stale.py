"""start_server names the directories an earlier version left: a downloaded model's conversions
(launcher/convert.py: `stale_conversions`) and the built-in demo model's exports
(`ensure_demo_model`), and only those (manifest.py: `other_format_dirs`)."""

from __future__ import annotations

import logging

from spmd_serve.export import ensure_demo_model
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


def test_the_demo_model_names_an_earlier_versions_demo_exports(tmp_path, caplog):
    current = tmp_path / f"demo-chat-tp1-v{MANIFEST_VERSION}"
    current.mkdir()
    (current / "config.json").write_text("{}")  # present: nothing is exported
    old = tmp_path / f"demo-chat-tp2-v{MANIFEST_VERSION - 1}"
    old.mkdir()
    (old / "model.pdiparams").write_bytes(b"\0" * (3 << 20))
    kept = (
        f"demo-chat-draft-tp1-v{MANIFEST_VERSION - 1}",  # another preset's: named when that one is made
        f".demo-chat-tp1-v{MANIFEST_VERSION}.x1y2",  # an export in progress
        f"demo-chat-tp1-v{MANIFEST_VERSION - 1}.bak",  # not a name the tool makes
    )
    for name in kept:
        (tmp_path / name).mkdir()
    with caplog.at_level(logging.WARNING):
        assert ensure_demo_model("chat", 1, root=tmp_path) == current
    assert [r.getMessage() for r in caplog.records] == [
        f"{old} (3 MiB) is an earlier version's demo model, not read by this one: remove it to free the disk"
    ]
