"""The ADD-only distillation client: which chat model refines a new record's outcome
(:class:`DistillConfig`, from what :class:`~cybmem.settings.Settings` read: ``CYBERINE_MEMORY_MODEL``,
``ollama:<model>`` or a model name, and its ``_KEY``, ``_URL`` and ``_TIMEOUT`` companions), the
prompt (the run trimmed, secrets redacted, the extractive outcome as a draft), one call
(:mod:`cybmem.clients.http_json`) and the strict parser of its reply. The model only ever refines
the outcome of the NEW record (Mem0's lesson); nothing here reads or changes stored records.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import ValidationError
from ..settings import MODEL_TIMEOUT, DistillSettings
from .http_json import CONNECT_TIMEOUT, RemoteError, deadline_client, one_line, post_json

if TYPE_CHECKING:  # pragma: no cover - httpx is imported when a request is made
    import httpx

__all__ = ["DistillConfig", "MAX_CHAT_REPLY_BYTES", "distill", "distill_config", "parse_outcome"]

# A chat reply is one message of at most ~1k tokens (num_predict) plus its envelope; servers
# that add reasoning text stay far below this.
MAX_CHAT_REPLY_BYTES = 4 * 1024 * 1024
# Distilled outcome limits: one-line items, short lists, a summary of a few sentences.
MAX_ITEMS = 8
MAX_ITEM_CHARS = 300
MAX_SUMMARY_CHARS = 1000
# The prompt: a coding run's answers can be huge; ~12k characters is ~3k tokens.
_TASK_CHARS = 3000
_ANSWERS_CHARS = 8000
_MAX_ANSWERS = 4


@dataclass(frozen=True)
class DistillConfig:
    """Which chat model refines a new record's outcome; ``distill_config(settings.distill)`` builds one.

    ``timeout`` is the whole budget of the call (both attempts, wall-clock).
    """

    kind: str  # "ollama" | "openai"
    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    timeout: float = MODEL_TIMEOUT
    connect_timeout: float = CONNECT_TIMEOUT
    attempts: int = 2  # one call is slow and costs money: one retry covers a blip
    backoff: float = 1.0
    redact: bool = True  # redact secrets (cybmem.store.secrets) from the prompt before it leaves

    @property
    def url(self) -> str:
        """The endpoint every request goes to."""
        return self.base_url + ("/api/chat" if self.kind == "ollama" else "/chat/completions")


def distill_config(configured: DistillSettings) -> DistillConfig | None:
    """The distillation configuration, or None when CYBERINE_MEMORY_MODEL is unset (no default).

    Args:
        configured: ``settings.distill`` (:class:`~cybmem.settings.DistillSettings`, which read and
            checked the variables).

    Raises:
        ValidationError: a value is malformed, or api.openai.com is the target and no key is set
            (``configured.problem``).
    """
    if not configured.on:
        return None
    if configured.problem:
        raise ValidationError(configured.problem)
    return DistillConfig(kind=configured.kind, base_url=configured.base_url, model=configured.model_name,
                         api_key=configured.key if configured.kind == "openai" else None, timeout=configured.timeout,
                         redact=configured.redact)


_SYSTEM = f"""You condense one finished coding-agent run into its outcome, for a long-term memory.
Reply with one JSON object and nothing else (no prose, no code fences), with exactly these keys:
{{"summary": "...", "accomplished": ["..."], "issues": ["..."], "next": ["..."]}}
- summary: 2 to 4 plain sentences: what was attempted and what actually happened, failures included.
- accomplished: concrete results that were actually achieved, e.g. "fixed X in Y".
- issues: problems that are still open, each written "Short title: detail".
- next: recommended next steps.
Each list has at most {MAX_ITEMS} items, each item one line; use [] for an empty list.
Use only facts from the run below; never invent files, results or numbers.
A draft outcome extracted mechanically is given at the end: correct and complete it."""

_FENCED = re.compile(r"\A```[A-Za-z]*[ \t]*\n(.*)\n[ \t]*```\Z", re.DOTALL)
_BULLET = re.compile(r"\A(?:[-*•]|\d{1,3}[.)])\s+")
_NONE_ITEM = re.compile(r"\A\(?(?:none|n/a|nothing|-)\)?\.?\Z", re.IGNORECASE)


def _first(d: Mapping, *keys: str) -> Any:
    for key in keys:
        if d.get(key) is not None:
            return d[key]
    return None


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    return ""


def _clip(text: str, limit: int) -> str:
    """Cut the middle out of a long text: answers put their conclusions (the trailer) at the end."""
    text = text.strip()
    if len(text) <= limit:
        return text
    head = limit * 2 // 5
    tail = limit - head
    return f"{text[:head].rstrip()}\n[... {len(text) - limit} characters cut ...]\n{text[-tail:].lstrip()}"


def _answers(run: Mapping) -> list[tuple[str, str]]:
    """(label, text) of the winning answer (if given) and the workers' final answers."""
    answers: list[tuple[str, str]] = []
    winner = _text(_first(run, "winnerOutput", "winner_output"))
    if winner.strip():
        answers.append(("winning answer", winner))
    workers = run.get("workers")
    for i, worker in enumerate(workers if isinstance(workers, list) else []):
        if not isinstance(worker, Mapping):
            continue
        text = _text(_first(worker, "output", "finalText", "finalAnswer", "answer", "text", "result"))
        if not text.strip() or any(text == seen for _, seen in answers):
            continue
        name = _first(worker, "agentId", "id")
        state = _first(worker, "state", "status")
        label = f"worker {name if isinstance(name, str) else i + 1}" + (f" ({state})" if isinstance(state, str) else "")
        answers.append((label, text))
    return answers[:_MAX_ANSWERS]


