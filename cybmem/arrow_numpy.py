"""Arrow arrays to numpy and back through their buffers, without pyarrow's pandas shim.

pyarrow (26) turns numpy arrays, Python sequences and scalars into Arrow (``pa.array``,
``pa.scalar``, a compute call given a Python value) and Arrow into numpy (``Array.to_numpy``,
``np.asarray``) through a shim that first imports pandas when it is installed, to look for
pandas types: 0.5-1 s of a cold load that uses no pandas. These helpers read and build the
buffers themselves (``pa.Array.from_buffers``, ``np.frombuffer``), which pyarrow does without the
shim, and give what the shim's calls give, buffer for buffer: tests/test_arrow_numpy.py compares
them. The load path and search use them where a conversion would import pandas; elsewhere
``pa.array`` and ``to_numpy`` are fine.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

__all__ = ["numpy_of", "array_of", "strings", "string_lists", "scalar", "pylist"]

#: The numpy dtype of each fixed-width Arrow type ``to_numpy`` gives without a copy (timestamps
#: and durations as datetime64 / timedelta64 of their unit, as ``to_numpy`` gives them).
_NUMERIC = {pa.int8(): "i1", pa.int16(): "i2", pa.int32(): "i4", pa.int64(): "i8",
            pa.uint8(): "u1", pa.uint16(): "u2", pa.uint32(): "u4", pa.uint64(): "u8",
            pa.float32(): "f4", pa.float64(): "f8"}


def _dtype(type_: pa.DataType) -> np.dtype:
    if pa.types.is_timestamp(type_):
        return np.dtype(f"datetime64[{type_.unit}]")
    if pa.types.is_duration(type_):
        return np.dtype(f"timedelta64[{type_.unit}]")
    try:
        return np.dtype(_NUMERIC[type_])
    except KeyError:
        raise TypeError(f"no numpy view of Arrow type {type_}") from None


def _chunk(arr: pa.Array) -> np.ndarray:
    if arr.null_count:
        raise ValueError(f"an Arrow array with {arr.null_count} nulls has no numpy view")
    if pa.types.is_boolean(arr.type):
        bits = arr.buffers()[1]
        if bits is None or not len(arr):
            return np.zeros(len(arr), dtype=bool)
        unpacked = np.unpackbits(np.frombuffer(bits, np.uint8), bitorder="little")
        return unpacked[arr.offset : arr.offset + len(arr)].astype(bool)
    dtype = _dtype(arr.type)
    data = arr.buffers()[1]
    if data is None or not len(arr):
        return np.empty(0, dtype)
    view = np.frombuffer(data, dtype, count=len(arr), offset=arr.offset * dtype.itemsize)
    view.flags.writeable = False  # as to_numpy gives it: a write would change the Arrow array
    return view


def numpy_of(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``values.to_numpy()`` of a numeric, timestamp, duration or boolean array without nulls:
    a read-only view of one chunk's buffer (a copy for several chunks, and for booleans, as
    ``to_numpy`` makes).

    Raises:
        ValueError: the array holds nulls.
        TypeError: another type (strings, lists: read their buffers or ``to_pylist``).
    """
    if isinstance(values, pa.ChunkedArray):
        if values.num_chunks == 1:
            return _chunk(values.chunk(0))
        if values.num_chunks == 0:
            return np.zeros(0, bool) if pa.types.is_boolean(values.type) else np.empty(0, _dtype(values.type))
        return np.concatenate([_chunk(c) for c in values.chunks])
    return _chunk(values)


def _validity(valid: np.ndarray | None) -> tuple[pa.Buffer | None, int]:
    """The validity bitmap of a boolean mask (True: a value), and the null count."""
    if valid is None:
        return None, 0
    nulls = len(valid) - int(np.count_nonzero(valid))
    return (pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None), nulls


def array_of(values, type: pa.DataType | None = None, *, mask: np.ndarray | None = None) -> pa.Array:
    """``pa.array(values, type)`` of numeric, timestamp, duration or boolean values: a numpy
    array or a Python sequence (whose ``None`` items are nulls, as ``pa.array`` reads them).

    Args:
        values: what the array holds (a numpy array of the type's width is used as it is, zero
            copy; another width is cast by numpy's rules, which do not check for overflow).
        type: the Arrow type; for a numpy array, by default the one of its dtype.
        mask: True where the value is null (``pa.array``'s ``mask``), for numpy values.
    """
    if type is None:
        if not isinstance(values, np.ndarray):
            raise TypeError("array_of() needs the Arrow type of a Python sequence")
        type = pa.from_numpy_dtype(values.dtype)
    boolean = pa.types.is_boolean(type)
    dtype = np.dtype(bool) if boolean else _dtype(type)
    valid = None if mask is None else ~np.asarray(mask, dtype=bool)
    if not isinstance(values, np.ndarray):
        items = values if isinstance(values, (list, tuple)) else list(values)
        if any(v is None for v in items):
            valid = np.fromiter((v is not None for v in items), bool, len(items))
            items = [0 if v is None else v for v in items]
        values = np.array(items, dtype=dtype if dtype.kind not in "mM" else np.int64)
    if dtype.kind in "mM":
        values = values.view(np.int64) if values.dtype.kind in "mM" else values
        dtype = np.dtype(np.int64)
    values = np.ascontiguousarray(values, dtype=dtype)  # null slots: zeros from a sequence, as given from numpy
    bitmap, nulls = _validity(valid)
    data = np.packbits(values, bitorder="little") if boolean else values
    return pa.Array.from_buffers(type, len(values), [bitmap, pa.py_buffer(data)], null_count=nulls)


