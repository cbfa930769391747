"""Tier pools on Ray Serve: fast, standard, flex and Spark pools of fastmode engines behind one ingress.

`build_app(...)` makes the Ray Serve application (for `serve.run`, `serve run`
and KubeRay: `fastmode.ray:app_builder`); `fastmode serve --ray --pools ...`
runs it from the command line. See docs/scale-out.md.

Ray is an optional extra (`pip install fastmode[ray]`): importing this package
imports nothing of Ray; `build_app` and `app_builder` import it when called,
and the single-machine server never does.
"""

from __future__ import annotations

from typing import Any

__all__ = ["app_builder", "build_app"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from fastmode.ray import deployments

        return getattr(deployments, name)
    raise AttributeError(f"module 'fastmode.ray' has no attribute {name!r}")