def _prompt(run: Mapping, extractive: Mapping) -> str:
    """The user message: the run, trimmed to ~12k characters, and the extractive draft."""
    parts = [f"TASK:\n{_clip(_text(_first(run, 'task', 'prompt')), _TASK_CHARS) or '(none)'}"]
    workflow = _first(run, "workflowName", "workflow_name")
    if isinstance(workflow, str):
        parts.append(f"WORKFLOW: {workflow}")
    state = _first(run, "state", "status")
    parts.append(f"FINAL STATE: {state if isinstance(state, str) else 'unknown'}")
    verdict = _first(run, "verdictSummary", "verdict")
    if isinstance(verdict, Mapping):
        verdict = _first(verdict, "summary", "reason", "verdict")
    if isinstance(verdict, str) and verdict.strip():
        parts.append(f"JUDGE VERDICT: {one_line(verdict, 500)}")
    answers = _answers(run)
    if answers:
        share = _ANSWERS_CHARS // len(answers)
        parts.append("FINAL ANSWERS:\n" + "\n\n".join(f"--- {label} ---\n{_clip(text, share)}" for label, text in answers))
    else:
        parts.append("FINAL ANSWERS: (none)")
    draft = {key: extractive.get(key) for key in ("summary", "accomplished", "issues", "next") if key in extractive}
    parts.append("DRAFT OUTCOME:\n" + json.dumps(draft, ensure_ascii=False, default=str))
    return "\n\n".join(parts)


def _items(value: Any, key: str) -> list[str]:
    if not isinstance(value, list):
        raise RemoteError(f"distilled outcome: \"{key}\" is a {type(value).__name__}, not a list of strings; the extractive outcome is kept")
    items: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise RemoteError(f"distilled outcome: {key}[{i}] is a {type(item).__name__}, not a string; the extractive outcome is kept")
        item = item.strip()
        if "\n" in item or "\r" in item:
            raise RemoteError(f"distilled outcome: {key}[{i}] spans several lines; the extractive outcome is kept")
        item = _BULLET.sub("", " ".join(item.split()))
        if not item or _NONE_ITEM.match(item):
            continue
        if len(item) > MAX_ITEM_CHARS:
            item = item[: MAX_ITEM_CHARS - 1].rstrip() + "…"
        if item not in items:
            items.append(item)
    return items[:MAX_ITEMS]


def parse_outcome(text: str) -> dict:
    """Strictly parse a model's reply into ``{"summary", "accomplished", "issues", "next"}``.

    The reply must be one JSON object (a single code fence around it is tolerated) with the
    four keys: summary a non-empty string, the others lists of one-line strings. Strings are
    trimmed, bullets and "none" items dropped, lists cut to MAX_ITEMS, items to MAX_ITEM_CHARS.
    Other keys are ignored.

    Raises:
        RemoteError: anything else, with a one-line reason.
    """
    if not isinstance(text, str) or not text.strip():
        raise RemoteError("distilled outcome: the model's reply is empty; the extractive outcome is kept")
    body = text.strip()
    fenced = _FENCED.match(body)
    if fenced:
        body = fenced.group(1).strip()
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RemoteError(f"distilled outcome: the model's reply is not JSON ({one_line(str(exc), 80)}); the extractive outcome is kept") from None
    if not isinstance(data, dict):
        raise RemoteError(f"distilled outcome: the reply is a JSON {type(data).__name__}, not an object; the extractive outcome is kept")
    missing = [key for key in ("summary", "accomplished", "issues", "next") if key not in data]
    if missing:
        raise RemoteError(f"distilled outcome: the reply lacks {', '.join(missing)}; the extractive outcome is kept")
    summary = data["summary"]
    if not isinstance(summary, str) or not summary.strip():
        raise RemoteError("distilled outcome: \"summary\" is not a non-empty string; the extractive outcome is kept")
    summary = " ".join(summary.split())
    if len(summary) > MAX_SUMMARY_CHARS:
        summary = summary[: MAX_SUMMARY_CHARS - 1].rstrip() + "…"
    return {
        "summary": summary,
        "accomplished": _items(data["accomplished"], "accomplished"),
        "issues": _items(data["issues"], "issues"),
        "next": _items(data["next"], "next"),
    }


