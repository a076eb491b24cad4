#!/usr/bin/env node
// The orchestrator's side of the cross-language conformance test (tests/test_conformance.py).
//
// It writes a memory store the way the TypeScript MemoryStore of the seeds writes one, and reads
// a store back the way its reader does, so that cybmem (Python) can be checked against it on the
// same files. Plain Node (18+), no dependencies.
//
//   node conformance.mjs write DIR                         a TS-written store: project "web"
//   node conformance.mjs read DIR [--project SLUG]         print the TS reader's views as JSON
//   node conformance.mjs correct DIR OLD NEW [--project SLUG]
//                                                          a TS correction of OLD by NEW
//   node conformance.mjs slugs JSON                        the slug rules of docs/store-format.md:
//                                                          {"issues": [item], "cwds": [cwd]} ->
//                                                          {"issues": [[title, detail, id]], "projects": [slug]}
//
// How the TS writer writes (seeds 000/001): projects.json and every record with
// JSON.stringify(obj, null, 2) to a temp file, then renameSync; ledger events appended with
// appendFileSync, one JSON object a line. A correction writes the new record, then rewrites the
// corrected record with "supersededBy": NEW added (temp file + rename), every other field as it
// was. The TS record type has no "supersedes" field; cybmem's corrections write that one.
//
// How the TS reader reads (what `read` prints):
//   list        every readable record, newest first (endedAt desc, then runId desc), with
//               superseded = its supersededBy names an existing record, or an existing record's
//               "supersedes" names it (cybmem's corrections write both directions)
//   show        runId -> the runId reached by following supersededBy while it names an existing
//               record (cycle-guarded): the newest truth
//   openIssues  the ledger folded in file order, last event wins; open = last event is opened or
//               reopened; title = first non-empty title in file order, else the issueId;
//               openedAt / openedBy = the first event's at / byRunId.
//               A line that is not JSON, or whose event is not one of opened | resolved |
//               reopened | wontfix (or has no string issueId / numeric at), is skipped: the same
//               rule as cybmem (which skips invalid ledger lines). A naive TS fold would let an
//               unknown event close an issue; the TS reader must adopt this rule too.
//   chains      runId -> previous (the previousRunId walk back to the start, oldest first) and
//               next (forwards: the record naming the current one as previousRunId, the
//               earliest-ended one, ties by runId), one seen-set guarding both walks; plus
//               parentRunId, rootRunId, chatSessionId, children (records whose parentRunId is
//               this run) and chatRuns (records of the same chat session), oldest first
//   candidates  runIds of records that are not superseded (what search may rank)

import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";

const MIN = 60_000;
const HOUR = 60 * MIN;
const T0 = Date.UTC(2026, 9, 1); // 2026-10-01T00:00:00Z, in the past of any run of this test
const CWD = "/home/dev/web";
const EVENTS = new Set(["opened", "resolved", "reopened", "wontfix"]);

// --- writing, as the TS MemoryStore does ------------------------------------------------------

let tmpSeq = 0;

function writeJsonAtomic(file, obj) {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  const tmp = `${file}.tmp-${process.pid}-${++tmpSeq}`;
  fs.writeFileSync(tmp, JSON.stringify(obj, null, 2));
  fs.renameSync(tmp, file);
}

function recordPath(dir, slug, runId) {
  return path.join(dir, slug, "records", `${runId}.json`);
}

function writeRecord(dir, slug, record) {
  writeJsonAtomic(recordPath(dir, slug, record.runId), record);
}

function appendEvent(dir, slug, event) {
  fs.mkdirSync(path.join(dir, slug), { recursive: true });
  fs.appendFileSync(path.join(dir, slug, "issues.jsonl"), JSON.stringify(event) + "\n");
}

// The TS correction: the new record is written first, then the corrected one gets supersededBy.
function markSuperseded(dir, slug, oldId, newId) {
  const file = recordPath(dir, slug, oldId);
  const record = JSON.parse(fs.readFileSync(file, "utf8"));
  record.supersededBy = newId;
  writeJsonAtomic(file, record);
}

function record(runId, task, state, startH, endH, lineage, outcome, workers, more = {}) {
  return {
    runId,
    cwd: CWD,
    workflowName: "implement-task",
    task,
    state,
    startedAt: T0 + Math.round(startH * HOUR),
    endedAt: T0 + Math.round(endH * HOUR),
    lineage,
    outcome: { summary: `${task.split("\n")[0]} Ended ${state}.`, accomplished: [], issues: [], next: [], ...outcome },
    workers,
    ...more,
  };
}

