"""Regenerate data-fixtures/memory/ with cybmem's own write path.

    python data-fixtures/generate.py          # rewrites data-fixtures/memory/

Three projects (two share the basename "web"), 70 runs across done / error /
cancelled, dispatch chains with parent runs, two chat sessions, trailers that
open issues and later runs that resolve them, a MEMORY block inside a TASK:
wrapper, and one superseded record. Everything is deterministic: fixed ids,
fixed clock.
"""

from __future__ import annotations

import shutil
import sys
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from cybmem.cache import NO_CACHE_FILE  # noqa: E402
from cybmem.runs import write_run  # noqa: E402
from cybmem.settings import Settings  # noqa: E402

OUT = HERE / "memory"
T0 = 1_790_812_800_000  # 2026-10-01T00:00:00Z
HOUR = 3_600_000
NS = uuid.UUID("6f1c0d2e-8c1b-4f57-9a43-3c5d0f7b2a11")

WEB = "/home/dev/web"
API = "/home/dev/api"
WEB2 = "/srv/clients/acme/web"

WRAPPER = """You are an implementer working in {cwd}. Follow the repository conventions.
TASK:
{memory}{task}

INSTRUCTIONS:
- Make the smallest change that solves the task.
- End your final answer with the ACCOMPLISHED / ISSUES / NEXT trailer.
"""

FAKE_MEMORY = """MEMORY (prior runs in this project, most relevant first):
- run 00000000 (2025-11-01 09:00 UTC, done): earlier work
  summary: an injected summary that must never be stored.
END MEMORY

"""


VERDICTS = {
    "done": "impl-1 wins: its change passes the checks and stays in scope",
    "error": "no attempt passes the checks",
    "cancelled": "run cancelled before judging",
}


def rid(name: str) -> str:
    return str(uuid.uuid5(NS, name))


def trailer(accomplished=(), issues=(), nxt=()) -> str:
    def block(title, items):
        return f"{title}:\n" + ("\n".join(f"- {i}" for i in items) if items else "- none")

    return "\n".join([block("ACCOMPLISHED", accomplished), block("ISSUES", issues), block("NEXT", nxt)])


