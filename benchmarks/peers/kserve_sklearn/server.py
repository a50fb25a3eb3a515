"""KServe's model server (``kserve.ModelServer``) serving the cold-start benchmark's scikit-learn
model, as KServe's sklearnserver does: ``joblib.load`` in ``load()``, ``predict`` on the v1
protocol's ``instances``. It prints one JSON line with when (seconds since the epoch) its imports
were done and its model loaded, for the benchmark's split."""

import json
import time

import joblib
import kserve


class SKLearnModel(kserve.Model):
    def load(self) -> bool:
        self.model = joblib.load("/srv/model/model.joblib")
        self.ready = True
        return self.ready

    def predict(self, payload, headers=None):
        return {"predictions": self.model.predict(payload["instances"]).tolist()}


if __name__ == "__main__":
    imported_at = time.time()
    model = SKLearnModel("model")
    model.load()
    print(json.dumps({"imported_at": imported_at, "loaded_at": time.time()}), flush=True)
    kserve.ModelServer(workers=1).start([model])