const impl = (state, provider) => (provider ? { agentId: "impl-1", provider, state } : { agentId: "impl-1", state });

function writeStore(dir) {
  const slug = "web";
  writeJsonAtomic(path.join(dir, "projects.json"), { web: { cwd: CWD } });
  const at = (h) => T0 + Math.round(h * HOUR);
  const put = (r) => writeRecord(dir, slug, r);
  const ev = (e) => appendEvent(dir, slug, e);

  // A chain of runs along previousRunId; run-03 dispatched run-04a / run-04b (equal endedAt).
  put(record("run-01", "Set up the Vite + React skeleton for the storefront", "done", 0, 1, {},
    { accomplished: ["scaffolded the app"], next: ["add routing"] }, [impl("done", "anthropic")],
    { verdictSummary: "impl-1 wins: builds and serves" }));
  put(record("run-02", "Add client-side routing with react-router", "done", 2, 3,
    { previousRunId: "run-01", rootRunId: "run-02" },
    { accomplished: ["routes for list and detail"], issues: ["flaky-login-test"] },
    [impl("done", "openai"), { agentId: "impl-2", state: "error" }],
    { verdictSummary: "impl-1 wins: its change passes the checks" }));
  ev({ issueId: "flaky-login-test", at: at(3), event: "opened", byRunId: "run-02", title: "Flaky login test",
    detail: "fails one run in ten on CI" });
  put(record("run-04a", "Cart state: a zustand store with add and remove", "done", 4, 5,
    { parentRunId: "run-03", previousRunId: "run-02", rootRunId: "run-03", spawnedVia: "launchBackgroundRun" },
    { accomplished: ["cart store"] }, [impl("done", "anthropic")]));
  put(record("run-04b", "Cart drawer UI: a slide-over drawer listing the cart items", "error", 4, 5,
    { parentRunId: "run-03", previousRunId: "run-02", rootRunId: "run-03" },
    { issues: ["cart-total-rounding"] }, [impl("error")]));
  ev({ issueId: "cart-total-rounding", at: at(5), event: "opened", byRunId: "run-04b" }); // no title
  ev({ issueId: "flaky-login-test", at: at(5), event: "resolved", byRunId: "run-04a", title: "Flaky login test" }); // equal at
  put(record("run-03", "Plan the shopping cart feature: split into state and UI", "done", 3.5, 6,
    { previousRunId: "run-02", rootRunId: "run-03" }, { next: ["checkout handoff"] },
    [{ agentId: "planner", provider: "anthropic", state: "done", costUsd: 0.12 }],
    { verdictSummary: "planner: two child runs dispatched", dispatchedRuns: ["run-04a", "run-04b"],
      tokens: { input: 1200, output: 340 } }));

  // CJK and emoji; corrected the TS way, and the correction carries a dangling supersededBy.
  put(record("run-05", "修复购物车抽屉在移动端的布局 🛒", "done", 7, 8, { previousRunId: "run-03", rootRunId: "run-05" },
    { accomplished: ["drawer fits 320px screens"] }, [impl("done", "deepseek")]));
  ev({ issueId: "cart-total-rounding", at: at(8), event: "resolved", byRunId: "run-05",
    title: "Cart total rounds half-cents down" }); // the first non-empty title of this issue
  put(record("run-06", "Add a search box with debounced queries", "cancelled", 9, 10,
    { previousRunId: "run-05", chatSessionId: "chat-alpha", rootRunId: "run-06" }, {}, [impl("cancelled", "ollama")]));
  ev({ issueId: "flaky-login-test", at: at(4), event: "reopened", byRunId: "run-06",
    title: "Flaky login test (again)", source: "trailer" }); // an at earlier than the line before
  put(record("run-05-fix", "修复购物车抽屉在移动端的布局 🛒 (corrected: the drawer also needed a max-height)", "done", 10, 10.5,
    { previousRunId: "run-03", rootRunId: "run-05" }, { accomplished: ["drawer fits 320px screens", "max-height"] },
    [impl("done", "deepseek")]));
  markSuperseded(dir, slug, "run-05", "run-05-fix");
  markSuperseded(dir, slug, "run-05-fix", "run-05-fix-gone"); // its record was never written
  put(record("run-07", "Normalise accents in client-side search (café → cafe)", "done", 11, 12,
    { previousRunId: "run-06", chatSessionId: "chat-alpha", rootRunId: "run-07", dispatchedFrom: "chat" },
    {}, [impl("done", "anthropic")]));
  ev({ issueId: "i18n-dates", at: at(12), event: "opened", byRunId: "run-07", title: "" });
  ev({ issueId: "i18n-dates", at: at(12), event: "wontfix", byRunId: "run-07", title: "" });

  // Corrected twice: run-08 -> run-08-fix -> run-08-fix2.
  put(record("run-08", "Upgrade to React 19 and fix the breaking changes", "error", 13, 14,
    { previousRunId: "run-07", rootRunId: "run-08" }, { issues: ["dark-mode-colours"] }, [impl("error", "openai")]));
  ev({ issueId: "dark-mode-colours", at: at(14), event: "opened", byRunId: "run-08",
    title: "Dark mode colours of the cart drawer" });
  // An event name the contract does not know: skipped by every reader (see the header).
  ev({ issueId: "dark-mode-colours", at: at(15), event: "snoozed", byRunId: "run-08", title: "Dark mode colours of the cart drawer" });
  // A task cut by .slice() in the middle of an emoji: JSON.stringify writes the lone "\ud83c".
  const cut = "Ship the 🎉 release notes".slice(0, 10);
  put(record("run-09", cut, "done", 14.2, 16, { previousRunId: "run-08", chatSessionId: "chat-beta", rootRunId: "run-09" },
    { issues: ["ssr-hydration"] }, [impl("done")]));
  ev({ issueId: "ssr-hydration", at: at(16), event: "opened", byRunId: "run-09", title: "ssr-hydration" });
  put(record("run-08-fix", "Upgrade to React 19 (corrected: react-router had to move first)", "done", 14.5, 15,
    { previousRunId: "run-07", rootRunId: "run-08" }, {}, [impl("done", "openai")]));
  markSuperseded(dir, slug, "run-08", "run-08-fix");
  put(record("run-10", "Add i18n with French and German translations\n\nKeep the date formats per locale; 日本語 later.",
    "done", 17, 18, { previousRunId: "run-09", chatSessionId: "chat-beta", rootRunId: "run-10" },
    { next: ["日本語の翻訳"] }, [impl("done", "anthropic"), { agentId: "impl-2", provider: "openai", state: "done" }],
    { verdictSummary: "impl-2 wins: complete translations" }));
  ev({ issueId: "ssr-hydration", at: at(18), event: "resolved", byRunId: "run-10",
    title: "Hydration mismatch of the price component under SSR" });
  put(record("run-11", "Document the storefront architecture in docs/architecture.md", "done", 19, 20,
    { previousRunId: "run-10", rootRunId: "run-11" }, {}, [impl("done", "anthropic")]));
  markSuperseded(dir, slug, "run-11", "run-99-ghost"); // a supersededBy naming no record
  ev({ issueId: "ssr-hydration", at: at(20), event: "reopened", byRunId: "run-11",
    title: "Hydration mismatch of the price component under SSR" });
  put(record("run-08-fix2", "Upgrade to React 19 (corrected again: the test suite needed jsdom 25)", "done", 19.5, 20,
    { previousRunId: "run-07", rootRunId: "run-08" }, {}, [impl("done", "openai")])); // endedAt == run-11's
  markSuperseded(dir, slug, "run-08-fix", "run-08-fix2");
  put(record("run-12", "Set up Lighthouse CI budgets for the product pages", "done", 21, 22,
    { previousRunId: "run-11", rootRunId: "run-12" }, { issues: ["issue-5f1c2a9b3e", "untitled-flake"] },
    [impl("done", "anthropic")]));
  ev({ issueId: "issue-5f1c2a9b3e", at: at(22), event: "opened", byRunId: "run-12", title: "登录按钮在移动端不可点击 📱" });
  ev({ issueId: "untitled-flake", at: at(22), event: "opened", byRunId: "run-12" });
  ev({ issueId: "cart-total-rounding", at: at(22), event: "reopened", byRunId: "run-12" });
}

