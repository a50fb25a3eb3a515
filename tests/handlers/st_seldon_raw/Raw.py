"""predict_raw gets the request message as it came, and answers a message of its own."""


class SeldonNotImplementedError(Exception):
    """As seldon_core's: raised by a method the component does not really implement."""


class Raw:
    def predict_raw(self, msg):
        if "jsonData" in msg and msg["jsonData"].get("fallback"):
            raise SeldonNotImplementedError("predict_raw is not implemented")
        if "jsonData" in msg and msg["jsonData"].get("metric"):
            metric = {"type": "COUNTER", "key": "raw_calls", "value": 1}
            return {"data": {"ndarray": [[1]]}, "meta": {"metrics": [metric]}}
        if "jsonData" in msg and "code" in msg["jsonData"]:
            return {"status": {"code": msg["jsonData"]["code"], "info": "custom"}}
        return {"data": {"ndarray": [[len(msg)]]}, "meta": {"raw": True}}

    def predict(self, X, features_names):
        return {"fallback": True}
