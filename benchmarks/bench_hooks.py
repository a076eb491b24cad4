"""The agent hooks (issue 40), measured: what an agent waits for at each prompt, at a session's start
and at a turn's end, as whole processes (``cybmem hook`` with the payload on stdin).

    python benchmarks/bench_hooks.py                          # mypy's 10.2k runs, 21 rounds
    python benchmarks/bench_hooks.py --corpus sphinx-memory --rounds 11 --json out.json

- **UserPromptSubmit** on a warm store, taking turns with the import floor the warm inject is held
  to (``python -c "import numpy, pyarrow, pyarrow.ipc, typer, orjson"``; RESULTS.md, "Where issue
  31 stopped"): medians, and the ratio (target: at most 1.5x). Each round's prompt is another
  real task of the corpus (its subject line).
- **SessionStart** the same way, and the orientation's size (target: at most 1,200 characters).
- **The prompt's block**: its size over the rounds' prompts, in characters and in tokens (the
  block's own estimate, characters / 4 rounded up), and how many prompts got none.
- **Stop on a 50 MB transcript** (Claude Code's line shapes: prompts, tool calls that write files,
  their results, the request logs that make most of a long session's bytes), the last turn
  written from it (target: at most 1 s), taking turns with ``python -c pass``; and what reading
  the turn costs in process.
- **SessionEnd on the same transcript**: every turn read forward, the 20 newest written.

The stores: the corpus (benchmarks/_corpus.py unpacks it) for the prompt and the session start;
a temporary memory root for the writes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _corpus  # noqa: E402

FLOOR = "import numpy, pyarrow, pyarrow.ipc, typer, orjson"
TRANSCRIPT_MB = 50


def _run(argv: list[str], stdin: bytes, env: dict) -> tuple[float, bytes]:
    t = time.perf_counter()
    done = subprocess.run(argv, input=stdin, env=env, capture_output=True, check=True)
    took = time.perf_counter() - t
    if done.stderr:
        raise SystemExit(f"{' '.join(argv)} said: {done.stderr.decode()}")
    return took, done.stdout


def _context(out: bytes) -> str:
    return json.loads(out)["hookSpecificOutput"]["additionalContext"] if out.strip() else ""


def _tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def turns_with_floor(argv, payloads, env, floor_argv) -> tuple[list[float], list[float], list[str]]:
    """Each payload through the hook, each followed by the floor: (hook times, floor times, contexts)."""
    hook_t, floor_t, texts = [], [], []
    for payload in payloads:
        took, out = _run(argv, json.dumps(payload).encode(), env)
        hook_t.append(took)
        texts.append(_context(out))
        floor_t.append(_run(floor_argv, b"", env)[0])
    return hook_t, floor_t, texts


def prompts_of(root: Path, slug: str, n: int) -> list[str]:
    """``n`` real tasks of the store, spread over its history, as one-line prompts."""
    tasks = []
    for path in sorted((root / slug / "records").iterdir()):
        task = json.loads(path.read_bytes()).get("task") or ""
        line = next((t.strip() for t in task.splitlines() if t.strip()), "")
        if 20 <= len(line) <= 200:
            tasks.append(line)
    step = max(len(tasks) // n, 1)
    return tasks[::step][:n]


def write_transcript(path: Path, cwd: str, mb: int) -> str:
    """A Claude Code transcript of ``mb`` MB, in the client's line shapes; returns its last prompt's id."""
    def line(d: dict) -> str:
        return json.dumps(d, separators=(",", ":"))

    blob = line({"type": "api-request-blob", "sessionId": "s1", "hash": "h",
                 "message": {"role": "user", "content": [{"type": "text", "text": "context of the request " * 4000}]}})
    out, size, i = [], 0, 0
    while size < mb * 2**20:
        i += 1
        at = f"2026-12-01T{10 + i // 3600 % 10:02d}:{i // 60 % 60:02d}:{i % 60:02d}.000Z"
        rows = [
            line({"parentUuid": None, "isSidechain": False, "promptId": f"p{i}", "type": "user", "uuid": f"u{i}",
                  "timestamp": at, "cwd": cwd, "sessionId": "s1", "promptSource": "cli",
                  "message": {"role": "user", "content": f"Step {i}: rework the parser's error recovery"}}),
            line({"parentUuid": f"u{i}", "isSidechain": False, "attachment": {"type": "hook_additional_context",
                  "content": ["MEMORY ..."]}, "type": "attachment", "uuid": f"c{i}", "timestamp": at}),
            blob,
            line({"parentUuid": f"u{i}", "isSidechain": False, "type": "assistant", "uuid": f"a{i}", "timestamp": at,
                  "message": {"role": "assistant", "stop_reason": "tool_use", "content": [
                      {"type": "text", "text": "Writing the parser."},
                      {"type": "tool_use", "id": f"t{i}", "name": "Write",
                       "input": {"file_path": f"{cwd}/src/parser_{i}.py", "content": "def parse():\n    pass\n" * 600}},
                      {"type": "tool_use", "id": f"b{i}", "name": "Bash", "input": {"command": "pytest -q tests/test_parser.py"}}]}}),
            line({"parentUuid": f"a{i}", "isSidechain": False, "promptId": f"p{i}", "type": "user", "uuid": f"r{i}",
                  "timestamp": at, "toolUseResult": {"type": "create", "content": "def parse():\n    pass\n" * 600},
                  "message": {"role": "user", "content": [{"tool_use_id": f"t{i}", "type": "tool_result", "content": "ok"}]}}),
            line({"parentUuid": f"r{i}", "isSidechain": False, "type": "assistant", "uuid": f"d{i}", "timestamp": at,
                  "message": {"role": "assistant", "stop_reason": "end_turn", "content": [
                      {"type": "text", "text": f"Step {i} done.\n\nISSUES:\n- none"}]}}),
        ]
        out += rows
        size += sum(len(r) + 1 for r in rows)
    path.write_text("\n".join(out) + "\n")
    return f"p{i}"


def bench(corpus: str, rounds: int) -> dict:
    root = _corpus.ensure_corpus(corpus)
    slug = _corpus.slug_of(root)
    cwd = json.loads((root / "projects.json").read_bytes())[slug]["cwd"]
    exe = _corpus.cybmem_exe()
    env = {**os.environ, "CYBERINE_MEMORY_DIR": str(root)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    hook = [exe, "hook", "claude-code"]
    floor = [sys.executable, "-c", FLOOR]
    prompts = prompts_of(root, slug, rounds)
    records = sum(1 for _ in (root / slug / "records").iterdir())
    print(f"== {corpus}: {records:,} runs, project {slug} ({cwd}); {len(prompts)} rounds", flush=True)

    start = {"hook_event_name": "SessionStart", "session_id": "bench", "cwd": cwd, "source": "startup"}
    _run(hook, json.dumps(start).encode(), env)  # warm: the cache is built (once) before any timing
    asks = [{"hook_event_name": "UserPromptSubmit", "session_id": "bench", "cwd": cwd, "prompt_id": f"bench-{i}",
             "prompt": p} for i, p in enumerate(prompts)]
    _run(hook, json.dumps(asks[0]).encode(), env)
    prompt_t, floor_p, blocks = turns_with_floor(hook, asks, env, floor)
    start_t, floor_s, starts = turns_with_floor(hook, [start] * len(prompts), env, floor)
    sizes = [len(b) for b in blocks if b]
    out = {
        "corpus": corpus, "records": records, "rounds": len(prompts),
        "prompt_s": statistics.median(prompt_t), "floor_prompt_s": statistics.median(floor_p),
        "session_start_s": statistics.median(start_t), "floor_start_s": statistics.median(floor_s),
        "orientation_chars": len(starts[0]), "orientation_tokens": _tokens(starts[0]),
        "block_chars_median": statistics.median(sizes) if sizes else 0, "block_chars_max": max(sizes, default=0),
        "block_tokens_median": _tokens("x" * int(statistics.median(sizes))) if sizes else 0,
        "block_tokens_max": _tokens("x" * max(sizes, default=0)), "prompts_without_block": len(blocks) - len(sizes),
    }
    out["prompt_vs_floor"] = out["prompt_s"] / out["floor_prompt_s"]
    out["session_start_vs_floor"] = out["session_start_s"] / out["floor_start_s"]

    from cybmem.operations import transcripts

    with tempfile.TemporaryDirectory(prefix="bench-hooks-") as tmp:
        tmp = Path(tmp)
        transcript = tmp / "session.jsonl"
        project = str(tmp / "parser")
        last = write_transcript(transcript, project, TRANSCRIPT_MB)
        size_mb = transcript.stat().st_size / 2**20
        wenv = {**env, "CYBERINE_MEMORY_DIR": str(tmp / "memory")}
        stop = {"hook_event_name": "Stop", "session_id": "s1", "cwd": project, "transcript_path": str(transcript),
                "prompt_id": last, "last_assistant_message": "Done."}
        end = {"hook_event_name": "SessionEnd", "session_id": "s1", "cwd": project, "transcript_path": str(transcript),
               "reason": "other"}
        bare = [sys.executable, "-c", "pass"]
        _run(bare, b"", wenv)
        stop_t, bare_t, end_t = [], [], []
        for _ in range(max(rounds // 2, 3)):
            shutil.rmtree(tmp / "memory", ignore_errors=True)
            stop_t.append(_run(hook, json.dumps(stop).encode(), wenv)[0])
            bare_t.append(_run(bare, b"", wenv)[0])
            end_t.append(_run(hook, json.dumps(end).encode(), wenv)[0])
        written = len(list((tmp / "memory" / "parser" / "records").glob("*.json")))
        reads = []
        for _ in range(11):
            t = time.perf_counter()
            turn = transcripts.claude_turn(transcript, last, session_id="s1")
            reads.append(time.perf_counter() - t)
        assert turn is not None and turn.files == [f"{project}/src/parser_{last[1:]}.py"]
        t = time.perf_counter()
        every = transcripts.claude_turns(transcript, session_id="s1")
        forward = time.perf_counter() - t
    out.update({"transcript_mb": size_mb, "transcript_turns": len(every), "stop_s": statistics.median(stop_t),
                "python_bare_s": statistics.median(bare_t), "read_turn_s": statistics.median(reads),
                "session_end_s": statistics.median(end_t), "session_end_written": written, "read_all_turns_s": forward})

    print(f"  UserPromptSubmit (warm)     {out['prompt_s'] * 1e3:8.1f} ms   x{out['prompt_vs_floor']:.2f} of the import floor "
          f"({out['floor_prompt_s'] * 1e3:.1f} ms, taking turns)")
    print(f"  SessionStart                {out['session_start_s'] * 1e3:8.1f} ms   x{out['session_start_vs_floor']:.2f} of the import "
          f"floor ({out['floor_start_s'] * 1e3:.1f} ms)")
    print(f"  orientation                 {out['orientation_chars']:8d} chars  {out['orientation_tokens']} tokens (at most 1,200 chars)")
    print(f"  prompt's block              {out['block_chars_median']:8.0f} chars median, {out['block_chars_max']} max; "
          f"{out['block_tokens_median']} / {out['block_tokens_max']} tokens; {out['prompts_without_block']} of "
          f"{len(prompts)} prompts got none")
    print(f"  Stop, {size_mb:.0f} MB transcript       {out['stop_s'] * 1e3:8.1f} ms   (python -c pass {out['python_bare_s'] * 1e3:.1f} ms; "
          f"the turn read back from the end in process: {out['read_turn_s'] * 1e3:.2f} ms)")
    print(f"  SessionEnd, {size_mb:.0f} MB            {out['session_end_s'] * 1e3:8.1f} ms   ({len(every)} turns read forward "
          f"in {forward * 1e3:.0f} ms in process; the {written - 1} newest unwritten written)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default="mypy-memory", help="corpus archive name or a memory root (default mypy-memory)")
    ap.add_argument("--rounds", type=int, default=21, help="prompts (and session starts), each taking turns with the floor")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    out = bench(args.corpus, args.rounds)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