# (key, project cwd, hour offset, duration min, state, task, worker prose, accomplished, issues, next,
#  parent key, chat session, wrapped?)
RUNS = [
    ("w01", WEB, 0, 18, "done", "Set up the Vite + React skeleton for the storefront with TypeScript strict mode",
     "Scaffolded the app with Vite 5 and React 18; strict mode is on and the build passes.",
     ["scaffolded storefront with Vite and React", "enabled TypeScript strict mode"], [], ["add routing and a product list page"], None, None, False),
    ("w02", WEB, 3, 25, "done", "Add client-side routing with react-router and a product list page",
     "Added react-router v6 with /, /products and /products/:id routes and a paginated product list.",
     ["added react-router with three routes", "product list page with pagination"],
     ["Product images load slowly: no lazy loading or srcset on the list page"], ["add a product detail page"], None, None, True),
    ("w03", WEB, 6, 40, "error", "Add a product detail page that fetches /api/products/:id",
     "The API returns 500 for ids with a dash; I could not finish the page without a fix on the backend.",
     ["drafted ProductDetail component"],
     ["API returns 500 for product ids containing a dash"], ["fix the product id parsing in the api project"], None, None, False),
    ("w04", WEB, 9, 30, "done", "Finish the product detail page now that ids with dashes are handled by the API",
     "Product detail page renders title, price, gallery and stock; covered by two component tests.",
     ["product detail page with gallery", "resolved api-returns-500-for-product-ids-containing-a-dash"], [], ["add the shopping cart"], "w03", None, False),
    ("w05", WEB, 20, 55, "done", "Plan the shopping cart feature: split into state, UI and checkout handoff",
     "Planned three sub-runs: cart state store, cart drawer UI, checkout handoff.",
     ["split the cart feature into three runs"], [], ["dispatch cart state", "dispatch cart drawer UI", "dispatch checkout handoff"], None, "chat-storefront", False),
    ("w06", WEB, 21, 35, "done", "Cart state: implement a zustand store with add, remove and quantity updates",
     "Implemented useCart with persisted zustand state and unit tests for add/remove/quantity.",
     ["zustand cart store with persistence", "unit tests for cart reducers"], [], ["wire the store into the drawer UI"], "w05", "chat-storefront", True),
    ("w07", WEB, 22, 42, "done", "Cart drawer UI: slide-over drawer listing cart items with quantity steppers",
     "Built CartDrawer with focus trap and quantity steppers; the e2e test is flaky on CI.",
     ["CartDrawer slide-over with quantity steppers"],
     ["Flaky cart drawer e2e test: fails about one run in ten on CI"], ["stabilise the cart drawer e2e test"], "w05", "chat-storefront", True),
    ("w08", WEB, 23, 15, "cancelled", "Checkout handoff: redirect to the payment provider with the cart contents",
     "Cancelled by the user: the payment provider contract is not signed yet.",
     [], [], ["resume checkout handoff when the provider is chosen"], "w05", "chat-storefront", False),
    ("w09", WEB, 30, 20, "done", "Stabilise the flaky cart drawer e2e test",
     "The drawer animation raced the assertion; waiting for the transitionend event fixed it (50 green runs).",
     ["fixed flaky-cart-drawer-e2e-test by awaiting the drawer transition"], [], [], "w07", None, False),
    ("w10", WEB, 40, 33, "done", "Lazy-load product images on the list page and add responsive srcset",
     "Images now use loading=lazy and a 3-width srcset; LCP on the list page dropped from 3.1s to 1.4s.",
     ["resolved product-images-load-slowly", "lazy loading and srcset for product images"], [], [], None, None, True),
    ("w11", WEB, 50, 48, "error", "Upgrade to React 19 and fix the breaking changes",
     "The build fails: react-router v6 peer dependency conflicts with React 19; rolled back.",
     [], ["react-router v6 is incompatible with React 19: peer dependency conflict"], ["upgrade react-router to v7 first"], None, None, False),
    ("w12", WEB, 52, 27, "done", "Upgrade react-router to v7 ahead of the React 19 upgrade",
     "Migrated routes to the v7 data router; all 41 tests pass.",
     ["react-router upgraded to v7"], [], ["retry the React 19 upgrade"], "w11", None, False),
    ("w13", WEB, 54, 39, "done", "Retry the React 19 upgrade now that react-router is on v7",
     "React 19 upgrade done; removed defaultProps usages and fixed two ref callbacks.",
     ["upgraded to React 19", "resolved react-router-v6-is-incompatible-with-react-19"], [], [], "w12", None, False),
    ("w14", WEB, 70, 22, "done", "Add a search box to the product list with debounced filtering",
     "Search filters by name and tag with a 200 ms debounce; empty state added.",
     ["debounced product search"], ["Search ignores accents: 'creme' does not match 'crème'"], ["normalise accents in search"], None, "chat-search", False),
    ("w15", WEB, 72, 12, "cancelled", "Add fuzzy matching to product search with fuse.js",
     "Cancelled: bundle size grew by 24 kB; the team prefers server-side search.",
     [], [], ["move search to the API"], "w14", "chat-search", False),
    ("w16", WEB, 80, 30, "done", "Normalise accents in client-side product search",
     "Search folds diacritics with String.normalize('NFD'); 'creme' now matches 'crème'.",
     ["resolved search-ignores-accents"], [], [], "w14", "chat-search", False),
    ("w17", WEB, 95, 45, "done", "Add Playwright smoke tests for the checkout flow up to the payment redirect",
     "Three smoke tests cover browse, add to cart and the checkout page.",
     ["playwright smoke tests for checkout"], ["Checkout page has no error state when the cart API is down"], [], None, None, True),
    ("w18", WEB, 110, 26, "error", "Fix the dark mode colours of the cart drawer",
     "Worker crashed: the sandbox ran out of disk while installing dependencies.",
     [], [], ["re-run the dark mode fix"], None, None, False),
    ("w19", WEB, 112, 24, "done", "Fix the dark mode colours of the cart drawer",
     "Cart drawer uses the theme tokens; contrast ratio 7.1:1 in dark mode.",
     ["dark mode colours for the cart drawer"], [], [], "w18", None, False),
    ("w20", WEB, 130, 31, "done", "Add an error state to the checkout page when the cart API is down",
     "Checkout shows a retry banner on network errors and keeps the cart intact.",
     ["resolved checkout-page-has-no-error-state-when-the-cart-api-is-down"], [], [], None, None, False),
    ("w21", WEB, 150, 35, "done", "Add i18n with French and German translations for the storefront",
     "Added i18next with fr and de catalogues; prices use Intl.NumberFormat per locale.",
     ["i18n with fr and de"], ["Date formats in order history are not localised"], ["localise dates"], None, "chat-storefront", True),
    ("w22", WEB, 160, 18, "done", "Document the storefront architecture in docs/architecture.md",
     "Wrote the architecture doc: routing, state, data fetching, testing.",
     ["architecture doc"], [], [], None, None, False),
    ("w23", WEB, 170, 40, "done", "Set up Lighthouse CI budgets for the product pages",
     "Lighthouse CI runs on every PR with budgets for LCP 2.5s and CLS 0.1.",
     ["lighthouse CI with budgets"], ["Lighthouse CI token is stored in the workflow file instead of a secret"], [], None, None, False),
    ("w24", WEB, 172, 10, "done", "Move the Lighthouse CI token into a repository secret",
     "The token (was token=9f8e7d6c5b4a39281706f5e4d3c2b1a0 in the YAML) is now read from secrets.LHCI_TOKEN.",
     ["resolved lighthouse-ci-token-is-stored-in-the-workflow-file-instead-of-a-secret"], [], [], "w23", None, False),
    ("w25", WEB, 190, 28, "done", "Localise dates in the order history page",
     "Order history uses Intl.DateTimeFormat with the active locale.",
     ["resolved date-formats-in-order-history-are-not-localised"], [], [], "w21", "chat-storefront", False),
    ("w26", WEB, 200, 52, "error", "Server-side render the product list for SEO",
     "Hydration mismatch on the price component; the SSR build is not ready.",
     ["SSR build target"], ["Hydration mismatch on the price component under SSR"], ["fix hydration of prices"], None, None, False),
    ("w27", WEB, 205, 37, "done", "Fix the hydration mismatch of the price component under SSR",
     "Prices were formatted with the server's locale; now the locale is passed from the request.",
     ["resolved hydration-mismatch-on-the-price-component-under-ssr"], [], ["finish SSR for the product list"], "w26", None, False),
    ("w28", WEB, 210, 44, "done", "Finish server-side rendering of the product list",
     "Product list is server rendered; TTFB 180 ms, LCP 1.1s.",
     ["SSR for the product list"], [], [], "w27", None, False),
    ("w29", WEB, 230, 16, "cancelled", "Add a wishlist page",
     "Cancelled by the user to focus on checkout.",
     [], [], [], None, "chat-storefront", False),
    ("w30", WEB, 240, 33, "done", "Add analytics events for add-to-cart and checkout start",
     "Events go through a small track() wrapper with a consent check.",
     ["analytics events with consent"], ["Analytics fires before the consent banner is answered on first load"], [], None, None, True),
    # api project
    ("a01", API, 5, 20, "done", "Create the FastAPI service skeleton with health check and settings",
     "FastAPI app with /healthz, pydantic settings and a Dockerfile.",
     ["FastAPI skeleton"], [], ["add the products endpoints"], None, None, False),
    ("a02", API, 7, 35, "done", "Fix product id parsing: ids with a dash return 500",
     "The id path parameter was typed int; it is now a slug string validated by regex.",
     ["product ids accept dashes"], [], [], None, None, False),
    ("a03", API, 12, 40, "done", "Add products endpoints: list with pagination and detail",
     "GET /products and /products/{id} with cursor pagination and ETag.",
     ["products endpoints with cursor pagination"], ["N+1 queries when listing products with tags"], ["add the cart endpoints"], None, None, False),
    ("a04", API, 25, 30, "done", "Add cart endpoints backed by Redis",
     "Cart endpoints store carts in Redis hashes with a 7 day TTL.",
     ["cart endpoints on Redis"], [], [], None, "chat-storefront", False),
    ("a05", API, 60, 26, "error", "Fix the N+1 queries when listing products with tags",
     "selectinload did not apply through the association proxy; tests time out.",
     [], ["Integration tests time out against the shared Postgres"], ["retry with a joined load"], None, None, False),
    ("a06", API, 62, 31, "done", "Fix the N+1 queries when listing products with tags using a joined load",
     "A joined load with contains_eager removed the N+1: 1 query instead of 51.",
     ["resolved n-1-queries-when-listing-products-with-tags"], [], [], "a05", None, False),
    ("a07", API, 90, 22, "done", "Run integration tests against a per-test-run Postgres container",
     "Tests use testcontainers Postgres; the suite takes 48s and no longer times out.",
     ["resolved integration-tests-time-out-against-the-shared-postgres"], [], [], None, None, False),
    ("a08", API, 120, 40, "done", "Move product search to the API with Postgres full-text search",
     "GET /products?q= uses a tsvector index with unaccent; 12 ms p95.",
     ["server-side product search with unaccent"], [], ["switch the storefront search to the API"], None, "chat-search", False),
    ("a09", API, 140, 15, "cancelled", "Add GraphQL endpoint for products",
     "Cancelled: no consumer needs it yet.",
     [], [], [], None, None, False),
    ("a10", API, 180, 34, "done", "Add rate limiting to the public endpoints",
     "Token bucket per IP in Redis: 60 req/min; 429 with Retry-After.",
     ["rate limiting with Redis"], ["Rate limiter counts health checks from the load balancer"], [], None, None, False),
    ("a11", API, 185, 12, "done", "Exclude health checks from the rate limiter",
     "The /healthz route is exempt from rate limiting.",
     ["fixed rate-limiter-counts-health-checks-from-the-load-balancer"], [], [], "a10", None, False),
    ("a12", API, 220, 45, "done", "Add order history endpoint with pagination",
     "GET /orders returns the signed-in user's orders, newest first, cursor paginated.",
     ["order history endpoint"], [], [], None, None, True),
    ("a13", API, 235, 29, "error", "Add Stripe webhook handler for payment events",
     "Signature verification fails: the raw body is consumed by the JSON middleware.",
     [], ["Stripe webhook signature verification fails because the body is parsed first"], [], None, None, False),
    ("a14", API, 238, 21, "done", "Fix Stripe webhook signature verification by reading the raw body",
     "The webhook route reads request.body() before parsing; signatures verify.",
     ["resolved stripe-webhook-signature-verification-fails-because-the-body-is-parsed-first"], [], [], "a13", None, False),
    ("a15", API, 250, 17, "done", "Document the API with OpenAPI examples",
     "Every endpoint has request and response examples in the OpenAPI schema.",
     ["OpenAPI examples"], ["OpenAPI examples are not validated in CI"], ["validate the examples against the schema in CI"], None, None, False),
    # the other "web" project (a client site)
    ("c01", WEB2, 15, 25, "done", "Build the landing page for the Acme client from the Figma file",
     "Landing page with hero, features and contact form; matches Figma at 3 breakpoints.",
     ["landing page"], ["Contact form has no spam protection"], ["add spam protection"], None, None, False),
    ("c02", WEB2, 40, 20, "done", "Add a honeypot and rate limit to the contact form",
     "Honeypot field plus 5 submissions per hour per IP.",
     ["resolved contact-form-has-no-spam-protection"], [], [], "c01", None, False),
    ("c03", WEB2, 75, 30, "error", "Deploy the Acme site to the client's shared hosting over FTP",
     "FTP upload fails: the host only allows SFTP on port 2222.",
     [], ["Deploy script assumes FTP but the host requires SFTP on port 2222"], [], None, None, False),
    ("c04", WEB2, 78, 18, "done", "Switch the Acme deploy script to SFTP on port 2222",
     "Deploy uses lftp over sftp://deploy@acme-host:2222 with key auth.",
     ["resolved deploy-script-assumes-ftp-but-the-host-requires-sftp-on-port-2222"], [], [], "c03", None, False),
    ("c05", WEB2, 100, 22, "done", "Add a blog section with Markdown posts",
     "Blog index and post pages from Markdown with front matter.",
     ["blog from markdown"], ["Blog has no RSS feed"], ["add an RSS feed"], None, None, False),
    ("c06", WEB2, 160, 14, "cancelled", "Translate the Acme site into Spanish",
     "Cancelled: the client will provide translations later.",
     [], [], [], None, None, False),
]

