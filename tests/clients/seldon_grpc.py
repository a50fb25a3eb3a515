"""seldon-core's own gRPC messages and stubs against a server: ``python seldon_grpc.py PORT``.

Runs in seldon-core's virtual environment (its old protobuf and grpcio). Reads a JSON list of
``[method, request]`` from stdin (``method``: ``Model/Predict``, ``Seldon/ModelMetadata``...;
``request``: the request message in its JSON form) and prints, for each, ``[status, details,
answer]`` (the answer message in its JSON form, or null on an error), as one JSON document.
``SeldonClient/<method>`` goes through seldon-core's ``SeldonClient(transport="grpc")``.
"""

import json
import sys

import grpc
import numpy as np
from google.protobuf import empty_pb2, json_format
from seldon_core.proto import prediction_pb2, prediction_pb2_grpc
from seldon_core.seldon_client import SeldonClient

#: Each service's stub class, and the message type each method takes.
REQUESTS = {
    "Predict": prediction_pb2.SeldonMessage,
    "TransformInput": prediction_pb2.SeldonMessage,
    "TransformOutput": prediction_pb2.SeldonMessage,
    "Route": prediction_pb2.SeldonMessage,
    "Aggregate": prediction_pb2.SeldonMessageList,
    "SendFeedback": prediction_pb2.Feedback,
    "Metadata": empty_pb2.Empty,
    "ModelMetadata": prediction_pb2.SeldonModelMetadataRequest,
    "GraphMetadata": empty_pb2.Empty,
}


def call(channel: grpc.Channel, method: str, request: dict) -> list:
    service, name = method.split("/")
    stub = getattr(prediction_pb2_grpc, f"{service}Stub")(channel)
    message = json_format.ParseDict(request, REQUESTS[name]())
    try:
        answer = getattr(stub, name)(message, timeout=20)
    except grpc.RpcError as exc:
        return [exc.code().name, exc.details(), None]
    return ["OK", "", json_format.MessageToDict(answer)]


def seldon_client(port: int, method: str, request: dict) -> list:
    """seldon-core's SeldonClient, the way its docs call a microservice over gRPC: ``request``
    holds ``data`` (an ndarray, sent as ``payload_type``), ``strData`` or ``jsonData``."""
    client = SeldonClient(microservice_endpoint=f"127.0.0.1:{port}")
    payload = {}
    if "data" in request:
        payload = {"data": np.array(request["data"]), "payload_type": request["payload_type"]}
    elif "strData" in request:
        payload = {"str_data": request["strData"]}
    elif "jsonData" in request:
        payload = {"json_data": request["jsonData"]}
    result = client.microservice(method=method, transport="grpc", **payload)
    if not result.success:
        return ["FAILED", result.msg, None]
    return ["OK", "", json_format.MessageToDict(result.response)]


def main(port: int) -> None:
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    grpc.channel_ready_future(channel).result(timeout=60)  # seldon-core starts it after REST
    answers = []
    for method, request in json.load(sys.stdin):
        if method.startswith("SeldonClient/"):
            answers.append(seldon_client(port, method.split("/", 1)[1], request))
        else:
            answers.append(call(channel, method, request))
    print(json.dumps(answers))


if __name__ == "__main__":
    main(int(sys.argv[1]))
