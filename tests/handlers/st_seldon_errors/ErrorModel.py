"""Seldon Core's custom-error example: a Flask blueprint as ``model_error_handler``."""

import flask
from flask import jsonify


class UserCustomException(Exception):
    status_code = 404

    def __init__(self, message, application_error_code, http_status_code):
        Exception.__init__(self)
        self.message = message
        if http_status_code is not None:
            self.status_code = http_status_code
        self.application_error_code = application_error_code

    def to_dict(self):
        rv = {
            "status": {
                "status": self.status_code,
                "message": self.message,
                "app_code": self.application_error_code,
            }
        }
        return rv


class ErrorModel:
    model_error_handler = flask.Blueprint("error_handlers", __name__)

    @model_error_handler.app_errorhandler(UserCustomException)
    def handleCustomError(error):
        response = jsonify(error.to_dict())
        response.status_code = error.status_code
        return response

    def predict(self, X, features_names):
        if X.size and X.flat[0] == 0:
            raise ValueError("zero is not allowed")
        if X.size and X.flat[0] < 0:
            raise UserCustomException("Test-Error-Msg", 1402, 402)
        return X
