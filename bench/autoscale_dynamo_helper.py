"""Run NVIDIA Dynamo's load predictors on a series; executed by ``.venv-dynamo/bin/python``
(scripts/setup_bench_dynamo.sh), never imported by the bench or the product.

stdin: ``{"predictors": [...], "warm": [counts], "series": [counts]}``: requests per
throughput interval. Each predictor is built from the planner's own default config
(``PlannerConfig()``), warmed with ``warm`` as the planner's ``warm_from_observations``
does, then for each value of ``series`` observes it and predicts the next interval, as
its PREDICT stage does once per throughput interval.

stdout (one JSON object): ``predictions`` (name -> one prediction per series value),
``failed`` (name -> why), ``seconds`` (name -> CPU seconds), ``version``.

Importing the predictors' module: ``dynamo.planner``'s package ``__init__`` imports the
planner's Kubernetes connector and performance models, which need ``aisimulate``, whose
PyPI package is a stub that downloads its wheel from NVIDIA's own index (not reachable
here). The predictors' module needs none of that: the parent packages are registered
bare (their ``__path__`` only) so that it imports alone. A predictor whose library did
not install is reported as failed with the import error.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

NEEDS = {"constant": (), "arima": ("pmdarima",), "kalman": ("filterpy.kalman",)}
NEEDS["prophet"] = ("prophet", "pandas")
LIBRARIES = ("pandas", "pmdarima", "filterpy.kalman", "prophet")


class _Missing:
    """What a library that did not import holds: any call or use raises."""

    def __init__(self, why: str) -> None:
        self._why = why

    def __call__(self, *args: object, **kwargs: object) -> Any:
        raise ImportError(self._why)

    def __getattr__(self, attr: str) -> Any:
        raise ImportError(self._why)


def _placeholder(name: str, why: str) -> types.ModuleType:
    """Stands in for a library that did not import: ``from it import X`` works (the
    predictors' module imports), any use of X raises."""
    mod = types.ModuleType(name)
    missing = _Missing(f"{name} is not installed: {why}")
    mod.__dict__["__getattr__"] = lambda attr: missing
    return mod


def _libraries() -> dict[str, str]:
    """Import each library the predictors' module imports; a placeholder for the rest."""
    broken: dict[str, str] = {}
    for name in LIBRARIES:
        try:
            importlib.import_module(name)
        except Exception as e:  # any failure is reported, not raised
            broken[name] = f"{type(e).__name__}: {e}"[:300]
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                key = ".".join(parts[:i])
                if sys.modules.get(key) is None:
                    sys.modules[key] = _placeholder(name, broken[name])
    return broken


def _predictors_module() -> tuple[Any, Any]:
    import dynamo  # type: ignore[import-not-found]

    root = next(Path(p) for p in dynamo.__path__ if (Path(p) / "planner").is_dir())
    for name in ("dynamo.planner", "dynamo.planner.core", "dynamo.planner.core.load"):
        if name not in sys.modules:
            mod = types.ModuleType(name)
            mod.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = mod
    predictors = importlib.import_module("dynamo.planner.core.load.predictors")
    config = importlib.import_module("dynamo.planner.config.planner_config")
    return predictors, config.PlannerConfig


def _run_one(factory: Any, config: Any, warm: list[float], series: list[float]) -> list[float]:
    predictor = factory(config)
    for value in warm:
        predictor.add_data_point(value)
    if hasattr(predictor, "reset_idle_skip"):
        predictor.reset_idle_skip()
    out = []
    for value in series:
        predictor.add_data_point(value)
        out.append(float(predictor.predict_next()))
    return out


def main() -> int:
    request = json.loads(sys.stdin.read())
    real_stdout = os.dup(1)
    os.dup2(2, 1)  # the libraries' logs and cmdstan's output go to stderr
    result: dict[str, Any] = {"predictions": {}, "failed": {}, "seconds": {}}
    try:
        broken = _libraries()
        predictors, planner_config = _predictors_module()
        config = planner_config()
        result["version"] = _version()
        for name in request["predictors"]:
            missing = [broken[lib] for lib in NEEDS.get(name, ()) if lib in broken]
            if name not in predictors.LOAD_PREDICTORS:
                result["failed"][name] = "not one of ai-dynamo's LOAD_PREDICTORS"
            elif missing:
                result["failed"][name] = "; ".join(missing)
            else:
                started = time.process_time()
                try:
                    series = _run_one(
                        predictors.LOAD_PREDICTORS[name], config, request["warm"], request["series"]
                    )
                    result["predictions"][name] = series
                except Exception as e:  # reported per predictor
                    result["failed"][name] = f"{type(e).__name__}: {e}"[:300]
                result["seconds"][name] = round(time.process_time() - started, 2)
    except Exception as e:  # the bench reports why
        result["error"] = f"{type(e).__name__}: {e}"[:500]
    os.write(real_stdout, (json.dumps(result) + "\n").encode())
    return 0


def _version() -> str:
    from importlib.metadata import version

    return version("ai-dynamo")


if __name__ == "__main__":
    sys.exit(main())
