"""spmd_serve.model_dir: the served model directory checked on every rank (CONTRACT §7) and the
settings clamped to the model's limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from spmd_serve.config import ConfigError, ServeConfig
from spmd_serve.model_dir import check_draft_dir, check_model_dir, clamp_to_model, max_positions


def _model_dir(
    tmp_path: Path,
    ranks: int = 1,
    config: str | None = '{"max_position_embeddings": 4096}',
    empty: tuple[int, ...] = (),
) -> Path:
    (d := tmp_path / "model").mkdir()
    if config is not None:
        (d / "config.json").write_text(config)
    for i in range(ranks):
        (d / f"rank_{i}").mkdir()
        if i not in empty:
            (d / f"rank_{i}" / "model.pdiparams").write_bytes(b"x")
    return d


def test_check_model_dir_success(tmp_path):
    cfg = ServeConfig(model_dir=str(_model_dir(tmp_path, ranks=2)), mp_num=2)
    assert check_model_dir(cfg, world_size=2) == {"max_position_embeddings": 4096}


@pytest.mark.parametrize(
    "ranks,mp_num,world,config,empty,expected",
    [
        (1, 2, 1, "{}", (), "MP_NUM=2 but the MPI world size is 1 (start with mpirun -n 2)"),
        (1, 1, 1, None, (), "has no config.json"),
        (1, 1, 1, "{oops", (), "config.json is not valid JSON"),
        (1, 1, 1, "[1, 2]", (), "config.json must hold a JSON object"),
        (0, 1, 1, "{}", (), "has no rank_0/"),
        (1, 2, 2, "{}", (), "has no rank_1/ (it has 1 rank folder(s): exported with --tp 1?"),
        (2, 1, 1, "{}", (), "has 2 rank folders but MP_NUM=1 (exported with --tp 2? set MP_NUM=2)"),
        (2, 2, 2, "{}", (1,), "has an empty rank_1/"),
    ],
)
def test_check_model_dir_failures(tmp_path, ranks, mp_num, world, config, empty, expected):
    d = _model_dir(tmp_path, ranks=ranks, config=config, empty=empty)
    with pytest.raises(ConfigError) as exc:
        check_model_dir(ServeConfig(model_dir=str(d), mp_num=mp_num), world_size=world)
    assert expected in str(exc.value) and "\n" not in str(exc.value)


def test_check_model_dir_missing_and_not_a_dir(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        check_model_dir(ServeConfig(model_dir=str(tmp_path / "nope")), world_size=1)
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match="is not a directory"):
        check_model_dir(ServeConfig(model_dir=str(tmp_path / "f")), world_size=1)
    with pytest.raises(ConfigError, match="MODEL_DIR is not set"):
        check_model_dir(ServeConfig(), world_size=1)


def test_clamp_to_model():
    cfg = ServeConfig(max_seq_len=8192, block_size=64)
    assert clamp_to_model(cfg, {"max_position_embeddings": 2048}).max_seq_len == 2048
    assert clamp_to_model(cfg, {"max_position_embeddings": 32768}) == cfg  # never raised
    assert clamp_to_model(cfg, {}) is cfg
    fixed = clamp_to_model(cfg, {"max_position_embeddings": 1024, "block_size": 32})
    assert (fixed.max_seq_len, fixed.block_size) == (1024, 32)
    with pytest.raises(ConfigError, match="block_size=0"):
        clamp_to_model(cfg, {"block_size": 0})


def _export(root: Path, name: str, ranks: int = 2, vocab: int = 100, tokenizer: bytes = b"spm", **config) -> Path:
    """A served-directory shape: config.json, rank folders, a tokenizer file."""
    import json

    (root / name).mkdir(parents=True)
    d = _model_dir(root / name, ranks=ranks, config=json.dumps({"vocab_size": vocab, **config}))
    (d / "tokenizer.model").write_bytes(tokenizer)
    return d


def _draft_cfg(target: Path, draft: Path | None) -> ServeConfig:
    return ServeConfig(
        model_dir=str(target),
        mp_num=2,
        speculate_method="draft_model",
        speculate_model_path=None if draft is None else str(draft),
    )


def test_a_draft_of_the_targets_tokenizer_and_ranks_is_accepted(tmp_path):
    target, draft = _export(tmp_path, "target"), _export(tmp_path, "draft", max_position_embeddings=64)
    assert check_draft_dir(_draft_cfg(target, draft), {"vocab_size": 100})["max_position_embeddings"] == 64
    assert max_positions(draft) == 64 and max_positions(target) == 1 << 62


@pytest.mark.parametrize(
    "draft,expected",
    [
        (None, "SPECULATE_METHOD=draft_model needs SPECULATE_MODEL_PATH"),
        ({"ranks": 0}, "is not a draft model export: model directory"),
        ({"ranks": 1}, "was exported for 1 rank(s) but the target runs on MP_NUM=2"),
        ({"vocab": 99}, "the draft's vocab_size 99 differs from the target's 100"),
        ({"tokenizer": b"other"}, "the draft's tokenizer differs from the target's (tokenizer.model)"),
        ({"block_size": 32}, "the draft was exported for KV blocks of 32 tokens, the target serves 64"),
    ],
)
def test_a_draft_that_cannot_draft_for_the_target_is_refused_in_one_line(tmp_path, draft, expected):
    target = _export(tmp_path, "target")
    path = None if draft is None else _export(tmp_path, "draft", **draft)
    with pytest.raises(ConfigError) as exc:
        check_draft_dir(_draft_cfg(target, path), {"vocab_size": 100})
    assert expected in str(exc.value) and "\n" not in str(exc.value)
    if path is not None:
        assert str(exc.value).startswith(f"SPECULATE_MODEL_PATH={path}")


def test_the_draft_models_pool_counts_in_the_memory_check(monkeypatch):
    """check_kv_fits: a target pool that fits alone is refused once the draft's pool joins it."""
    from types import SimpleNamespace

    from spmd_serve.kv_layout import KVLayout
    from spmd_serve.worker import capacity

    serve = SimpleNamespace(
        block_size=16, block_bs=8, max_seq_len=2048, max_dec_len=512, use_cache_kv_int8=False, num_blocks=lambda: 1024
    )
    target, draft = KVLayout.kv_heads(4, 2, 32), KVLayout.kv_heads(2, 2, 16)  # 2048 and 512 bytes per token
    budget = 1024 * 16 * 2304  # bytes: the target's pool and less than half the draft's
    monkeypatch.setattr(capacity.psutil, "virtual_memory", lambda: SimpleNamespace(available=budget / 0.9))
    capacity.check_kv_fits(serve, target, 1)
    with pytest.raises(ConfigError, match=r"^BLOCK_BS=8 needs .* \(the draft model’s included\).* that fits is 7$"):
        capacity.check_kv_fits(serve, target, 1, draft, scratch=64)
