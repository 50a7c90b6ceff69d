"""SGLang's server probes beside `/generate`: `GET /health_generate`, the deep health check (200
with no body once the engine generated one token for a one-token prompt within HEALTH_GENERATE_S;
503 naming why otherwise — not ready, draining, failed, timed out; a full queue is a busy engine,
healthy while its loop beats), and `GET /get_model_info` (the served model, a generation model of
text only).  Neither needs the API key, as SGLang's do not: load balancers probe them.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from tornado.web import RequestHandler

from spmd_serve.frontend.common.generation import Generation, GenerationError
from spmd_serve.frontend.common.liveness import is_live, is_ready
from spmd_serve.frontend.common.parsing import ProtocolError
from spmd_serve.frontend.openai.handlers import OpenAIServing
from spmd_serve.sampling_params import SamplingParams

HEALTH_GENERATE_S = 20.0  # SGLang's HEALTH_CHECK_TIMEOUT


class HealthGenerateHandler(RequestHandler):
    """GET /health_generate."""

    def initialize(self, serving: OpenAIServing, live_threshold_s: float) -> None:
        self.serving, self.live_threshold_s = serving, live_threshold_s

    async def get(self) -> None:
        ok, why = is_ready(self.serving.client)
        if ok:
            ok, why = await self._one_token()
        self.set_status(200 if ok else 503)
        if not ok:
            self.set_header("Content-Type", "application/json; charset=utf-8")
            self.write(json.dumps({"error": {"message": f"unhealthy: {why}", "code": 503}}))
        self.finish()

    async def _one_token(self) -> tuple[bool, str]:
        s = self.serving
        prompt = s.tokenizer.encode("ok")[:1] or [0]
        params = SamplingParams(max_tokens=1, temperature=0.0)
        gen = Generation(s.client, s.tokenizer, "health-" + uuid.uuid4().hex, prompt, params,
                         time.monotonic() + HEALTH_GENERATE_S)  # fmt: skip
        try:
            gen.submit()
            async for _ in gen.deltas():
                pass
            return True, ""
        except ProtocolError as e:  # refused: a full queue is a busy engine, healthy while it beats
            return is_live(s.client, self.live_threshold_s) if e.status == 429 else (False, e.msg)
        except GenerationError as e:
            return False, e.msg
        finally:
            gen.close()


class ModelInfoHandler(RequestHandler):
    """GET /get_model_info."""

    def initialize(self, serving: OpenAIServing) -> None:
        self.serving = serving

    def get(self) -> None:
        name = self.serving.model_names[0]
        info: dict[str, Any] = {
            "model_path": name, "tokenizer_path": name, "is_generation": True, "preferred_sampling_params": None,
            "weight_version": "default", "has_image_understanding": False, "has_audio_understanding": False,
        }  # fmt: skip
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps(info))


def info_routes(serving: OpenAIServing, live_threshold_s: float) -> list[tuple]:
    health = {"serving": serving, "live_threshold_s": live_threshold_s}
    return [(r"/health_generate", HealthGenerateHandler, health),
            (r"/get_model_info", ModelInfoHandler, {"serving": serving})]  # fmt: skip
