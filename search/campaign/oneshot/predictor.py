"""A deployment target's measured-cost predictor (``measure.predict_after``): thousands of subnets, hundreds of
measurements. Once ``predict_after`` model shapes are measured on the target, a linear model of the counted
costs (as OFA and DyNAS-T predict latency from layer costs) stands in for the measurement of the shapes not
measured yet; the subnets chosen are always measured for real (search.campaign.oneshot.evaluation.Scoring.confirm).

The model, per measured metric: y = w . [1, GMACs, M params, blocks, GMACs under each int8 precision], fitted
by ridge least squares on standardised columns, refitted as measurements come; the ridge's strength is the one
of RIDGES whose leave-one-out error on the measured shapes is least (few shapes: a strong one; many: a weak
one). Throughput is fitted as seconds per image (1 / throughput): time, not its inverse, is what adds up over
layers. Its error is reported two ways, mean absolute percentage error and Kendall's tau: leave-one-out over
the measured shapes (closed form, at the strength chosen on them), and over the chosen subnets whose predicted
cost was then measured (``Scoring.predictor_report``: predictions made before those measurements).
"""
from __future__ import annotations

import numpy as np

from qkvsearch.spaces.choices import FULL_PRECISION, PRECISION_CHOICES
from qkvsearch.spaces.keys import quant_policy

LOW = tuple(p for p in PRECISION_CHOICES if p != FULL_PRECISION)   # the precisions a policy lowers parts to
FEATURES = ("gmacs", "params_m", "depth", *(f"gmacs_{p}" for p in LOW))
INVERSE = ("throughput",)   # fitted as 1 / value
RIDGES = (1e-3, 1e-2, 1e-1, 1.0)   # per shape, on standardised columns; chosen by leave-one-out error


def features(config: dict, cost: dict) -> list[float]:
    """The counted costs a prediction reads (FEATURES, in order)."""
    policy = set(quant_policy(config).values())
    gmacs = float(cost["gmacs"])
    return [gmacs, float(cost["params_m"]), float(config.get("depth") or 0),
            *(gmacs if p in policy else 0.0 for p in LOW)]


def _fit(x: np.ndarray, y: np.ndarray, ridge: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, column means, column scales) of ridge least squares with an unpenalised intercept."""
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale == 0] = 1.0
    z = np.hstack([np.ones((len(x), 1)), (x - mean) / scale])
    penalty = ridge * len(x) * np.eye(z.shape[1])
    penalty[0, 0] = 0.0
    return np.linalg.solve(z.T @ z + penalty, z.T @ y), mean, scale


def _apply(model, x: np.ndarray) -> np.ndarray:
    w, mean, scale = model
    return np.hstack([np.ones((len(x), 1)), (x - mean) / scale]) @ w


class CostPredictor:
    """Measured shapes in, predictions out, per metric (module docstring)."""

    def __init__(self, metrics: tuple[str, ...], after: int | None):
        self.metrics, self.after = tuple(metrics), after
        self.samples: dict[str, tuple[list[float], dict]] = {}   # measured key -> (features, measured metrics)
        self._models: dict | None = None

    def add(self, key: str, config: dict, cost: dict, measured: dict) -> None:
        if key not in self.samples and all(m in measured for m in self.metrics):
            self.samples[key] = (features(config, cost), {m: float(measured[m]) for m in self.metrics})
            self._models = None

    def ready(self) -> bool:
        return self.after is not None and len(self.samples) >= max(self.after, 3)

    def predict(self, config: dict, cost: dict) -> dict[str, float]:
        if self._models is None:
            x, ys = self._arrays()
            self._models = {m: _fit(x, y, min(RIDGES, key=lambda r: _loo_error(m, x, y, r))) for m, y in ys.items()}
        row = np.array([features(config, cost)])
        return {m: _value(m, float(_apply(model, row)[0])) for m, model in self._models.items()}

    def _arrays(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        x = np.array([f for f, _ in self.samples.values()], dtype=float)
        ys = {m: np.array([_target(m, v[m]) for _, v in self.samples.values()]) for m in self.metrics}
        return x, ys

    def held_out(self) -> dict:
        """Per metric: {"shapes", "ridge", "mape", "kendall_tau"} of leave-one-out predictions of the measured
        shapes, at the ridge's strength chosen on them all; {} with fewer than three."""
        if len(self.samples) < 3:
            return {}
        x, ys = self._arrays()
        out = {}
        for m, y in ys.items():
            ridge = min(RIDGES, key=lambda r: _loo_error(m, x, y, r))
            pred = [_value(m, v) for v in _loo(x, y, ridge)]
            out[m] = {"shapes": len(x), "ridge": ridge, **agreement(pred, [_value(m, v) for v in y])}
        return out


def agreement(pred, truth) -> dict:
    """{"mape": mean absolute percentage error, "kendall_tau"} of predictions against measurements."""
    from scipy.stats import kendalltau

    pred, truth = np.asarray(pred, dtype=float), np.asarray(truth, dtype=float)
    tau = kendalltau(pred, truth).statistic if len(pred) > 1 else np.nan
    return {"mape": float(np.mean(np.abs(pred - truth) / np.abs(truth)) * 100),
            "kendall_tau": None if np.isnan(tau) else float(tau)}


def _loo(x: np.ndarray, y: np.ndarray, ridge: float) -> np.ndarray:
    """Each shape's fitted value from the fit without it, in closed form: y_i - e_i / (1 - h_ii), e the fit's
    residuals, h its hat matrix (the columns standardised over every shape)."""
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale == 0] = 1.0
    z = np.hstack([np.ones((len(x), 1)), (x - mean) / scale])
    penalty = ridge * len(x) * np.eye(z.shape[1])
    penalty[0, 0] = 0.0
    inverse = np.linalg.inv(z.T @ z + penalty)
    hat = np.einsum("ij,jk,ik->i", z, inverse, z)
    residual = y - z @ (inverse @ z.T @ y)
    return y - residual / np.maximum(1.0 - hat, 1e-9)


def _loo_error(metric: str, x: np.ndarray, y: np.ndarray, ridge: float) -> float:
    """Leave-one-out mean absolute percentage error at one ridge strength (inf with fewer than three shapes)."""
    if len(x) < 3:
        return float("inf") if ridge != RIDGES[-1] else 0.0
    truth = np.array([_value(metric, v) for v in y])
    pred = np.array([_value(metric, v) for v in _loo(x, y, ridge)])
    return float(np.mean(np.abs(pred - truth) / truth))


def _target(metric: str, value: float) -> float:
    return 1.0 / value if metric in INVERSE else value


def _value(metric: str, fitted: float) -> float:
    """A fitted value back in the metric's units; never at or below 0 (a linear fit may go there far out)."""
    fitted = max(fitted, 1e-9)
    return 1.0 / fitted if metric in INVERSE else fitted
