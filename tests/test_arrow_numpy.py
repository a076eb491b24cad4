"""cybmem/arrow_numpy.py: Arrow arrays to numpy and back through their buffers give what pyarrow's own
conversions give (value for value, and byte for byte once written as Arrow IPC, as the cache
writes them); and a load and a search in a fresh interpreter import no pandas."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from cybmem.arrow_numpy import array_of, numpy_of, pylist, scalar, string_lists, strings

TS = pa.timestamp("ms", tz="UTC")
NUMERIC = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64(),
           pa.float32(), pa.float64()]


def _ipc(arr: pa.Array) -> bytes:
    """The bytes of ``arr`` as one column of an Arrow IPC file (what the cache holds)."""
    sink = pa.BufferOutputStream()
    batch = pa.RecordBatch.from_arrays([arr], names=["x"])
    with ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _same(ours: pa.Array, theirs: pa.Array) -> None:
    assert ours.type == theirs.type
    assert ours.equals(theirs)
    assert ours.null_count == theirs.null_count
    assert _ipc(ours) == _ipc(theirs)


def _values(type_: pa.DataType, n: int = 11) -> list:
    if pa.types.is_floating(type_):
        return [i * 1.5 - 3 for i in range(n)]
    if pa.types.is_timestamp(type_) or pa.types.is_duration(type_):
        return [1_761_955_200_000 + i * 60_000 for i in range(n)]
    hi = 100 if type_.bit_width == 8 else 30_000
    return [(i * 7) % hi if pa.types.is_unsigned_integer(type_) else (i * 7) % hi - hi // 2 for i in range(n)]


# --- numpy_of: to_numpy() ------------------------------------------------------------------------


@pytest.mark.parametrize("type_", NUMERIC + [TS, pa.timestamp("us"), pa.duration("ms"), pa.bool_()], ids=str)
def test_numpy_of_is_to_numpy_plain_sliced_chunked_and_empty(type_):
    values = [i % 3 == 0 for i in range(11)] if pa.types.is_boolean(type_) else _values(type_)
    arr = pa.array(values, type_)
    cases = [arr, arr.slice(3, 5), arr.slice(11), arr.slice(0, 0), pa.array([], type_),
             pa.chunked_array([arr.slice(0, 4), arr.slice(4)]), pa.chunked_array([arr.slice(2, 6)]),
             pa.chunked_array([], type_), pa.chunked_array([arr.slice(0, 0), arr.slice(0, 0)])]
    for case in cases:
        ours = numpy_of(case)
        theirs = case.to_numpy(zero_copy_only=False) if isinstance(case, pa.Array) else case.to_numpy()
        assert ours.dtype == theirs.dtype, case
        np.testing.assert_array_equal(ours, theirs)
        assert ours.flags.writeable or not theirs.flags.writeable  # writable where to_numpy's is: code may write into it


def test_numpy_of_a_slice_of_bits_not_on_a_byte_boundary():
    arr = pa.array([True, False, True, True, False, False, True, False, True, True, False] * 3)
    for start in range(9):
        np.testing.assert_array_equal(numpy_of(arr.slice(start, 13)), arr.slice(start, 13).to_numpy(zero_copy_only=False))


def test_numpy_of_one_chunk_is_a_view_of_its_buffer():
    arr = pa.array(np.arange(10, dtype=np.int64))
    view = numpy_of(arr.slice(2, 5))
    assert not view.flags.writeable
    assert view.__array_interface__["data"][0] == arr.buffers()[1].address + 2 * 8


@pytest.mark.parametrize("case", [pa.array([1, None], pa.int64()), pa.chunked_array([[1], [None]], pa.int64()),
                                  pa.array([True, None])], ids=["array", "chunked", "bool"])
def test_numpy_of_refuses_nulls(case):
    with pytest.raises(ValueError, match="nulls"):
        numpy_of(case)


@pytest.mark.parametrize("case", [pa.array(["a"]), pa.array([["a"]]), pa.array([1.0], pa.float16())], ids=str)
def test_numpy_of_refuses_what_is_no_fixed_width_number(case):
    with pytest.raises(TypeError):
        numpy_of(case)


# --- array_of, strings, string_lists: pa.array() ---------------------------------------------------


@pytest.mark.parametrize("type_", NUMERIC + [TS, pa.timestamp("us"), pa.duration("ms")], ids=str)
def test_array_of_python_values_and_nulls_is_pa_array(type_):
    values = _values(type_)
    with_nulls = [None if i % 4 == 1 else v for i, v in enumerate(values)]
    for case in (values, with_nulls, [None, None], [], tuple(values), iter(with_nulls)):
        listed = list(case) if not isinstance(case, (list, tuple)) else case
        ours = array_of(iter(listed) if not isinstance(case, (list, tuple)) else case, type_)
        _same(ours, pa.array(listed, type_))


@pytest.mark.parametrize("type_", NUMERIC, ids=str)
def test_array_of_numpy_values_is_pa_array(type_):
    values = np.array(_values(type_), dtype=type_.to_pandas_dtype())
    _same(array_of(values, type_), pa.array(values, type_))
    _same(array_of(values), pa.array(values))  # the type of the dtype
    _same(array_of(values[::2], type_), pa.array(values[::2], type_))  # strided: copied contiguous
    _same(array_of(values[:0], type_), pa.array(values[:0], type_))
    mask = np.arange(len(values)) % 3 == 0
    _same(array_of(values, type_, mask=mask), pa.array(values, type_, mask=mask))


def test_array_of_numpy_values_is_zero_copy():
    values = np.arange(8, dtype=np.int64)
    assert array_of(values).buffers()[1].address == values.ctypes.data


def test_array_of_timestamps_from_datetime64_and_int64():
    values = np.array([1_761_955_200_000, 0, 5], dtype="datetime64[ms]")
    _same(array_of(values, TS), pa.array(values.astype(np.int64), pa.int64()).cast(TS))
    _same(array_of(values), pa.array(values))


def test_array_of_booleans_is_pa_array():
    for values in ([True, False, True] * 5, [True, None, False, None], [], [None]):
        _same(array_of(values, pa.bool_()), pa.array(values, pa.bool_()))
    bits = np.array([i % 3 == 0 for i in range(19)])
    _same(array_of(bits, pa.bool_()), pa.array(bits))
    _same(array_of(bits), pa.array(bits))
    _same(array_of(bits[::2]), pa.array(bits[::2]))


def test_array_of_a_python_sequence_needs_its_type():
    with pytest.raises(TypeError):
        array_of([1, 2])


@pytest.mark.parametrize("type_", [pa.string(), pa.large_string()], ids=str)
def test_strings_is_pa_array(type_):
    for values in (["a", "bc", "", "é ü 🚀", "x" * 300], ["a", None, "", None], [None], [], [""] * 3):
        _same(strings(values, type_), pa.array(values, type_))


def test_strings_refuses_other_types_and_lone_surrogates():
    with pytest.raises(TypeError):
        strings(["a"], pa.binary())
    with pytest.raises(UnicodeEncodeError):
        strings(["\ud800"])


@pytest.mark.parametrize("type_", [pa.list_(pa.string()), pa.large_list(pa.string()), pa.large_list(pa.large_string())],
                         ids=str)
def test_string_lists_is_pa_array(type_):
    for values in ([["a", "b"], [], ["é"], ["", "c"]], [["a"], None, [], None], [[]], [], [None], [["x"] * 40] * 3):
        _same(string_lists(values, type_), pa.array(values, type_))


def test_string_lists_refuses_other_lists():
    with pytest.raises(TypeError):
        string_lists([[1]], pa.list_(pa.int64()))


def test_scalar_is_pa_scalar():
    cases = [(None, pa.string()), (None, TS), (None, pa.int64()), ("", pa.string()), ("é", pa.large_string()),
             (0, pa.int32()), (-1, pa.int64()), (2**63, pa.uint64()), (1.5, pa.float32()), (False, pa.bool_()),
             (1_761_955_200_000, TS), ([], pa.list_(pa.string())),
             ([], pa.list_(pa.struct([("agentId", pa.string()), ("state", pa.string())])))]
    for value, type_ in cases:
        ours, theirs = scalar(value, type_), pa.scalar(value, type_)
        assert ours.type == theirs.type and ours.equals(theirs) and ours.is_valid == theirs.is_valid, (value, type_)
    with pytest.raises(TypeError):
        scalar(["a"], pa.list_(pa.string()))


# --- pylist: to_pylist() ------------------------------------------------------------------------


@pytest.mark.parametrize("tz", ["UTC", "Europe/Paris", "+05:30", "-03:00"])
@pytest.mark.parametrize("unit", ["s", "ms", "us"])
def test_pylist_of_zoned_timestamps_is_to_pylist(tz, unit):
    type_ = pa.timestamp(unit, tz=tz)
    ints = [0, 1_761_955_200, None, 1_700_000_000, -86_400]
    arr = pa.array(ints, pa.int64()).cast(type_)
    for case in (arr, arr.slice(1, 3), pa.chunked_array([arr.slice(0, 2), arr.slice(2)]), arr.slice(0, 0)):
        ours, theirs = pylist(case), case.to_pylist()
        assert ours == theirs
        assert [repr(v) for v in ours] == [repr(v) for v in theirs]  # the same tzinfo objects too


def test_pylist_of_a_table_is_to_pylist():
    table = pa.table({"runId": ["a", None, "c"], "endedAt": pa.array([1, None, 3], pa.int64()).cast(TS),
                      "issues": [["x"], [], None], "n": [1, 2, None], "naive": pa.array([1, 2, 3], pa.timestamp("ms"))})
    for case in (table, table.slice(1), table.select(["n"]), table.select([]), table.slice(0, 0)):
        ours, theirs = pylist(case), case.to_pylist()
        assert ours == theirs and [repr(r) for r in ours] == [repr(r) for r in theirs]
    assert isinstance(pylist(table)[0]["endedAt"], datetime.datetime)


# --- no pandas, in a fresh interpreter -------------------------------------------------------------

_FRESH = textwrap.dedent("""
    import json, os, shutil, sys
    root = sys.argv[1]
    os.environ["CYBERINE_MEMORY_DIR"] = root
    from cybmem.store import arrow_records
    from cybmem.store.loading import holding_snapshots, load_snapshot
    from cybmem.store.memory_store import MemoryStore
    from cybmem.retrieval.filters import RecordFilter
    from cybmem.settings import Settings
    from cybmem.retrieval.search import search

    settings = Settings.from_env()
    seen = []
    for slug, bulk in (("web", False), ("api", True)):
        arrow_records._BULK_MIN = 1 if bulk else 256  # "api": Arrow's JSON reader path, as for a large store
        store = MemoryStore(root, slug)
        cold = load_snapshot(store)
        warm = load_snapshot(store)
        assert cold.parsed and not warm.parsed and warm.from_cache, (cold.parsed, warm.parsed)
        hits = search(warm, "fix the flaky test", k=5, settings=settings)
        seen.append((slug, "load and search", "pandas" in sys.modules))
        # A record and a ledger line added, then loaded again (the cache refreshed), and searches
        # with every option dispatch and the read commands use.
        first = sorted(store.records_dir.iterdir())[0]
        record = json.loads(first.read_text())
        new_id = "ffffffff-0000-4000-8000-00000000000" + str(int(bulk))
        record.update(runId=new_id, lineage={"rootRunId": new_id, "parentRunId": record["runId"]})
        record["outcome"]["issues"] = ["a-new-issue"]
        (store.records_dir / (new_id + ".json")).write_text(json.dumps(record))
        with open(store.issues_path, "a") as f:
            f.write(json.dumps({"issueId": "a-new-issue", "at": record["endedAt"], "event": "opened",
                                "byRunId": new_id, "title": "A new issue"}) + "\\n")
        with holding_snapshots():
            snap = load_snapshot(store)
            assert snap.parsed == 1, snap.parsed
            search(snap, "fix the flaky test", k=5, parent_run_id=record["runId"][:8], chat_session_id="c",
                   exclude=new_id, evidence=True, pin_parent=True, settings=settings)
            search(snap, "a new issue", k=3, offset=1, as_of=record["endedAt"], settings=settings)
            search(snap, "a new issue", filter=RecordFilter(since=1, states=("done", "error"), grep="fix",
                                                              agent="impl-1", issue="a-new-issue"), settings=settings)
            snap.open_issues()
        seen.append((slug, "refresh and searches", "pandas" in sys.modules))
    print(json.dumps(seen))
""")


def test_a_load_and_a_search_in_a_fresh_interpreter_import_no_pandas(fixture_copy):
    """Cold and warm loads of a copy of the fixtures (both ways of parsing records), a refresh after a
    write, and searches, in a fresh interpreter without the console script's refusal of pandas
    (cybmem/cli/_startup.py): pyarrow would import pandas, installed here, on its first conversion."""
    import importlib.util

    assert importlib.util.find_spec("pandas") is not None, "the test means something only with pandas installed"
    (fixture_copy / ".nocache").unlink()
    p = subprocess.run([sys.executable, "-c", _FRESH, str(fixture_copy)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "CYBERINE_MEMORY_DIR": str(fixture_copy)})
    assert p.returncode == 0, p.stderr
    seen = json.loads(p.stdout)
    assert [s[:2] for s in seen] == [["web", "load and search"], ["web", "refresh and searches"],
                                     ["api", "load and search"], ["api", "refresh and searches"]]
    assert not [s for s in seen if s[2]], f"pandas was imported: {seen}"
