"""The Seldon style's error, apart from its adapter: the REST adapter raises and answers it, and
the gRPC services (:mod:`.grpc_service`, which the adapter imports when ``--grpc-port`` is set)
tell it apart, without either module importing the other at its top."""

from __future__ import annotations

from typing import Any

__all__ = ["SeldonError"]


class SeldonError(Exception):
    """Seldon's ``SeldonMicroserviceException``: a status code and a reason for the client."""

    def __init__(self, message: str, status: int = 400, reason: str = "MICROSERVICE_BAD_DATA"):
        super().__init__(message)
        self.message, self.status_code, self.reason = message, status, reason

    def to_dict(self) -> dict[str, Any]:
        return {"status": {"status": 1, "info": self.message, "code": -1, "reason": self.reason}}
