"""frontend.triton.codec without a server: IN/OUT tensors as tritonclient builds and reads them, the
model check and the status mapping."""

import json

import grpc
import pytest
import tritonclient.grpc as tg
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from spmd_serve.frontend.common.parsing import ProtocolError
from spmd_serve.frontend.triton import codec
from tests.support.triton_helpers import client_request


def status_of(fn, *args) -> tuple[int, str]:
    with pytest.raises(ProtocolError) as e:
        fn(*args)
    return e.value.status, e.value.msg


BODY = {"text": "héllo", "max_dec_len": 3, "stream": True}


@pytest.mark.parametrize("payload", [[BODY], BODY])
def test_in_from_tritonclient_raw_list_or_bare_object(payload):
    req = client_request(json.dumps(payload, ensure_ascii=False).encode())
    assert req.raw_input_contents and not req.inputs[0].contents.bytes_contents
    assert codec.read_in(req) == BODY


def test_in_from_bytes_contents():
    req = pb.ModelInferRequest(model_name="model")
    req.inputs.add(name="OTHER", datatype="FP32", shape=[1])
    t = req.inputs.add(name="IN", datatype="BYTES", shape=[1])
    t.contents.bytes_contents.append(json.dumps([BODY]).encode())
    assert codec.read_in(req) == BODY


def test_in_raw_is_matched_by_input_position():
    req = pb.ModelInferRequest(model_name="model")
    req.inputs.add(name="OTHER", datatype="BYTES", shape=[1])
    req.inputs.add(name="IN", datatype="BYTES", shape=[1])
    req.raw_input_contents.extend(
        [codec.pack_bytes_tensor([b"[1]"]), codec.pack_bytes_tensor([json.dumps(BODY).encode()])]
    )
    assert codec.read_in(req) == BODY


@pytest.mark.parametrize(
    "payload, words",
    [
        (b"{not json", "not valid JSON"),
        (b'{"text": "x", "temperature": NaN}', "NaN is not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[]", "one request object"),
        (json.dumps([BODY, BODY]).encode(), "one request object"),
        (b'"text"', "one request object"),
    ],
)
def test_bad_in_payload_is_400(payload, words):
    status, msg = status_of(codec.read_in, client_request(payload))
    assert status == 400 and words in msg


def test_bad_in_tensor_is_400():
    assert "IN is missing" in status_of(codec.read_in, client_request(b"{}", name="X"))[1]
    req = pb.ModelInferRequest()
    req.inputs.add(name="IN", datatype="INT32", shape=[1])
    assert "datatype BYTES" in status_of(codec.read_in, req)[1]
    req = pb.ModelInferRequest()
    t = req.inputs.add(name="IN", datatype="BYTES", shape=[2])
    t.contents.bytes_contents.extend([b"{}", b"{}"])
    assert "exactly one element" in status_of(codec.read_in, req)[1]
    for raw in (b"\x05\x00", b"\x09\x00\x00\x00{}"):  # cut prefix, element longer than data
        req = client_request(b"{}")
        req.raw_input_contents[0] = raw
        assert "truncated" in status_of(codec.read_in, req)[1]


def test_requested_outputs_must_be_out():
    codec.check_outputs(client_request(b"{}", outputs=[tg.InferRequestedOutput("OUT")]))
    req = client_request(None, outputs=[tg.InferRequestedOutput("LOGITS")])
    status, msg = status_of(codec.check_outputs, req)
    assert status == 400 and "LOGITS" in msg


def test_out_reads_back_with_tritonclient_and_carries_final_flag():
    frame = {"req_id": "r", "token": "é✓", "is_end": 1}
    resp = codec.infer_response(client_request(b"{}"), frame, final=True)
    result = tg.InferResult(resp)
    out = result.as_numpy("OUT")
    assert out.shape == (1,) and json.loads(out[0]) == [frame]
    assert resp.id == "rid" and (resp.model_name, resp.model_version) == ("model", "1")
    assert resp.parameters[codec.FINAL_PARAM].bool_param is True
    assert (
        codec.infer_response(client_request(b"{}"), frame, final=False).parameters[codec.FINAL_PARAM].bool_param
        is False
    )
    assert codec.FINAL_PARAM not in codec.infer_response(client_request(b"{}"), frame).parameters


def test_bytes_tensor_round_trip():
    items = [b"", b"a", "ü".encode() * 300]
    assert codec.unpack_bytes_tensor(codec.pack_bytes_tensor(items)) == items


def test_model_name_and_version():
    codec.check_model("model", "")
    codec.check_model("model", "1")
    assert status_of(codec.check_model, "llama", "") == (404, "Request for unknown model: 'llama' is not found")
    assert status_of(codec.check_model, "model", "2")[0] == 404


def test_status_mapping():
    S = grpc.StatusCode
    expected = {
        400: S.INVALID_ARGUMENT,
        401: S.UNAUTHENTICATED,
        404: S.NOT_FOUND,
        409: S.ALREADY_EXISTS,
        429: S.RESOURCE_EXHAUSTED,
        503: S.UNAVAILABLE,
        504: S.DEADLINE_EXCEEDED,
        500: S.INTERNAL,
        501: S.INTERNAL,
    }
    assert {k: codec.grpc_status(k) for k in expected} == expected


def test_metadata_and_config_describe_one_decoupled_bytes_model():
    md = codec.model_metadata()
    assert (md.name, list(md.versions)) == ("model", ["1"])
    assert [(t.name, t.datatype, list(t.shape)) for t in [*md.inputs, *md.outputs]] == [
        ("IN", "BYTES", [1]),
        ("OUT", "BYTES", [1]),
    ]
    cfg = codec.model_config().config
    assert cfg.model_transaction_policy.decoupled and cfg.max_batch_size == 0
    assert [(t.name, t.data_type, list(t.dims)) for t in [*cfg.input, *cfg.output]] == [
        ("IN", mc.TYPE_STRING, [1]),
        ("OUT", mc.TYPE_STRING, [1]),
    ]
