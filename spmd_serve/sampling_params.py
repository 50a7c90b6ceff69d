"""Per-request generation parameters, shared by the scheduler (stop rules) and the sampler.

Everything a request asks for travels with the request (eos ids, stop strings, seed, penalties);
nothing here is shared across the batch.  Validation raises ValueError whose message names the
field, so the front end can answer 400 with it.  It also bounds every number by what the sampler
holds it in (ops.sample's per-row arrays: int32 counts, top-k and eos ids, float32 temperature,
top-p and penalties, a 64-bit seed): a value that passed `validate` cannot overflow there, so one
request's parameters can never fail the batched sampling call of a whole step.
"""

from __future__ import annotations

from dataclasses import dataclass

INT32_MAX = 2**31 - 1  # token counts, top_k and eos ids are int32 rows in ops.sample
INT64_MAX = 2**63 - 1  # seeds: the engine's own draws are 63-bit; a user's must fit an int64 too
FLOAT32_MAX = 3.4028234663852886e38  # temperature, top_p and the penalties are float32 rows
SAMPLING_EPS = 1e-5  # temperatures below this are greedy (as vLLM)
MAX_LOGPROBS = 20  # top-n logprobs a request may ask for (OpenAI's own limit)
MAX_BAD_WORDS = 128  # token sequences one request may ban (vLLM's bad_words: each word, maybe twice)
MAX_BAD_WORD_TOKENS = 64  # ids in one of them
MAX_CHOICES = 64  # vLLM's guided_choice: answers one request may be held to
MAX_CHOICE_TOKENS = 256  # ids in one of them
MAX_SCHEMA_CHARS = 1 << 16  # a json_schema's text
MAX_WHITESPACE_CHARS = 256  # a JSON answer's whitespace pattern
JSON_OBJECT = '{"type":"object"}'  # OpenAI's json_object as a schema: any one object
MAX_SALT_CHARS = 1024  # a cache_salt's (vLLM suggests 43: 256 random bits in base64)
MAX_LOGIT_BIAS = 100.0  # |bias| a request may add to a token's logit (OpenAI's range: -100 bans, 100 forces)


