"""A KServe transformer as KServe's docs write one: preprocess and postprocess around the
remote predictor that ``--predictor_host`` names, started from its ``__main__`` block.

Each value is doubled on the way in; the answer says which protocol carried it.
"""

import argparse

import numpy as np
from kserve import (
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    Model,
    ModelServer,
    model_server,
)


class DoublingTransformer(Model):
    def __init__(self, name: str, protocol: str):
        super().__init__(name)
        self.protocol = protocol
        self.ready = True

    def preprocess(self, payload, headers=None):
        name = "x"
        if isinstance(payload, InferRequest):
            headers["request-type"] = "v2"  # answered with an InferResponse (gRPC needs one)
            name = payload.inputs[0].name  # the predictor's test model sleeps on "sleep"
            values = payload.inputs[0].as_numpy().tolist()
        else:
            values = payload["instances"]
        doubled = [2.0 * value for value in values]
        if self.protocol == "v1":
            return {"instances": doubled}
        tensor = InferInput(name=name, shape=[len(doubled)], datatype="FP64")
        tensor.set_data_from_numpy(np.array(doubled, dtype=np.float64), binary_data=False)
        return InferRequest(model_name=self.name, infer_inputs=[tensor])

    def postprocess(self, result, headers=None, response_headers=None):
        if isinstance(result, InferResponse):
            values = result.outputs[0].as_numpy().tolist()
        else:
            values = result["predictions"]
        if headers.get("request-type") == "v2":
            output = InferOutput(name="y", shape=[len(values)], datatype="FP64")
            output.set_data_from_numpy(np.array(values, dtype=np.float64), binary_data=False)
            return InferResponse(response_id="t-1", model_name=self.name, infer_outputs=[output])
        return {"predictions": values, "protocol": self.protocol}


parser = argparse.ArgumentParser(parents=[model_server.parser])
args, _ = parser.parse_known_args()

if __name__ == "__main__":
    model = DoublingTransformer(args.model_name, protocol=args.predictor_protocol)
    ModelServer().start([model])