// A TS correction of OLD: NEW is OLD's record with a new runId, a corrected task and a later end.
function correct(dir, slug, oldId, newId) {
  const old = JSON.parse(fs.readFileSync(recordPath(dir, slug, oldId), "utf8"));
  const fixed = { ...old, runId: newId, task: `${old.task} (corrected)`, endedAt: old.endedAt + MIN };
  delete fixed.supersededBy;
  delete fixed.supersedes;
  writeRecord(dir, slug, fixed);
  markSuperseded(dir, slug, oldId, newId);
}

// --- reading, as the TS reader does -----------------------------------------------------------

function readRecords(dir, slug) {
  const recDir = path.join(dir, slug, "records");
  let names = [];
  try {
    names = fs.readdirSync(recDir).sort();
  } catch {
    names = [];
  }
  const records = new Map();
  const skipped = [];
  for (const name of names) {
    if (!name.endsWith(".json") || name.startsWith(".")) continue; // temp files
    try {
      const r = JSON.parse(fs.readFileSync(path.join(recDir, name), "utf8"));
      if (r && typeof r === "object" && r.runId === name.slice(0, -5)) records.set(r.runId, r);
      else skipped.push(name);
    } catch {
      skipped.push(name);
    }
  }
  return { records, skipped };
}

function readLedger(dir, slug) {
  let text = "";
  try {
    text = fs.readFileSync(path.join(dir, slug, "issues.jsonl"), "utf8");
  } catch {
    return [];
  }
  const events = [];
  for (const line of text.split("\n")) {
    if (!line.trim()) continue;
    let e;
    try {
      e = JSON.parse(line);
    } catch {
      continue; // a torn or broken line
    }
    if (!e || typeof e !== "object" || typeof e.issueId !== "string" || typeof e.at !== "number" || !EVENTS.has(e.event)) {
      continue;
    }
    events.push(e);
  }
  return events;
}

