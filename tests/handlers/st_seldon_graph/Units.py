"""Seldon graph units from seldon-core's docs: a router, a combiner, a model that learns."""

import numpy as np


class Router:
    def route(self, features, feature_names):
        first = features.flat[0]
        if first == 99:
            return "one"  # not an int: seldon-core refuses it
        return 1 if first > 0 else 0


class Combiner:
    def aggregate(self, features_list, feature_names_list):
        return np.mean(np.array(features_list), axis=0)


class Learner:
    def __init__(self):
        self.feedback = []

    def predict(self, X, features_names):
        return {"feedback": self.feedback}

    def send_feedback(self, features, feature_names, reward, truth, routing=None):
        self.feedback.append(
            {
                "features": features.tolist(),
                "reward": reward,
                "truth": truth.tolist(),
                "routing": routing,
            }
        )
