"""``predict_raw`` over gRPC gets the SeldonMessage itself (a protobuf message), and answers a
message of the same type, as seldon-core gives and takes them."""


class RawGrpc:
    def predict_raw(self, msg):
        answer = type(msg)()
        answer.strData = msg.strData.upper()
        answer.meta.tags["raw"].string_value = "yes"
        if msg.strData == "metric":
            metric = answer.meta.metrics.add()
            metric.key = "raw_calls"
            metric.value = 1
        return answer
