"""`RequestOutput`: what the engine reports about one request after one step (engine → IO side).

Built only through its named constructors, so a reader sees *why* an output exists: the tokens a
step produced for a request (`RequestOutput.step`), or the end of a request that failed
(`RequestOutput.error`: refused at admission, the server shutting down, a rank gone), or one an
operator ended (`RequestOutput.aborted`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# (logprob of the chosen token, [(token id, logprob)] of the top n, best first)
TokenLogprobs = tuple[float, list[tuple[int, float]]]
# a prompt token's: the same and its rank in its row (1 + how many other tokens the model put at least
# as high: vLLM's prompt_logprobs report it)
PromptLogprobs = tuple[float, list[tuple[int, float]], int]


class _Stepped(Protocol):
    """What `RequestOutput.step` reads of a scheduler Request after its update."""

    @property
    def req_id(self) -> str: ...

    @property
    def output_token_ids(self) -> list[int]: ...

    @property
    def finish_reason(self) -> str | None: ...

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def is_finished(self) -> bool: ...

    @property
    def num_cached_tokens(self) -> int | None: ...

    @property
    def num_new_tokens(self) -> int: ...


@dataclass
class RequestOutput:
    req_id: str
    new_token_ids: list[int]  # tokens produced this step (0 or 1; several when drafts were accepted)
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    error_code: int = 0  # HTTP-like status when the engine failed the request
    error_msg: str = ""
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache
    # One entry per new token when the request asked for logprobs: (chosen logprob, top n).
    logprobs: list[TokenLogprobs] | None = None
    # The first output of a request that asked for prompt logprobs: one entry per prompt token after the first.
    prompt_logprobs: list[PromptLogprobs] | None = None

    @classmethod
    def step(
        cls,
        req: _Stepped,
        logprobs: list[TokenLogprobs] | None = None,
        prompt_logprobs: list[PromptLogprobs] | None = None,
    ) -> RequestOutput:
        """The tokens this step appended to `req` (and whether that ended it); `logprobs`: one
        entry per token sampled for it (a stop may have dropped the last ones)."""
        n = max(req.num_new_tokens, 1)
        return cls(
            req.req_id,
            req.output_token_ids[-n:],
            req.is_finished,
            req.finish_reason,
            num_prompt_tokens=req.num_prompt_tokens,
            num_cached_tokens=req.num_cached_tokens or 0,
            logprobs=None if logprobs is None else logprobs[:n],
            prompt_logprobs=prompt_logprobs,
        )

    @classmethod
    def aborted(cls, req: _Stepped, why: str) -> RequestOutput:
        """The end of a request an operator aborted: the tokens it had stand, `why` says who ended it."""
        return cls(
            req.req_id, [], True, "abort", 0, why,
            num_prompt_tokens=req.num_prompt_tokens, num_cached_tokens=req.num_cached_tokens or 0,
        )  # fmt: skip

    @classmethod
    def error(cls, req_id: str, error_code: int, error_msg: str) -> RequestOutput:
        """The end of a request the engine failed or refused, with an HTTP-like status."""
        return cls(req_id, [], True, "error", error_code, error_msg)