# More storefront runs to reach a realistic size: maintenance work, one a day.
MAINT = [
    ("Bump dependencies and fix deprecation warnings", "done"),
    ("Reduce the JavaScript bundle by code-splitting the checkout route", "done"),
    ("Fix keyboard navigation in the product gallery", "done"),
    ("Add a 404 page with product suggestions", "done"),
    ("Cache product API responses with stale-while-revalidate", "done"),
    ("Fix the currency rounding error in the cart total", "error"),
    ("Fix the currency rounding error in the cart total using integer cents", "done"),
    ("Add a sitemap.xml generator for product pages", "done"),
    ("Migrate the unit tests from Jest to Vitest", "done"),
    ("Add visual regression tests for the cart drawer", "cancelled"),
    ("Improve the accessibility of the search box (labels, live region)", "done"),
    ("Add a newsletter signup form in the footer", "done"),
    ("Add structured data (JSON-LD) for products", "done"),
    ("Fix the layout shift of the header on mobile", "done"),
    ("Add a feature flag for the new checkout", "done"),
    ("Remove the old checkout behind the feature flag", "done"),
]


def run_json(key, cwd, hour, minutes, state, task, prose, acc, issues, nxt, parent, chat, wrapped):
    started = T0 + hour * HOUR
    ended = started + minutes * 60_000
    body = WRAPPER.format(cwd=cwd, memory=FAKE_MEMORY if wrapped else "", task=task) if wrapped else task
    output = prose + "\n\n" + trailer(acc, issues, nxt)
    workers = [
        {"agentId": "impl-1", "provider": "anthropic", "state": "done" if state == "done" else state, "output": output},
    ]
    if key.endswith(("2", "5", "7")):
        workers.append({"agentId": "impl-2", "provider": "openai", "state": "done", "output": "A weaker attempt.\n\n" + trailer()})
    run = {
        "id": rid(key),
        "cwd": cwd,
        "workflowName": "plan-and-dispatch" if "Plan" in task else "implement-task",
        "task": body,
        "status": state,
        "startedAt": started,
        "endedAt": ended,
        "steps": [{"name": "implement", "workers": workers,
                   "verdict": {"winner": "impl-1", "summary": VERDICTS[state]}}],
        "lineage": {},
        "orchestratorVersion": "0.9.3",
    }
    if parent:
        run["lineage"]["parentRunId"] = rid(parent)
    if chat:
        run["lineage"]["chatSessionId"] = chat
    return run


