"""The iris request handler of Cortex's TensorFlow example, first (sample, metadata)
generation, with a pre_inference that reads the serving signature it is given."""

labels = ["iris-setosa", "iris-versicolor", "iris-virginica"]


def pre_inference(sample, metadata):
    inputs = metadata["serving_default"]["inputs"]  # map<string, SignatureDef>
    return {name: [sample[name]] for name in inputs}


def post_inference(prediction, metadata):
    class_id = int(prediction["class_ids"][0])
    return {
        "class_label": labels[class_id],
        "class_index": class_id,
        "probabilities": prediction["probabilities"][0],
    }
