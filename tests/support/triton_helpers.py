"""Test helpers for the Triton gRPC door, written against the unmodified `tritonclient.grpc`:
IN tensors, OUT frames, the final flag, stream collection and error codes."""

from __future__ import annotations

import json
import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as tg
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc._utils import _get_inference_request
from tritonclient.utils import InferenceServerException


def in_tensor(body: dict | bytes) -> list[tg.InferInput]:
    """Input IN as the original tool's clients send it: a JSON list holding one request."""
    data = body if isinstance(body, bytes) else json.dumps([body]).encode()
    inp = tg.InferInput("IN", [1], "BYTES")
    inp.set_data_from_numpy(np.array([data], dtype=object))
    return [inp]


def client_request(payload: bytes | None, name: str = "IN", outputs: list | None = None) -> pb.ModelInferRequest:
    """The ModelInferRequest tritonclient itself builds (BYTES go in raw_input_contents)."""
    inputs = []
    if payload is not None:
        inputs = [tg.InferInput(name, [1], "BYTES")]
        inputs[0].set_data_from_numpy(np.array([payload], dtype=object))
    return _get_inference_request(
        model_name="model",
        inputs=inputs,
        model_version="",
        request_id="rid",
        outputs=outputs,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        parameters=None,
    )


def out_obj(result: tg.InferResult) -> dict:
    """The one native object in output OUT (a JSON list of exactly one)."""
    out = json.loads(result.as_numpy("OUT")[0])
    assert isinstance(out, list) and len(out) == 1
    return out[0]


def is_final(result: tg.InferResult) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


def code_of(fn, *args, **kw) -> tuple[str, str]:
    """(gRPC status name, message) of a call that must fail."""
    with pytest.raises(InferenceServerException) as e:
        fn(*args, **kw)
    return e.value.status(), e.value.message()


class Stream:
    """start_stream + a queue of (response id, frame | error, final?) as the callback gets them."""

    def __init__(self, triton: tg.InferenceServerClient, **kw) -> None:
        self.triton, self.got = triton, queue.Queue()
        triton.start_stream(callback=self._callback, **kw)

    def _callback(self, result, error) -> None:
        if error is not None:
            self.got.put(("", error, True))
        else:
            self.got.put((result.get_response().id, out_obj(result), is_final(result)))

    def send(self, body: dict | bytes, request_id: str = "", **kw) -> None:
        self.triton.async_stream_infer("model", in_tensor(body), request_id=request_id, **kw)

    def collect(self, n_final: int, timeout: float = 10) -> list[tuple]:
        """Everything received until `n_final` requests have ended (final flag or error)."""
        items, end = [], time.monotonic() + timeout
        while n_final:
            item = self.got.get(timeout=max(0.01, end - time.monotonic()))
            items.append(item)
            n_final -= item[2]
        return items
