"""A Seldon component that takes constructor parameters (PREDICTIVE_UNIT_PARAMETERS)."""


class Scaler:
    def __init__(self, factor, label="none", enabled=False, count=0):
        self.values = {"factor": factor, "label": label, "enabled": enabled, "count": count}

    def predict(self, X, features_names):
        return {
            "values": self.values,
            "types": {name: type(value).__name__ for name, value in self.values.items()},
        }

    def init_metadata(self):
        return {"name": "scaler", "versions": ["v2"]}