def strings(values: Sequence[str | None], type: pa.DataType = pa.string()) -> pa.Array:
    """``pa.array(values, type)`` of Python strings (``None``: null), a string or large string."""
    large = pa.types.is_large_string(type)
    if not (large or pa.types.is_string(type)):
        raise TypeError(f"strings() builds string arrays, not {type}")
    encoded = [b"" if v is None else v.encode("utf-8") for v in values]
    ends = np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)))
    if not large and len(ends) and ends[-1] > np.iinfo(np.int32).max:
        raise pa.ArrowCapacityError("more than 2 GiB of strings: build a pa.large_string() array")
    offsets = np.zeros(len(encoded) + 1, np.int64 if large else np.int32)
    offsets[1:] = ends
    bitmap, nulls = _validity(np.fromiter((v is not None for v in values), bool, len(encoded)))
    return pa.Array.from_buffers(type, len(encoded), [bitmap, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))],
                                 null_count=nulls)


def string_lists(values: Sequence[Sequence[str] | None], type: pa.DataType = pa.list_(pa.string())) -> pa.Array:
    """``pa.array(values, type)`` of lists of Python strings (``None``: a null list): a list or
    large list of strings or large strings."""
    large = pa.types.is_large_list(type)
    if not ((large or pa.types.is_list(type))
            and (pa.types.is_string(type.value_type) or pa.types.is_large_string(type.value_type))):
        raise TypeError(f"string_lists() builds lists of strings, not {type}")
    offsets = np.zeros(len(values) + 1, np.int64 if large else np.int32)
    np.cumsum(np.fromiter((0 if v is None else len(v) for v in values), np.int64, len(values)), out=offsets[1:])
    flat = strings([x for v in values if v is not None for x in v], type.value_type)
    bitmap, nulls = _validity(np.fromiter((v is not None for v in values), bool, len(values)))
    return pa.Array.from_buffers(type, len(values), [bitmap, pa.py_buffer(offsets)], null_count=nulls, children=[flat])


def scalar(value, type: pa.DataType) -> pa.Scalar:
    """``pa.scalar(value, type)`` (what a compute call is given instead of a Python value, which it
    would convert through the shim): ``None`` of any type, a value of the types above, or an
    empty list."""
    if value is None:
        return pa.nulls(1, type)[0]
    if pa.types.is_string(type) or pa.types.is_large_string(type):
        return strings([value], type)[0]
    if pa.types.is_list(type):
        if len(value):
            raise TypeError("scalar() builds empty lists only")
        return pa.ListArray.from_arrays(array_of([0, 0], pa.int32()), pa.nulls(0, type.value_type), type=type)[0]
    return array_of([value], type)[0]


_EPOCH = datetime.datetime(1970, 1, 1)
_UNIT = {"s": "seconds", "ms": "milliseconds", "us": "microseconds"}


def _zone(name: str) -> datetime.tzinfo:
    """The time zone pyarrow gives a timestamp's ``tz``: a zoneinfo zone, or a fixed offset (+HH:MM)."""
    if name[:1] in "+-" and name[1:3].isdigit():
        sign = -1 if name[0] == "-" else 1
        return datetime.timezone(sign * datetime.timedelta(hours=int(name[1:3]), minutes=int(name[-2:])))
    import zoneinfo  # lazy: only a zoned timestamp needs it

    return zoneinfo.ZoneInfo(name)


def _column_pylist(col: pa.Array | pa.ChunkedArray) -> list:
    type_ = col.type
    if not (pa.types.is_timestamp(type_) and type_.tz is not None and type_.unit in _UNIT):
        return col.to_pylist()
    # What TimestampScalar.as_py makes (epoch + delta, then the zone), whose test for pandas
    # (for nanoseconds) imports it for every zoned timestamp.
    zone, unit = _zone(type_.tz), _UNIT[type_.unit]
    return [None if v is None else (_EPOCH + datetime.timedelta(**{unit: v})).replace(tzinfo=datetime.timezone.utc).astimezone(zone)
            for v in col.cast(pa.int64()).to_pylist()]


def pylist(values: pa.Table | pa.Array | pa.ChunkedArray) -> list:
    """``values.to_pylist()`` (a table's rows as dicts), with the top-level zoned timestamps (s,
    ms, us) as the same aware datetimes, made without the shim."""
    if isinstance(values, pa.Table):
        names = values.column_names
        columns = [_column_pylist(values.column(i)) for i in range(values.num_columns)]
        return [dict(zip(names, row)) for row in zip(*columns)] if columns else [{} for _ in range(values.num_rows)]
    return _column_pylist(values)
