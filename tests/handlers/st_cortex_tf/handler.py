"""The iris request handler of Cortex's TensorFlow example, (sample, signature, metadata)
generation: the sample's keys are the model's inputs, so there is no pre_inference."""

labels = ["iris-setosa", "iris-versicolor", "iris-virginica"]


def post_inference(prediction, signature, metadata):
    label_index = int(prediction["class_ids"][0])
    return labels[label_index]
