"""The INTER_PROC_PORT wire format (engine/wire.py): frames survive any cut of the byte stream,
anything that is not one of our JSON objects is refused (never evaluated), and a request's
parameters and outputs arrive as they left."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spmd_serve.engine.outputs import RequestOutput
from spmd_serve.engine.wire import (
    MAX_FRAME,
    FrameDecoder,
    WireError,
    encode,
    output_from_wire,
    output_to_wire,
    params_from_wire,
    params_to_wire,
)
from spmd_serve.sampling_params import SamplingParams

MESSAGES = [
    {"t": "add", "n": 1, "id": "a", "prompt": [1, 2, 3], "params": {}, "at": 1.5},
    {"t": "out", "at": 2.0, "o": [[1, [7], False, None, 0, "", 3, None]]},
    {"t": "state", "ready": True, "draining": False, "failure": "rank 1 (pid 9) exited: ünïcode ✓"},
]


@given(cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_frames_survive_any_cut_of_the_stream(cuts):
    data = b"".join(encode(m) for m in MESSAGES)
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    decoder, got = FrameDecoder(), []
    for a, b in zip(points, points[1:]):
        got += decoder.feed(data[a:b])
    assert got == MESSAGES


@pytest.mark.parametrize(
    "body", [b"[1, 2]", b'{"no_t": 1}', b'{"t": 5}', b"\xff\xfe", b"cos\nsystem\n(S'echo hi'\ntR."]
)
def test_what_is_not_one_of_our_objects_is_refused(body):
    with pytest.raises(WireError):
        FrameDecoder().feed(len(body).to_bytes(4, "big") + body)


def test_an_oversized_frame_is_refused_from_its_header():
    with pytest.raises(WireError, match="exceeds"):
        FrameDecoder().feed((MAX_FRAME + 1).to_bytes(4, "big"))


def test_sampling_params_arrive_as_they_left():
    params = SamplingParams(
        max_tokens=9,
        min_tokens=2,
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        seed=2**62,
        eos_token_ids=(5, 6),
        stop_sequences=("\n\n", "é"),
        logprobs=3,
        logit_bias=((4, -100.0), (17, 2.5)),
        bad_words=((3,), (8, 9)),
        skip_special_tokens=False,
    )
    (msg,) = FrameDecoder().feed(encode({"t": "add", "params": params_to_wire(params)}))
    assert params_from_wire(msg["params"]) == params
    with pytest.raises(WireError):
        params_from_wire({"max_tokens": 1, "__class__": "x"})
    with pytest.raises(WireError):
        params_from_wire({"max_tokens": 1, "logit_bias": [[1, 2, 3]]})
    with pytest.raises(WireError):
        params_from_wire({"max_tokens": 1, "bad_words": [[1, "x"]]})


def test_outputs_arrive_as_they_left():
    outs = [
        RequestOutput("r", [5], False, None, num_prompt_tokens=4, logprobs=[(-0.5, [(5, -0.5), (6, -1.25)])]),
        RequestOutput("r", [5], False, None, prompt_logprobs=[(-2.0, [(6, -1.0)], 3), (-0.5, [], 1)]),
        RequestOutput.error("r", 409, "req_id 'r' is already in flight"),
    ]
    for out in outs:
        (msg,) = FrameDecoder().feed(encode({"t": "out", "o": [output_to_wire(out, 17)]}))
        assert msg["o"][0][0] == 17 and output_from_wire(msg["o"][0], "r") == out
