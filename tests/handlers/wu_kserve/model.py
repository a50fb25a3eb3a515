"""A KServe model that records its predictions, per process, with the event loop each ran on:
a warm-up test can tell that the warm-up reached the model through the kserve style before
its process was ready, on the loop that its clients' calls run on."""

import asyncio
import os

from kserve import Model

CALLS = []


class CountingModel(Model):
    def __init__(self, name: str):
        super().__init__(name)

    def load(self):
        self.ready = True
        return self.ready

    async def predict(self, payload, headers=None):
        CALLS.append({"instances": payload["instances"], "loop": id(asyncio.get_running_loop())})
        return {"predictions": [{"pid": os.getpid(), "calls": CALLS}]}
