"""The ``kubernetes`` package's own client on :class:`~kubeauth.credentials.Credentials`, retried once on a 401.

Used by the device plugin (pods of its node, the node patch) and ``icl topo show node/NAME``: a call
is a function of a ``kubernetes.client.ApiClient``. The client's token is refreshed by the library
before every request (its ``refresh_api_key_hook``); when the API server still answers 401, the
credentials are loaded anew (exec plugin run again, files re-read) and the call is made once more;
a second 401 raises :class:`~kubeauth.credentials.KubeAuthError` naming the auth method and what to
check.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from kubeauth.credentials import Credentials, KubeAuthError

__all__ = ["KubeSession"]

T = TypeVar("T")


class KubeSession:
    """One ``ApiClient`` at a time, replaced when the credentials are reloaded."""

    def __init__(self, credentials: Credentials | None = None, *, api_client: Any = None) -> None:
        if credentials is None and api_client is None:
            raise ValueError("KubeSession: give credentials or an api_client")
        self.credentials = credentials
        self._client = api_client if api_client is not None else credentials.api_client()  # type: ignore[union-attr]
        self._generation = 0
        self._lock = threading.Lock()

    @classmethod
    def of(cls, api: Any) -> KubeSession:
        """``api`` itself when it is a session, else a session around a plain ``ApiClient`` (no reload)."""
        return api if isinstance(api, KubeSession) else cls(api_client=api)

    @property
    def api_client(self) -> Any:
        return self._client

    def call(self, fn: Callable[[Any], T], what: str = "API call") -> T:
        """``fn(api_client)``; on 401, reload the credentials once and call again."""
        from kubernetes.client import ApiException

        client, generation = self._client, self._generation
        try:
            return fn(client)
        except ApiException as exc:
            if exc.status != 401 or self.credentials is None:
                raise
        client = self._reloaded(generation)
        try:
            return fn(client)
        except ApiException as exc:
            if exc.status != 401:
                raise
            raise KubeAuthError(self.credentials.unauthorized(what, str(exc.reason or ""))) from None

    def _reloaded(self, generation: int) -> Any:
        """A client on freshly loaded credentials (once per 401 burst, whatever the number of threads)."""
        assert self.credentials is not None
        with self._lock:
            if self._generation == generation:
                old = self._client
                self.credentials.reload()
                self._client = self.credentials.api_client()
                self._generation += 1
                with contextlib.suppress(Exception):  # closing an old pool is best effort
                    old.close()
            return self._client

    def close(self) -> None:
        self._client.close()
