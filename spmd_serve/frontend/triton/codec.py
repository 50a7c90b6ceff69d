"""The Triton/KServe v2 wire shapes of the native protocol (CONTRACT.md §5), as pure functions.

Owns: reading the `IN` tensor (one JSON native request, from `raw_input_contents` — what
tritonclient sends — or `contents.bytes_contents`), writing the `OUT` tensor (one JSON native
frame), the metadata/config messages that describe the served model, and the mapping from the
native protocol's HTTP-like statuses to gRPC status codes.  No gRPC server here, so every rule
can be unit-tested with plain protobuf messages.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import grpc
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from spmd_serve import __version__
from spmd_serve.frontend.common.parsing import ProtocolError, decode_json

MODEL_NAME, MODEL_VERSION = "model", "1"
IN, OUT = "IN", "OUT"
FINAL_PARAM = "triton_final_response"  # what Triton sets on a decoupled model's responses

# Native status -> gRPC code; 413 is what gRPC itself answers for an oversized message.
GRPC_STATUS: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ALREADY_EXISTS,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def grpc_status(status: int) -> grpc.StatusCode:
    """The gRPC code for a native status; anything unlisted (500, 501, ...) is INTERNAL."""
    return GRPC_STATUS.get(status, grpc.StatusCode.INTERNAL)


def check_model(name: str, version: str) -> None:
    """404 (NOT_FOUND) unless the call names the one served model (version "" means latest)."""
    if name != MODEL_NAME:
        raise ProtocolError(404, f"Request for unknown model: '{name}' is not found")
    if version not in ("", MODEL_VERSION):
        raise ProtocolError(404, f"Request for unknown model: '{name}' version {version} is not found")


def unpack_bytes_tensor(raw: bytes) -> list[bytes]:
    """Triton's raw BYTES layout: each element is a 4-byte little-endian length, then the bytes."""
    items, pos = [], 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise ProtocolError(400, "input IN: truncated BYTES tensor (length prefix cut off)")
        (n,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + n > len(raw):
            raise ProtocolError(
                400, f"input IN: truncated BYTES tensor (element of {n} bytes with {len(raw) - pos} left)"
            )
        items.append(raw[pos : pos + n])
        pos += n
    return items


def pack_bytes_tensor(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def read_in(request: pb.ModelInferRequest) -> dict[str, Any]:
    """The native request object carried by input IN: a JSON list of one object, or the object."""
    names = [t.name for t in request.inputs]
    if IN not in names:
        raise ProtocolError(400, f"input IN is missing (got inputs {names})")
    index = names.index(IN)
    tensor = request.inputs[index]
    if tensor.datatype != "BYTES":
        raise ProtocolError(400, f"input IN must have datatype BYTES, got {tensor.datatype}")
    # raw_input_contents, when used, has one entry per input, in the order of `inputs`
    if request.raw_input_contents:
        if index >= len(request.raw_input_contents):
            raise ProtocolError(400, "input IN has no data in raw_input_contents")
        items = unpack_bytes_tensor(request.raw_input_contents[index])
    else:
        items = list(tensor.contents.bytes_contents)
    if len(items) != 1:
        raise ProtocolError(400, f"input IN must hold exactly one element (shape [1]), got {len(items)}")
    value = decode_json(items[0], "input IN")  # the HTTP body's rules: no NaN, depth, surrogates
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, dict):
        raise ProtocolError(400, "input IN must be a JSON list holding one request object (or the object itself)")
    return value


def check_outputs(request: pb.ModelInferRequest) -> None:
    for out in request.outputs:
        if out.name != OUT:
            raise ProtocolError(
                400, f"unexpected inference output '{out.name}' for model '{MODEL_NAME}' (it has only {OUT})"
            )


def infer_response(
    request: pb.ModelInferRequest, obj: dict[str, Any] | None, final: bool | None = None
) -> pb.ModelInferResponse:
    """A response echoing the request id, with OUT = [obj]; `final` sets the decoupled flag."""
    resp = pb.ModelInferResponse(model_name=MODEL_NAME, model_version=MODEL_VERSION, id=request.id)
    if obj is not None:
        resp.outputs.add(name=OUT, datatype="BYTES", shape=[1])
        data = json.dumps([obj], ensure_ascii=False).encode("utf-8")
        resp.raw_output_contents.append(pack_bytes_tensor([data]))
    if final is not None:
        resp.parameters[FINAL_PARAM].bool_param = final
    return resp


def server_metadata() -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(name="spmd_serve", version=__version__, extensions=[])


def model_metadata() -> pb.ModelMetadataResponse:
    tensor = pb.ModelMetadataResponse.TensorMetadata
    return pb.ModelMetadataResponse(
        name=MODEL_NAME,
        versions=[MODEL_VERSION],
        platform="spmd_serve",
        inputs=[tensor(name=IN, datatype="BYTES", shape=[1])],
        outputs=[tensor(name=OUT, datatype="BYTES", shape=[1])],
    )


def model_config() -> pb.ModelConfigResponse:
    """Decoupled (one request, many responses) like the original tool's Triton model."""
    config = mc.ModelConfig(
        name=MODEL_NAME,
        platform="spmd_serve",
        backend="spmd_serve",
        max_batch_size=0,
        input=[mc.ModelInput(name=IN, data_type=mc.TYPE_STRING, dims=[1])],
        output=[mc.ModelOutput(name=OUT, data_type=mc.TYPE_STRING, dims=[1])],
        model_transaction_policy=mc.ModelTransactionPolicy(decoupled=True),
    )
    return pb.ModelConfigResponse(config=config)
