"""CONTRACT.md §2 (the environment variables' table) for the tests that hold envs.py to it.

The contract lives beside the repository (`../shared/CONTRACT.md`), which a clone elsewhere (CI)
may not have; `contract_env.md` here is a copy of its §2, so those tests always run.  Where the
contract is present, `env_section()` reads it and tests/unit/test_config.py checks that the copy
is still equal to it (update the copy when the contract changes).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "CONTRACT.md"
COPY = Path(__file__).with_name("contract_env.md")


def shared_env_section() -> str | None:
    """§2 of ../shared/CONTRACT.md, from its heading up to §3; None when the contract is not there."""
    if not SHARED.exists():
        return None
    return "## 2." + SHARED.read_text(encoding="utf-8").split("\n## 2.", 1)[1].split("\n## 3.", 1)[0] + "\n"


def env_section() -> str:
    """§2 of the contract: the shared file's when present, else the committed copy."""
    return shared_env_section() or COPY.read_text(encoding="utf-8")