function foldIssues(events) {
  const states = new Map();
  for (const e of events) {
    let s = states.get(e.issueId);
    if (!s) {
      s = { issueId: e.issueId, title: null, state: e.event, openedAt: e.at, openedBy: e.byRunId ?? null };
      states.set(e.issueId, s);
    }
    s.state = e.event;
    if (s.title === null && typeof e.title === "string" && e.title !== "") s.title = e.title;
  }
  const out = [];
  for (const s of states.values()) {
    if (s.state === "opened" || s.state === "reopened") out.push({ ...s, title: s.title ?? s.issueId });
  }
  return out;
}

const byEnd = (a, b) => a.endedAt - b.endedAt || (a.runId < b.runId ? -1 : a.runId > b.runId ? 1 : 0);

function readStore(dir, slug) {
  const { records, skipped } = readRecords(dir, slug);
  const all = [...records.values()];
  const superseded = new Set();
  for (const r of all) {
    if (typeof r.supersededBy === "string" && r.supersededBy !== r.runId && records.has(r.supersededBy)) superseded.add(r.runId);
    if (typeof r.supersedes === "string" && r.supersedes !== r.runId && records.has(r.supersedes)) superseded.add(r.supersedes);
  }
  const lin = (r) => (r.lineage && typeof r.lineage === "object" ? r.lineage : {});

  const list = all
    .slice()
    .sort((a, b) => -byEnd(a, b))
    .map((r) => ({
      runId: r.runId,
      startedAt: r.startedAt,
      endedAt: r.endedAt,
      state: r.state,
      workflowName: r.workflowName,
      task: r.task,
      superseded: superseded.has(r.runId),
      previousRunId: lin(r).previousRunId ?? null,
      parentRunId: lin(r).parentRunId ?? null,
      chatSessionId: lin(r).chatSessionId ?? null,
      rootRunId: lin(r).rootRunId ?? null,
    }));

  const show = {};
  for (const r of all) {
    const seen = new Set([r.runId]);
    let cur = r;
    while (typeof cur.supersededBy === "string" && records.has(cur.supersededBy) && !seen.has(cur.supersededBy)) {
      cur = records.get(cur.supersededBy);
      seen.add(cur.runId);
    }
    show[r.runId] = cur.runId;
  }

  const ordered = all.slice().sort(byEnd);
  const followers = new Map();
  for (const r of ordered) {
    const prev = lin(r).previousRunId;
    if (prev) {
      if (!followers.has(prev)) followers.set(prev, []);
      followers.get(prev).push(r);
    }
  }
  const chains = {};
  for (const r of all) {
    const seen = new Set([r.runId]);
    const previous = [];
    let cur = r;
    while (records.has(lin(cur).previousRunId) && !seen.has(lin(cur).previousRunId)) {
      cur = records.get(lin(cur).previousRunId);
      seen.add(cur.runId);
      previous.push(cur.runId);
    }
    previous.reverse();
    const next = [];
    cur = r;
    for (;;) {
      const cand = (followers.get(cur.runId) || []).filter((f) => !seen.has(f.runId));
      if (!cand.length) break;
      cur = cand[0];
      seen.add(cur.runId);
      next.push(cur.runId);
    }
    const chat = lin(r).chatSessionId ?? null;
    chains[r.runId] = {
      previous,
      next,
      parentRunId: lin(r).parentRunId ?? null,
      rootRunId: lin(r).rootRunId ?? null,
      chatSessionId: chat,
      children: ordered.filter((o) => lin(o).parentRunId === r.runId).map((o) => o.runId),
      chatRuns: chat ? ordered.filter((o) => lin(o).chatSessionId === chat).map((o) => o.runId) : [],
    };
  }

  let projects = null;
  try {
    projects = JSON.parse(fs.readFileSync(path.join(dir, "projects.json"), "utf8"));
  } catch {
    projects = null;
  }
  return {
    project: slug,
    projects,
    records: Object.fromEntries(records),
    skipped,
    list,
    show,
    openIssues: foldIssues(readLedger(dir, slug)),
    chains,
    candidates: list.filter((e) => !e.superseded).map((e) => e.runId),
  };
}

