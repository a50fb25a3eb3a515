"""The identity model, answering with seldon-core's own ``SeldonResponse``, tagged with the
releases of seldon-core and protobuf it runs with: it loads only where seldon-core is installed."""

import google.protobuf
from seldon_core.user_model import SeldonResponse
from seldon_core.version import __version__ as seldon_core_version


class Identity:
    def predict(self, X, features_names=None):
        tags = {"seldon_core": seldon_core_version, "protobuf": google.protobuf.__version__}
        return SeldonResponse(X, tags=tags)
