"""Reading an answer's choices, for every route built on the OpenAI request (chat, completions,
Responses, Messages, SGLang's /generate): `apply_delta` advances one choice's `ChoiceState` by a
delta and says what to send; `collect` reads every choice to its end for a whole answer.
"""

from __future__ import annotations

from spmd_serve.frontend.common.generation import Delta, Generation, GenerationError, failing_aborts, merged
from spmd_serve.frontend.common.http_base import JsonBodyHandler
from spmd_serve.frontend.openai.body import send_openai_error
from spmd_serve.frontend.openai.format import ChoiceState, Formatter


def apply_delta(fmt: Formatter, state: ChoiceState, d: Delta) -> tuple[str, list]:
    """(text to send, logprobs entries) of one delta; the choice's state advanced."""
    state.finish_reason = "length" if fmt.req.echo_only and d.finish_reason else d.finish_reason
    state.cached_tokens, state.stop_sequence = d.num_cached_tokens, d.stop_sequence
    state.abort_message = d.abort_message
    if d.finish_reason == "stop":  # vLLM's stop_reason: the stop string, or the stop_token_ids id (not the EOS)
        last = d.token_ids[-1] if d.token_ids else None
        state.stop_reason = d.stop_sequence or (last if last in fmt.req.params.stop_token_ids else None)
    entries = fmt.prompt_entries(state, d.prompt_logprobs)
    fmt.prompt_logprobs(state, d.prompt_logprobs)
    if fmt.req.echo_only:  # max_tokens 0: the one token the engine made is not the answer's
        return "", entries
    state.text += d.text
    state.num_tokens += len(d.token_ids)
    if fmt.req.token_ids:
        state.token_ids += d.token_ids
    return d.text, entries + list(zip(d.token_ids, d.logprobs))


async def collect(
    h: JsonBodyHandler, fmt: Formatter, gens: list[Generation], states: list[ChoiceState], aborts_fail: bool = False
) -> bool:
    """Read every choice to its end (a whole answer); False where one failed (its error sent).
    `aborts_fail`: for an API whose answer cannot say "abort" (`failing_aborts`)."""
    deltas = failing_aborts(merged(gens)) if aborts_fail else merged(gens)
    try:
        async for i, d in deltas:
            states[i].logprobs += apply_delta(fmt, states[i], d)[1]
    except GenerationError as e:
        send_openai_error(h, e.status, e.msg)
        return False
    return True
