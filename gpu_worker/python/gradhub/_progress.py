"""Progress records: one JSON object per line on stdout, exactly as gradhub-trainer prints them.

The format is services/common/contract/progress_record.h's (docs/progress-records.md):
"event" first, then "step", then the known keys in the trainer's order, "eval.<name>" keys
sorted by name; numbers with 9 significant digits (C's %.9g); NaN and infinities as null.
"""

import math
import operator
import sys
import threading

from . import _telemetry

# The keys report() may print after "step", in the order progress_record.cc prints them
# (kFieldsBeforeEval); each is (JSON key, report() argument, is an integer).
_PROGRESS_FIELDS = (
    ("totalSteps", "total_steps", True),
    ("epoch", "epoch", True),
    ("loss", "loss", False),
    ("lr", "learning_rate", False),
    ("samplesPerSecond", "samples_per_second", False),
)

# One line at a time, even when threads report at once.
_lock = threading.Lock()


def _quote(text):
    """`text` as a JSON string, escaped as QuoteJson (services/common/json_text.h) does it."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char == '"':
            out.append('\\"')
        elif char == "\\":
            out.append("\\\\")
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif char == "\t":
            out.append("\\t")
        elif code < 0x20:
            out.append("\\u%04x" % code)
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _integer(name, value, minimum=None):
    """`value` as an int (bool refused), or ValueError naming the argument."""
    if isinstance(value, bool):
        raise ValueError(f"{name}: must be an integer, not a bool")
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name}: must be an integer, not {type(value).__name__}") from None
    if minimum is not None and number < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, not {number}")
    if not -(2**63) <= number < 2**63:
        raise ValueError(f"{name}: {number} does not fit in 64 bits")
    return number


def _real(name, value):
    """`value` as a float (a tensor or numpy scalar too), or ValueError naming the argument."""
    if isinstance(value, bool):
        raise ValueError(f"{name}: must be a number, not a bool")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: must be a number, not {type(value).__name__}") from None


def _number_text(value):
    """9 significant digits, as the trainer's %.9g; JSON has no NaN or infinity: null."""
    if not math.isfinite(value):
        return "null"
    return format(value, ".9g")


def _checked(values):
    """report()'s keyword values as ints and floats, None kept; ValueError naming a wrong one.
    Each is read once: a CUDA tensor's value costs a copy from the device."""
    kinds = {argument: integer for _, argument, integer in _PROGRESS_FIELDS}
    return {argument: None if value is None
            else _integer(argument, value) if kinds[argument] else _real(argument, value)
            for argument, value in values.items()}


def _checked_metrics(metrics):
    """`metrics` as {name: float}, names non-empty strings; ValueError naming what is wrong."""
    if not isinstance(metrics, dict):
        raise ValueError(f"metrics: must be a dict of name to number, not {type(metrics).__name__}")
    for name in metrics:
        if not isinstance(name, str) or not name:
            raise ValueError(f"metrics: names must be non-empty strings, not {name!r}")
    return {name: _real(f"metrics[{name!r}]", value) for name, value in metrics.items()}


def format_progress(step, values):
    """The "progress" record for `step` (an int >= 0) and report()'s checked values."""
    parts = ['{"event":"progress","step":%d' % step]
    for key, argument, integer in _PROGRESS_FIELDS:
        value = values.get(argument)
        if value is not None:
            parts.append(",%s:%s" % (_quote(key), str(value) if integer else _number_text(value)))
    return "".join(parts) + "}"


def format_eval(step, metrics):
    """The "eval" record of checked `metrics` at `step`, names sorted."""
    parts = ['{"event":"eval","step":%d' % step]
    for name in sorted(metrics):
        parts.append(",%s:%s" % (_quote("eval." + name), _number_text(metrics[name])))
    return "".join(parts) + "}"


def report(step, loss=None, *, metrics=None, epoch=None, learning_rate=None,
           samples_per_second=None, total_steps=None):
    """Prints the progress record of `step` (and with `metrics` an eval record) and flushes;
    with GRADHUB_METRICS_URL set, also queues the step as telemetry (_telemetry.py)."""
    step = _integer("step", step, minimum=0)
    values = _checked({"loss": loss, "epoch": epoch, "learning_rate": learning_rate,
                       "samples_per_second": samples_per_second, "total_steps": total_steps})
    lines = [format_progress(step, values)]
    if metrics is not None:
        metrics = _checked_metrics(metrics)
        lines.append(format_eval(step, metrics))
    text = "".join(line + "\n" for line in lines)
    with _lock:
        sys.stdout.write(text)
        sys.stdout.flush()
    _telemetry.record(step, values, metrics)
