"""Train the cold-start benchmark's model: a random forest of 100 trees on 20 synthetic features
(a few MiB, a load of a fraction of a second), written to ``model.joblib`` beside this file."""

from pathlib import Path

import joblib
from sklearn.datasets import make_classification
from sklearn.ensemble import RandomForestClassifier

features, labels = make_classification(n_samples=5000, n_features=20, random_state=0)
model = RandomForestClassifier(n_estimators=100, random_state=0).fit(features, labels)
joblib.dump(model, Path(__file__).with_name("model.joblib"))
