"""A KServe model with async methods, typed inputs/outputs and a switch to become unready;
an input named ``sleep`` waits that many seconds first, one named ``fail`` raises; ``stop()``
says that it ran."""

import asyncio
import threading

from kserve import InferOutput, InferRequest, InferResponse, Model


class AsyncModel(Model):
    def __init__(self, name: str):
        super().__init__(name)

    def load(self):
        self.ready = True
        return self.ready

    def stop(self):
        print(f"model {self.name} stopped")  # KServe's teardown hook
        super().stop()

    async def preprocess(self, payload, headers=None):
        await asyncio.sleep(0)
        if isinstance(payload, InferRequest):
            return payload
        if payload.get("instances") == ["unready"]:
            self.ready = False
        return payload

    async def predict(self, payload, headers=None):
        await asyncio.sleep(0)
        if isinstance(payload, InferRequest) and payload.inputs[0].name == "sleep":
            await asyncio.sleep(float(payload.inputs[0].as_numpy()[0]))
        if isinstance(payload, InferRequest) and payload.inputs[0].name == "fail":
            raise ValueError("the model failed on purpose")
        if isinstance(payload, InferRequest):
            doubled = payload.inputs[0].as_numpy() * 2
            output = InferOutput(name="doubled", shape=list(doubled.shape), datatype="FP64")
            output.set_data_from_numpy(doubled.astype("float64"), binary_data=False)
            return InferResponse(
                response_id="r-1",
                model_name=self.name,
                infer_outputs=[output],
                # gRPC: raw outputs for raw inputs (what tritonclient sends and reads)
                use_binary_outputs=payload.use_binary_outputs,
            )
        return {"predictions": payload["instances"], "thread": threading.current_thread().name}

    def get_input_types(self):
        return [{"name": "x", "datatype": "FP64", "shape": [-1]}]

    def get_output_types(self):
        return [{"name": "doubled", "datatype": "FP64", "shape": [-1]}]
