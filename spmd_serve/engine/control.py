"""An operator's requests of the engine itself, not generations: `ControlCommand`s from the front
end's admin endpoints, done on the engine thread between two steps (so the scheduler's state is
never seen half-way through a step) and answered at once.

* `reset_prefix_cache` (vLLM's POST /reset_prefix_cache, SGLang's /flush_cache): forget every cached
  prefix; safe while requests run (the blocks they share stay theirs: scheduler/prefix_cache.py).
* `abort` (SGLang's /abort_request): end the requests named by `req_ids`, or every one (`all`), as
  an abort with the tokens they have so far (finish_reason "abort"); their owners' streams get the
  end like any other.

An unknown operation or malformed arguments are answered with an `error`, not raised: the command
is not a request's and must not end the job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from spmd_serve.engine.admission import Admission
from spmd_serve.engine.client import ControlCommand
from spmd_serve.engine.metrics import EngineMetrics
from spmd_serve.engine.outputs import RequestOutput
from spmd_serve.scheduler.block_manager import BlockManager

log = logging.getLogger("spmd_serve.engine")
Answer = dict[str, Any]


class Controls:
    """The operations, over the engine's parts; `publish` sends outputs to the front end."""

    def __init__(
        self,
        blocks: BlockManager,
        admission: Admission,
        metrics: EngineMetrics,
        publish: Callable[[list[RequestOutput]], None],
    ) -> None:
        self.blocks, self.admission, self.metrics, self.publish = blocks, admission, metrics, publish
        self._ops: dict[str, Callable[[dict[str, Any]], Answer]] = {
            "reset_prefix_cache": self._reset_prefix_cache,
            "abort": self._abort,
        }

    def answer(self, cmd: ControlCommand) -> None:
        op = self._ops.get(cmd.op)
        try:
            result = op(cmd.args) if op is not None else {"error": f"unknown control operation {cmd.op!r}"}
        except (KeyError, TypeError, ValueError) as e:
            result = {"error": f"malformed {cmd.op} arguments: {e!r}"}
        cmd.reply(result)

    def _reset_prefix_cache(self, args: dict[str, Any]) -> Answer:
        freed, kept = self.blocks.reset_prefix_cache()
        if self.blocks.cache is not None:
            log.info("prefix cache reset: %d free cached block(s) forgotten, %d in use forgotten", freed, kept)
        return {"enabled": self.blocks.cache is not None, "freed_blocks": freed, "in_use_blocks": kept}

    def _abort(self, args: dict[str, Any]) -> Answer:
        why = str(args.get("why") or "aborted by an operator")
        if args.get("all"):
            req_ids = [r.req_id for r in self.admission.in_flight()]
        else:
            req_ids = [str(i) for i in args["req_ids"]]
        now, ended = time.monotonic(), []
        for req_id in req_ids:
            req = self.admission.abort(req_id)
            self.metrics.on_abort(req, now)
            if req is not None:
                ended.append(RequestOutput.aborted(req, why))
        if ended:
            log.info("aborted %d request(s): %s", len(ended), why)
        self.publish(ended)
        return {"aborted": [out.req_id for out in ended]}
