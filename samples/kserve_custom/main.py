# ruff: noqa: RUF013, SIM108, UP006, UP007, UP035 - KServe's docs example, kept as written
"""KServe's custom model example (docs: "Python custom serving runtime"), as written there
except that the torchvision AlexNet is replaced by a numpy stand-in that needs no download.

abeja-runtime serves the class with KServe's V1 and V2 REST protocols; ``python main.py`` still
starts KServe's own ModelServer."""

import argparse
import base64
import io
from typing import Dict, Union

import numpy as np
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer, model_server
from kserve.errors import InvalidInput
from kserve.utils.utils import generate_uuid
from PIL import Image


class AlexNetModel(Model):
    def __init__(self, name: str):
        super().__init__(name)
        self.name = name
        self.load()

    def load(self):
        # Stand-in for models.alexnet(pretrained=True): scores from the mean of each channel.
        self.model = lambda x: np.array([[*x.mean(axis=(0, 1)), x.mean(), x.std()]]) / 255.0
        # The ready flag is used by model ready endpoint for readiness probes,
        # set to True when model is loaded successfully without exceptions.
        self.ready = True

    def preprocess(
        self, payload: Union[Dict, InferRequest], headers: Dict[str, str] = None
    ) -> np.ndarray:
        if isinstance(payload, Dict) and "instances" in payload:
            headers["request-type"] = "v1"
            # Input follows the Tensorflow V1 HTTP API for binary values
            # https://www.tensorflow.org/tfx/serving/api_rest#encoding_binary_values
            data = payload["instances"][0]["image"]["b64"]
        elif isinstance(payload, InferRequest):
            infer_input = payload.inputs[0]
            if infer_input.datatype == "BYTES":
                if payload.from_grpc:
                    # If the request is from gRPC, the bytes are already decoded
                    data = infer_input.data[0]
                else:
                    # If the request is from HTTP, decode the bytes
                    data = infer_input.data[0].encode()
            else:
                data = infer_input.data[0]
        else:
            raise InvalidInput("invalid payload")

        raw_img_data = base64.b64decode(data)
        input_image = Image.open(io.BytesIO(raw_img_data)).convert("RGB")
        input_tensor = np.asarray(input_image.resize((32, 32)), dtype=np.float32)
        return input_tensor

    def predict(
        self, input_tensor: np.ndarray, headers: Dict[str, str] = None
    ) -> Union[Dict, InferResponse]:
        output = self.model(input_tensor)
        values = np.sort(output, axis=1)[:, ::-1][:, :5]
        result = values.flatten().tolist()
        response_id = generate_uuid()
        infer_output = InferOutput(
            name="output-0", shape=list(values.shape), datatype="FP32", data=result
        )
        infer_response = InferResponse(
            model_name=self.name, infer_outputs=[infer_output], response_id=response_id
        )
        if "request-type" in headers and headers["request-type"] == "v1":
            return {"predictions": result}
        else:
            return infer_response


parser = argparse.ArgumentParser(parents=[model_server.parser])
args, _ = parser.parse_known_args()

if __name__ == "__main__":
    model = AlexNetModel(args.model_name)
    model.load()
    ModelServer().start([model])