def _reply_text(data: Any, kind: str, url: str) -> str:
    """The assistant message's content from an Ollama or OpenAI chat reply."""
    where = f"chat reply from {url}"
    if not isinstance(data, Mapping):
        raise RemoteError(f"{where} is a JSON {type(data).__name__}, not an object")
    if kind == "ollama":
        message, finish = data.get("message"), data.get("done_reason")
    else:
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
            raise RemoteError(f"{where} has no choices; is it an OpenAI-compatible /chat/completions endpoint?")
        message, finish = choices[0].get("message"), choices[0].get("finish_reason")
    if not isinstance(message, Mapping):
        raise RemoteError(f"{where} has no message object")
    if isinstance(message.get("refusal"), str) and message["refusal"].strip():
        raise RemoteError(f"{where}: the model refused ({one_line(message['refusal'], 100)}); the extractive outcome is kept")
    if finish == "length":
        raise RemoteError(f"{where} was cut at the model's output limit; the extractive outcome is kept")
    content = message.get("content")
    if not isinstance(content, str):
        raise RemoteError(f"{where} has no text content")
    return content


def distill(
    config: DistillConfig,
    run: Mapping,
    extractive: Mapping,
    *,
    client: httpx.Client | None = None,
    transport: httpx.BaseTransport | None = None,
) -> dict:
    """Ask the configured chat model for a new record's outcome (one call, ADD-only).

    Args:
        config: from ``distill_config(settings.distill)``.
        run: the finished run: ``task``, ``state``, ``verdictSummary`` (or ``verdict``),
            ``winnerOutput`` and/or ``workers`` (each with ``agentId``, ``state``, ``output``);
            run.json's camelCase names and RunInput's snake_case ones both work. Long texts
            are trimmed; secrets are redacted unless ``config.redact`` is False.
        extractive: the outcome cybmem already extracted (summary, accomplished, issues, next),
            shown to the model as a draft.
        client / transport: the HTTP layer (tests); by default a fresh client, closed after.

    Returns:
        ``{"summary": str, "accomplished": [str], "issues": [str], "next": [str]}``; issues are
        "title: detail" lines like the outcome trailer's, for the caller to slug.

    Raises:
        RemoteError: the call failed after its retries, its ``config.timeout`` ran out, or
            the reply is malformed; the caller keeps the extractive outcome.
    """
    if config.redact:
        from ..store.secrets import redact, redact_value  # only the distillation path pays for the patterns

        # The write path's one pass over every text whole, before _prompt clips and collapses it
        # (a clip can part a key from its value: "DB_PASSWORD=" cut away, the password kept),
        # then over the prompt as sent.
        run, extractive = redact_value(dict(run))[0], redact_value(dict(extractive))[0]
        prompt, _kinds = redact(_prompt(run, extractive))
    else:
        prompt = _prompt(run, extractive)
    messages = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": prompt}]
    if config.kind == "ollama":
        payload: dict = {
            "model": config.model,
            "messages": messages,
            "stream": False,
            "format": "json",
            "options": {"temperature": 0, "num_predict": 1024},
        }
        hint = f"is Ollama running (`ollama serve`) at OLLAMA_HOST={config.base_url}? (or raise CYBERINE_MEMORY_MODEL_TIMEOUT)"
        reject = f"check the model (`ollama pull {config.model}`, CYBERINE_MEMORY_MODEL)"
    else:
        # No temperature: several OpenAI models reject any value but the default.
        payload = {"model": config.model, "messages": messages, "response_format": {"type": "json_object"}}
        hint = "check the server at CYBERINE_MEMORY_MODEL_URL (or raise CYBERINE_MEMORY_MODEL_TIMEOUT)"
        reject = "check CYBERINE_MEMORY_MODEL, CYBERINE_MEMORY_MODEL_KEY and CYBERINE_MEMORY_MODEL_URL (ending in /v1)"
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    own = client is None
    http = client or deadline_client(config.base_url, transport)
    deadline = time.monotonic() + config.timeout  # the whole call: a run's hook waits for it
    try:
        data = post_json(
            http,
            config.url,
            payload,
            headers=headers,
            attempt_timeout=config.timeout,
            connect_timeout=config.connect_timeout,
            attempts=config.attempts,
            backoff=config.backoff,
            deadline=deadline,
            budget=config.timeout,
            max_bytes=MAX_CHAT_REPLY_BYTES,
            what=f"distillation request (model {config.model})",
            hint=hint,
            reject_hint=reject,
        )
    finally:
        if own:
            http.close()
    return parse_outcome(_reply_text(data, config.kind, config.url))