// --- the slug rules, as docs/store-format.md states them ----------------------------------------

const sha256hex = (text) => crypto.createHash("sha256").update(text, "utf8").digest("hex");
const asciiFold = (text) => text.normalize("NFKD").replace(/[^\x00-\x7f]/g, "");
const trimDashes = (text) => text.replace(/^-+|-+$/g, "");

// "The issue id, exactly", step 1: the title and the detail of an ISSUES item.
function splitIssue(item) {
  item = item.trim();
  const sep = /(?:\*\*)?:(?:\*\*)?\s|\s[\u2014\u2013-]\s/u.exec(item);
  if (!sep) return [item, ""];
  let title = item.slice(0, sep.index).trim();
  const detail = item.slice(sep.index + sep[0].length).trim();
  if (title.startsWith("**")) {
    title = title.slice(2);
    if (title.endsWith("**")) title = title.slice(0, -2);
    title = title.trim();
  }
  return title ? [title, detail] : [item, ""];
}

// Steps 2-4: the issue id of a title.
function issueSlug(title) {
  let slug = trimDashes(asciiFold(title).toLowerCase().replace(/[^a-z0-9]+/g, "-"));
  if (slug.length > 64) {
    let cut = slug.slice(0, 64);
    if (slug[64] !== "-" && cut.includes("-")) cut = cut.slice(0, cut.lastIndexOf("-"));
    slug = trimDashes(cut);
  }
  return slug || "issue-" + sha256hex(title).slice(0, 10);
}

// "Project folders: the slug rule": the slug of a cwd, registered into `projects` (slug -> {cwd}).
function projectSlug(cwd, projects) {
  const abs = path.resolve(cwd);
  const hash6 = sha256hex(abs).slice(0, 6);
  let base = trimDashes(trimDashes(asciiFold(path.basename(abs)).toLowerCase().replace(/[^a-z0-9._-]+/g, "-")).slice(0, 64));
  if (!base || /^\.+$/.test(base) || base.startsWith(".")) base = `project-${hash6}`;
  const owners = Object.keys(projects).filter((s) => projects[s].cwd === abs).sort();
  let slug;
  if (owners.length) {
    slug = [base, `${base}-${hash6}`].find((s) => owners.includes(s)) || owners[0];
  } else {
    slug = projects[base] ? `${base}-${hash6}` : base;
  }
  if (!projects[slug]) projects[slug] = { cwd: abs };
  return slug;
}

function slugs(input) {
  const projects = {};
  return {
    issues: (input.issues || []).map((item) => {
      const [title, detail] = splitIssue(item);
      return [title, detail, issueSlug(title)];
    }),
    projects: (input.cwds || []).map((cwd) => projectSlug(cwd, projects)),
  };
}

// --- command line -----------------------------------------------------------------------------

function main(argv) {
  const args = argv.slice();
  let slug = null;
  const i = args.indexOf("--project");
  if (i >= 0) {
    slug = args[i + 1];
    args.splice(i, 2);
  }
  const [mode, dir, ...rest] = args;
  if (mode === "write" && dir) {
    writeStore(dir);
  } else if (mode === "read" && dir) {
    process.stdout.write(JSON.stringify(readStore(dir, slug || "web")) + "\n");
  } else if (mode === "correct" && dir && rest.length === 2) {
    correct(dir, slug || "web", rest[0], rest[1]);
  } else if (mode === "slugs" && dir) {
    process.stdout.write(JSON.stringify(slugs(JSON.parse(dir))) + "\n");
  } else {
    process.stderr.write("usage: conformance.mjs write DIR | read DIR [--project SLUG] | correct DIR OLD NEW [--project SLUG] | slugs JSON\n");
    process.exit(2);
  }
}

main(process.argv.slice(2));