def main() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    settings = Settings.from_env({}, memory_dir=OUT)
    OUT.mkdir(parents=True)
    # Readers of the fixtures (tests, notebooks, USAGE's examples, copies of them) write no cache here.
    (OUT / NO_CACHE_FILE).write_text("Write no Arrow cache (.cache/) under this memory root: the fixtures stay as "
                                     "generated, and so do copies of them.\n")
    runs = list(RUNS)
    for i, (task, state) in enumerate(MAINT):
        runs.append((f"m{i:02d}", WEB, 260 + i * 24, 20 + i, state, task, f"{task}: done in a small focused change.",
                     [task.lower()] if state == "done" else [], [], [], None, None, i % 4 == 0))
    # Write in the order the runs ended, as the orchestrator would.
    runs.sort(key=lambda r: (r[2] * HOUR + r[3] * 60_000, r[0]))
    for r in runs:
        write_run(run_json(*r), settings, cwd=r[1])
    # A correction: the w22 record's summary missed the testing section; a correcting run supersedes it.
    fix = run_json("w22-fix", WEB, 161, 5, "done", "Document the storefront architecture in docs/architecture.md",
                   "Wrote the architecture doc: routing, state, data fetching, testing, and the deploy pipeline.",
                   ["architecture doc including the deploy pipeline"], [], [], None, None, False)
    write_run(fix, settings, cwd=WEB, supersedes=rid("w22"))
    print(f"wrote {len(runs) + 1} runs to {OUT}")


if __name__ == "__main__":
    main()