@dataclass
class SamplingParams:
    max_tokens: int = 16  # generated tokens at most (native max_dec_len)
    min_tokens: int = 1  # EOS is masked until this many were generated (min_dec_len;
    # OpenAI's min_tokens may be 0)
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass in [0, 1]; 0 behaves as greedy
    top_k: int = 0  # 0 = disabled
    min_p: float = 0.0  # vLLM's: drop tokens below min_p x the most likely one's probability (0 = off)
    seed: int | None = None  # None: the engine draws one at admission
    repetition_penalty: float = 1.0  # native penalty_score (> 0)
    frequency_penalty: float = 0.0  # native frequency_score
    presence_penalty: float = 0.0  # native presence_score
    eos_token_ids: tuple[int, ...] = ()  # this request's stop token ids (model's own added by the engine)
    stop_sequences: tuple[str, ...] = ()  # checked on detokenised text by the front end
    # OpenAI's stop_token_ids (vLLM): stop like eos ids, even with ignore_eos; their text is left
    # out of the output unless include_stop_str_in_output, which also keeps a stop string's text
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    # vLLM's: false writes special tokens' text (the model's eos ids too, but not the one that stopped
    # it unless include_stop_str_in_output); frontend.text.detokenizer.join_with_specials' rule
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    ignore_eos: bool = False
    logprobs: int | None = None  # None: no logprobs; k >= 0: the chosen token's + top k
    # the same for every prompt token after the first (OpenAI's echo with logprobs): each as the model
    # predicted it from the tokens before it (engine/prompt_logprobs.py)
    prompt_logprobs: int | None = None
    # OpenAI's logit_bias: (token id, bias) pairs, ids ascending and distinct, added to the row's logits
    # before the penalties and every draw (engine/logits_adjust.py); logprobs stay the model's raw ones
    logit_bias: tuple[tuple[int, float], ...] = ()
    allowed_token_ids: tuple[int, ...] = ()  # vLLM's: when given, every other token is masked (ascending, distinct)
    # vLLM's bad_words as token sequences: a sequence's last id is masked wherever the output ends
    # with the ids before it (engine/logits_adjust.py)
    bad_words: tuple[tuple[int, ...], ...] = ()
    # vLLM's guided_choice as token sequences: the answer is one of them, then an eos id
    # (engine/logits_adjust.py masks every other token)
    guided_sequences: tuple[tuple[int, ...], ...] = ()
    # OpenAI's response_format json_object / json_schema, vLLM's guided_json: the answer is one JSON
    # value of this schema (JSON text; json_object's is JSON_OBJECT), then an eos id
    # (engine/json_schema.py makes its grammar; engine/json_masks.py masks every token that would leave it)
    json_schema: str = ""
    # vLLM's whitespace_pattern (disable_any_whitespace: ""): the regular expression every run of
    # whitespace between the JSON answer's lexemes matches; None: llama.cpp's rule (engine/json_whitespace.py)
    json_whitespace: str | None = None
    # vLLM's guided_regex: the answer is one match of this pattern, then an eos id where it may end
    # (engine/json_patterns.answer_grammar; masked as a JSON answer is)
    regex: str = ""
    # vLLM's guided_grammar: the answer is one match of this GBNF grammar's root rule (a Lark one's start),
    # then an eos id where it may end (engine/gbnf_grammar.answer_grammar; masked as a JSON answer is)
    gbnf: str = ""
    # vLLM's structural_tag (compact JSON text): free text whose triggers open structures of a begin,
    # a JSON value and an end (engine/structural_tag.answer_grammar; masked as a JSON answer is);
    # the answer may end anywhere in the free text
    structural_tag: str = ""
    # vLLM's cache_salt: this request's prompt shares cached KV blocks only with requests of the same
    # salt (a tenant's secret, so that another cannot time a hit on its prompts); "" = the shared cache
    cache_salt: str = ""
    # a thinking budget (vLLM's thinking_token_budget, the Messages API's budget_tokens): once the answer's
    # think block holds this many tokens unclosed, the close tag's ids are forced (engine/think_budget.py); -1 none
    think_budget: int = -1
    think_inside: bool = False  # the prompt opened the block: the answer begins inside it
    think_open: tuple[int, ...] = ()  # the tags' ids as the tokenizer writes each alone (think_close: the forced ones)
    think_close: tuple[int, ...] = ()

    @property
    def grammar(self) -> bool:
        """Whether the answer is held to a grammar (a JSON schema's, a pattern's, a GBNF one's or a
        structural tag's)."""
        return bool(self.json_schema or self.regex or self.gbnf or self.structural_tag)

    @property
    def needs_vocabulary(self) -> bool:
        """Whether rank 0 reads this request's tokens' bytes (its grammar's masks, its think tags)."""
        return self.grammar or self.think_budget >= 0

    def validate(self) -> SamplingParams:
        """Raise ValueError naming the first bad field; return self for chaining."""
        if not _is_int(self.max_tokens) or not 1 <= self.max_tokens <= INT32_MAX:
            raise ValueError(f"max_dec_len must be an integer in [1, {INT32_MAX}], got {self.max_tokens!r}")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_dec_len({self.min_tokens}) must not exceed max_dec_len({self.max_tokens})")
        for name, value in (
            ("temperature", self.temperature),
            ("topp", self.top_p),
            ("penalty_score", self.repetition_penalty),
            ("frequency_score", self.frequency_penalty),
            ("presence_score", self.presence_penalty),
        ):
            if not _is_float32(value):
                raise ValueError(f"{name} must be a number of magnitude <= {FLOAT32_MAX:.7g}, got {value!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0 <= self.top_p <= 1:
            raise ValueError(f"topp must be in [0, 1], got {self.top_p!r}")
        if not (_is_float32(self.min_p) and 0 <= self.min_p <= 1):
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if not _is_int(self.top_k) or not 0 <= self.top_k <= INT32_MAX:
            raise ValueError(f"top_k must be an integer in [0, {INT32_MAX}], got {self.top_k!r}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"penalty_score must be > 0, got {self.repetition_penalty!r}")
        for name, k in (("logprobs", self.logprobs), ("prompt_logprobs", self.prompt_logprobs)):
            if k is not None and not (_is_int(k) and 0 <= k <= MAX_LOGPROBS):
                raise ValueError(f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {k!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= INT64_MAX):
            raise ValueError(f"seed must be an integer in [0, {INT64_MAX}], got {self.seed!r}")
        allowed = self.allowed_token_ids
        if list(allowed) != sorted(set(allowed)):
            raise ValueError("allowed_token_ids must be distinct and ascending")
        for name, ids in (
            ("eos_token_ids", self.eos_token_ids),
            ("stop_token_ids", self.stop_token_ids),
            ("allowed_token_ids", allowed),
        ):
            bad = [i for i in ids if not (_is_int(i) and 0 <= i <= INT32_MAX)]
            if bad:
                raise ValueError(f"{name} must be integers in [0, {INT32_MAX}], got {bad[0]!r}")
        if len(self.bad_words) > MAX_BAD_WORDS or not all(
            0 < len(w) <= MAX_BAD_WORD_TOKENS and all(_is_int(t) and 0 <= t <= INT32_MAX for t in w)
            for w in self.bad_words
        ):
            raise ValueError(
                f"bad_words must be at most {MAX_BAD_WORDS} sequences of 1 to {MAX_BAD_WORD_TOKENS} token ids"
            )
        if len(self.guided_sequences) > MAX_CHOICES or not all(
            0 < len(s) <= MAX_CHOICE_TOKENS and all(_is_int(t) and 0 <= t <= INT32_MAX for t in s)
            for s in self.guided_sequences
        ):
            raise ValueError(f"guided_choice must be 1 to {MAX_CHOICES} answers of 1 to {MAX_CHOICE_TOKENS} tokens")
        if self.guided_sequences and (self.ignore_eos or self.min_tokens):
            raise ValueError("guided_choice ends the answer with an EOS: not with ignore_eos or min_tokens")
        if not isinstance(self.json_schema, str) or len(self.json_schema) > MAX_SCHEMA_CHARS:
            raise ValueError(f"a JSON schema must be JSON text of at most {MAX_SCHEMA_CHARS} characters")
        spaces = self.json_whitespace
        if spaces is not None and not (
            isinstance(spaces, str) and len(spaces) <= MAX_WHITESPACE_CHARS and self.json_schema
        ):
            raise ValueError(
                f"json_whitespace must be a pattern of at most {MAX_WHITESPACE_CHARS} characters, "
                "only with a JSON schema"
            )
        texts = (("guided_regex", self.regex), ("guided_grammar", self.gbnf), ("structural_tag", self.structural_tag))
        for name, text in texts:
            if not isinstance(text, str) or len(text) > MAX_SCHEMA_CHARS:
                raise ValueError(f"a {name} must be a string of at most {MAX_SCHEMA_CHARS} characters")
        if bool(self.json_schema) + sum(bool(t) for _, t in texts) + bool(self.guided_sequences) > 1:
            raise ValueError(
                "an answer is held to one of a guided choice, a JSON schema, a pattern, a grammar and a structural "
                "tag, not more"
            )
        # (a structural tag's answer may end anywhere in its free text: ignore_eos and min_tokens only delay that)
        if (self.json_schema or self.regex or self.gbnf) and (self.ignore_eos or self.min_tokens):
            raise ValueError(
                "a JSON, guided_regex or guided_grammar answer ends with an EOS: not with ignore_eos or min_tokens"
            )
        if allowed and set(allowed) <= {w[0] for w in self.bad_words if len(w) == 1}:
            raise ValueError("bad_words ban every token allowed_token_ids allows")
        if not all(isinstance(s, str) for s in self.stop_sequences):
            raise ValueError("stop_sequences must be strings")
        biased = [t for t, _ in self.logit_bias]
        if not all(_is_int(t) and 0 <= t <= INT32_MAX for t in biased) or biased != sorted(set(biased)):
            raise ValueError(f"logit_bias must name distinct token ids in [0, {INT32_MAX}], ascending")
        bad_bias = [b for _, b in self.logit_bias if not (_is_float32(b) and abs(b) <= MAX_LOGIT_BIAS)]
        if bad_bias:
            raise ValueError(f"logit_bias values must be numbers in [-100, 100], got {bad_bias[0]!r}")
        if not isinstance(self.cache_salt, str) or len(self.cache_salt) > MAX_SALT_CHARS:
            raise ValueError(f"cache_salt must be a string of at most {MAX_SALT_CHARS} characters")
        if not _is_int(self.think_budget) or not -1 <= self.think_budget <= INT32_MAX:
            raise ValueError(f"thinking_token_budget must be an integer in [0, {INT32_MAX}], got {self.think_budget!r}")
        tags = (self.think_open, self.think_close)
        if not all(0 < len(ids) <= MAX_BAD_WORD_TOKENS and all(_is_int(t) and t >= 0 for t in ids) for ids in tags):
            if self.think_budget >= 0 or any(tags):
                raise ValueError("a thinking budget needs the think tags' token ids")
        return self

    @property
    def greedy(self) -> bool:
        # Below SAMPLING_EPS, logits / temperature overflows: such a temperature means greedy.
        return self.temperature < SAMPLING_EPS or self.top_p == 0 or self.top_k == 1


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_float32(v: object) -> bool:
    """A real number that float32 holds without overflowing (NaN is not one)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) <= FLOAT32_MAX
