"""Per-request generation parameters, shared by the scheduler (stop rules) and the sampler.

Everything a request asks for travels with the request (eos ids, stop strings, seed, penalties);
nothing here is shared across the batch.  Validation raises ValueError whose message names the
field, so the front end can answer 400 with it.
"""

from __future__ import annotations

from dataclasses import dataclass

SAMPLING_EPS = 1e-5  # temperatures below this are greedy (as vLLM)
MAX_LOGPROBS = 20  # top-n logprobs a request may ask for (OpenAI's own limit)


@dataclass
class SamplingParams:
    max_tokens: int = 16  # generated tokens at most (native max_dec_len)
    min_tokens: int = 1  # EOS is masked until this many were generated (min_dec_len;
    # OpenAI's min_tokens may be 0)
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass in [0, 1]; 0 behaves as greedy
    top_k: int = 0  # 0 = disabled
    seed: int | None = None  # None: the engine draws one at admission
    repetition_penalty: float = 1.0  # native penalty_score (> 0)
    frequency_penalty: float = 0.0  # native frequency_score
    presence_penalty: float = 0.0  # native presence_score
    eos_token_ids: tuple[int, ...] = ()  # this request's stop token ids (model's own added by the engine)
    stop_sequences: tuple[str, ...] = ()  # checked on detokenised text by the front end
    ignore_eos: bool = False
    logprobs: int | None = None  # None: no logprobs; k >= 0: the chosen token's + top k

    def validate(self) -> SamplingParams:
        """Raise ValueError naming the first bad field; return self for chaining."""
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_dec_len must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_dec_len({self.min_tokens}) must not exceed max_dec_len({self.max_tokens})")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0 <= self.top_p <= 1:
            raise ValueError(f"topp must be in [0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"penalty_score must be > 0, got {self.repetition_penalty!r}")
        if self.logprobs is not None and not (isinstance(self.logprobs, int) and 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        return self

    @property
    def greedy(self) -> bool:
        # Below SAMPLING_EPS, logits / temperature overflows: such a temperature means greedy.
        return self.temperature < SAMPLING_EPS or self.top_p == 0 or self.top_k == 1
