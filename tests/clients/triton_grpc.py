"""tritonclient's gRPC client against a runtime: ``python triton_grpc.py HOST:PORT MODEL``.

A separate process: tritonclient and kserve each register the Open Inference ``.proto`` in
protobuf's default pool, so one process cannot import both. Prints one JSON document.
"""

import json
import sys

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


def tensor(name: str, values: list[float]) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [len(values)], "FP64")
    tensor.set_data_from_numpy(np.array(values, dtype=np.float64))  # raw_input_contents
    return tensor


def error(call) -> dict:
    try:
        call()
    except InferenceServerException as exc:
        return {"status": exc.status(), "message": exc.message()}
    return {}


def main(url: str, model: str) -> None:
    client = grpcclient.InferenceServerClient(url=url)
    metadata = client.get_model_metadata(model, as_json=True)
    result = client.infer(model, [tensor("x", [1.0, 2.5, -3.0])], request_id="req-7")
    answer = {
        "live": client.is_server_live(),
        "ready": client.is_server_ready(),
        "model_ready": client.is_model_ready(model),
        "server_metadata": client.get_server_metadata(as_json=True),
        "model_metadata": metadata,
        "response": result.get_response(as_json=True),
        "doubled": result.as_numpy("doubled").tolist(),
        "unknown_model": error(lambda: client.infer("no-such-model", [tensor("x", [1.0])])),
        "model_error": error(lambda: client.infer(model, [tensor("fail", [1.0])])),
    }
    client.close()
    print(json.dumps(answer))


if __name__ == "__main__":
    main(*sys.argv[1:3])
