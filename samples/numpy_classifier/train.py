"""Train the sample's softmax regression and save it as ``model.npz`` in the result directory.

Run it like a training job: ``python train.py`` writes
``$ABEJA_TRAINING_RESULT_DIR/model.npz`` (default ``abejainc_training_result/``). The data are
drawn around the per-class means of the iris measurements, so no data set is downloaded.
"""

import os

import numpy as np

LABELS = ["setosa", "versicolor", "virginica"]
# Per-class mean and standard deviation of sepal length/width, petal length/width (cm).
MEANS = np.array([[5.01, 3.43, 1.46, 0.25], [5.94, 2.77, 4.26, 1.33], [6.59, 2.97, 5.55, 2.03]])
STDS = np.array([[0.35, 0.38, 0.17, 0.11], [0.52, 0.31, 0.47, 0.20], [0.64, 0.32, 0.55, 0.27]])


def make_data(rng, per_class=200):
    x = np.concatenate(
        [rng.normal(m, s, size=(per_class, 4)) for m, s in zip(MEANS, STDS, strict=True)]
    )
    y = np.repeat(np.arange(len(LABELS)), per_class)
    return x, y


def train(x, y, epochs=500, rate=0.5):
    mean, scale = x.mean(axis=0), x.std(axis=0)
    z = (x - mean) / scale
    onehot = np.eye(len(LABELS))[y]
    weights = np.zeros((x.shape[1], len(LABELS)))
    bias = np.zeros(len(LABELS))
    for _ in range(epochs):
        logits = z @ weights + bias
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        grad = (p - onehot) / len(x)
        weights -= rate * z.T @ grad
        bias -= rate * grad.sum(axis=0)
    return weights, bias, mean, scale


def main():
    rng = np.random.default_rng(0)
    x, y = make_data(rng)
    weights, bias, mean, scale = train(x, y)
    accuracy = (((x - mean) / scale @ weights + bias).argmax(axis=1) == y).mean()
    out_dir = os.environ.get("ABEJA_TRAINING_RESULT_DIR", "abejainc_training_result")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "model.npz")
    np.savez(path, weights=weights, bias=bias, mean=mean, scale=scale, labels=np.array(LABELS))
    print(f"training accuracy {accuracy:.3f}; saved {path}")


if __name__ == "__main__":
    main()
