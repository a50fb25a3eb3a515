"""Build a tiny iris SavedModel as Cortex's TensorFlow examples had: one input per feature,
``class_ids`` and ``probabilities`` out. No training: petal length alone decides (setosa below
3 cm, virginica above 5.25 cm), as in ``samples/cortex_iris``.

    python build_saved_model.py DIR
"""

import sys

import tensorflow as tf

FEATURES = ("sepal_length", "sepal_width", "petal_length", "petal_width")


class Iris(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name=f) for f in FEATURES])
    def serve(self, sepal_length, sepal_width, petal_length, petal_width):
        logits = tf.stack(
            [6.0 - 2.0 * petal_length, 0.0 * petal_length, 2.0 * petal_length - 10.5], axis=1
        )
        return {
            "class_ids": tf.argmax(logits, axis=1),
            "probabilities": tf.nn.softmax(logits, axis=1),
        }


if __name__ == "__main__":
    model = Iris()
    tf.saved_model.save(model, sys.argv[1], signatures={"serving_default": model.serve})
