"""early_stop.py — PyTorch Lightning's EarlyStopping rule written out (check_finite=True,
no stopping or divergence threshold), the reference the early_stop tests predict a job's
stop from, given the job's own eval values."""
import math


def lightning_stop(evals, mode, patience, min_delta):
    """`evals`: [(step, value)] in order. As Lightning's _evaluate_stopping_criteria:
    min_delta is negated for mode min, and a value improves when monitor_op(value -
    min_delta, best); a NaN or infinite value stops at once. Returns (stop step, best step,
    best value), best step 0 when none improved; None when it never stops."""
    op = (lambda a, b: a < b) if mode == "min" else (lambda a, b: a > b)
    delta = -min_delta if mode == "min" else min_delta
    best, best_step, wait = (math.inf if mode == "min" else -math.inf), 0, 0
    for step, value in evals:
        if value is None or not math.isfinite(value):
            return step, best_step, best
        if op(value - delta, best):
            best, best_step, wait = value, step, 0
        else:
            wait += 1
            if wait >= patience:
                return step, best_step, best
    return None


def stop_reason(stop, best_step, best):
    """The job's stop_reason for a stop at a finite value (docs/spec.md)."""
    return f"early_stopped at step {stop} (best {best_step} = {best:.6g})"
