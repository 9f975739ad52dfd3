"""What each agent costs: tokens per terminal, per task attempt and per model, read from what
its CLI records itself (``Provider.usage``: transcripts, session files), priced from an editable
table, and held to budgets (docs/usage.md).

- Prices: built-in list prices, overridden or extended by ``$CAO_HOME/prices.toml``
  (USD per million tokens; a model name or a shell-style pattern per table).
- Budgets: ``$CAO_HOME/budgets.toml``, ``[session.NAME]`` (every agent of that session together)
  and ``[profile.NAME]`` (each agent launched with that profile on its own): ``usd`` and/or
  ``tokens``, ``warn_at`` (a fraction, default 0.8). At the warning line an event and a log line;
  at the limit new tasks (``kind=task``) to the agent wait with the reason — nothing is killed,
  other mail still goes. Both files are checked when cao-server starts (errors name the file and
  the key) and read again when they change.
- A CLI that records nothing reads *unknown* (``None``), never 0; a model with no price has
  tokens but an unknown cost.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import threading
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import providers
from cao.errors import InvalidInput
from cao.events import EventBus
from cao.files import MissingFile, read_small_file
from cao.names import validate_name, validate_session_name
from cao.states import TerminalState
from cao.store import Store, Terminal, UsageRow
from cao.tmux import session_name_for
from providers.base import UsageEntry
from providers.usage_files import MAX_COUNT

logger = logging.getLogger(__name__)

PRICES_FILE = "prices.toml"
BUDGETS_FILE = "budgets.toml"
FILE_LIMIT = 256 * 1024
REFRESH_EVERY = 15.0  # seconds between re-reads of every live terminal's records (housekeeping)
DEFAULT_WARN_AT = 0.8
CATEGORIES = ("input", "output", "cache_read", "cache_write")
MAX_PER_RESPONSE = MAX_COUNT  # tokens: a record claiming more is a broken record, counted at this
MAX_AMOUNT = 10**15  # a price, a usd or a tokens limit above this is a typo (and sums stay finite)

# List prices in USD per million tokens as published by the model makers (late 2026; check them,
# and put yours in $CAO_HOME/prices.toml: its tables come first). The most specific pattern wins.
BUILTIN_PRICES: dict[str, dict[str, float]] = {
    "claude-opus-4-5*": {"input": 5.0, "output": 25.0, "cache_read": 0.5, "cache_write": 6.25},
    "claude-opus-4*": {"input": 15.0, "output": 75.0, "cache_read": 1.5, "cache_write": 18.75},
    "claude-sonnet-4*": {"input": 3.0, "output": 15.0, "cache_read": 0.3, "cache_write": 3.75},
    "claude-3-7-sonnet*": {"input": 3.0, "output": 15.0, "cache_read": 0.3, "cache_write": 3.75},
    "claude-haiku-4*": {"input": 1.0, "output": 5.0, "cache_read": 0.1, "cache_write": 1.25},
    "claude-3-5-haiku*": {"input": 0.8, "output": 4.0, "cache_read": 0.08, "cache_write": 1.0},
    "gpt-5*-mini*": {"input": 0.25, "output": 2.0, "cache_read": 0.025, "cache_write": 0.0},
    "gpt-5*": {"input": 1.25, "output": 10.0, "cache_read": 0.125, "cache_write": 0.0},
    "gemini-2.5-pro*": {"input": 1.25, "output": 10.0, "cache_read": 0.31, "cache_write": 0.0},
    "gemini-2.5-flash-lite*": {"input": 0.1, "output": 0.4, "cache_read": 0.025, "cache_write": 0.0},
    "gemini-2.5-flash*": {"input": 0.3, "output": 2.5, "cache_read": 0.075, "cache_write": 0.0},
}


class UsageConfigError(InvalidInput):
    """A prices or budgets file that can't be used (the message names the file and the key)."""


# -- the two files ---------------------------------------------------------------------------------
def _read_toml(path: Path) -> dict[str, Any]:
    try:  # non-blocking and bounded: a FIFO here must not stall the reader (it holds the lock)
        data = read_small_file(path, FILE_LIMIT, f"{path.stem} file")
    except MissingFile:
        return {}
    except InvalidInput as exc:
        raise UsageConfigError(exc.message) from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise UsageConfigError(f"{path}:{line}: not UTF-8 text ({exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageConfigError(f"{path}: not TOML: {exc}") from None


def _amount(value: object, where: str, *, whole: bool = False) -> float:
    kind = "a whole number" if whole else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageConfigError(f"{where} must be {kind} ≥ 0, not {value!r}")
    if isinstance(value, int) and value > MAX_AMOUNT:  # TOML integers have no bound; float() has
        raise UsageConfigError(f"{where} is too large ({len(str(value))} digits); at most {MAX_AMOUNT:.0e}")
    if not math.isfinite(value) or value < 0:
        raise UsageConfigError(f"{where} must be {kind} ≥ 0, not {value!r}")
    if value > MAX_AMOUNT:
        raise UsageConfigError(f"{where} is too large ({value!r}); at most {MAX_AMOUNT:.0e}")
    if whole and not float(value).is_integer():
        raise UsageConfigError(f"{where} must be a whole number of tokens, not {value!r}")
    return float(value)


def parse_prices(data: Mapping[str, Any], source: str) -> dict[str, dict[str, float]]:
    """``[models."PATTERN"]`` tables of ``input``/``output``/``cache_read``/``cache_write``."""
    unknown = sorted(set(data) - {"models"})
    if unknown:
        raise UsageConfigError(f'{source}: unknown key {unknown[0]!r}; prices go under [models."NAME"]')
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise UsageConfigError(f'{source}: models must be tables: [models."claude-sonnet-4*"]')
    out: dict[str, dict[str, float]] = {}
    for pattern, table in models.items():
        where = f"{source}: models.{pattern!r}"
        if not pattern.strip():
            raise UsageConfigError(f"{where}: the model name is empty")
        if not isinstance(table, dict):
            raise UsageConfigError(f"{where} must be a table of prices (input = 3.0 ...)")
        bad = sorted(set(table) - set(CATEGORIES))
        if bad:
            raise UsageConfigError(f"{where}: unknown price {bad[0]!r}; use {', '.join(CATEGORIES)}")
        if "input" not in table or "output" not in table:
            raise UsageConfigError(f"{where}: give at least input and output (USD per million tokens)")
        out[pattern] = {c: _amount(table.get(c, 0.0), f"{where}.{c}") for c in CATEGORIES}
    return out


@dataclass(frozen=True)
class Budget:
    scope: str  # "session" or "profile"
    name: str
    usd: float | None = None
    tokens: float | None = None
    warn_at: float = DEFAULT_WARN_AT

    @property
    def label(self) -> str:
        return f"{self.scope} {self.name}"


def parse_budgets(data: Mapping[str, Any], source: str) -> list[Budget]:
    unknown = sorted(set(data) - {"session", "profile"})
    if unknown:
        raise UsageConfigError(
            f"{source}: unknown key {unknown[0]!r}; budgets go under [session.NAME] or [profile.NAME]"
        )
    out = []
    named: dict[tuple[str, str], str] = {}
    for scope in ("session", "profile"):
        tables = data.get(scope, {})
        if not isinstance(tables, dict):
            raise UsageConfigError(f"{source}: {scope} must be tables: [{scope}.NAME]")
        for name, table in tables.items():
            where = f"{source}: {scope}.{name}"
            try:  # a name no session or profile can have would never match: a silent typo
                if scope == "session":
                    validate_session_name(name.removeprefix("cao-"))
                else:
                    validate_name(name, "profile")
            except InvalidInput as exc:
                raise UsageConfigError(f"{source}: [{scope}.{name!r}]: {exc.message}") from None
            same = session_name_for(name) if scope == "session" else name
            if (scope, same) in named:
                raise UsageConfigError(
                    f"{source}: [{scope}.{name}] and [{scope}.{named[scope, same]}] are the same {scope}; "
                    "keep one"
                )
            named[scope, same] = name
            if not isinstance(table, dict):
                raise UsageConfigError(
                    f"{where} must be a table (usd = 5.0, tokens = 2000000, warn_at = 0.8)"
                )
            bad = sorted(set(table) - {"usd", "tokens", "warn_at"})
            if bad:
                raise UsageConfigError(f"{where}: unknown key {bad[0]!r}; use usd, tokens, warn_at")
            if "usd" not in table and "tokens" not in table:
                raise UsageConfigError(f"{where}: give a limit: usd = 5.0 and/or tokens = 2000000")
            warn = _amount(table.get("warn_at", DEFAULT_WARN_AT), f"{where}.warn_at")
            if not 0 < warn <= 1:
                raise UsageConfigError(
                    f"{where}.warn_at is a fraction of the limit, 0 < warn_at ≤ 1, not {warn}"
                )
            usd = _amount(table["usd"], f"{where}.usd") if "usd" in table else None
            tokens = _amount(table["tokens"], f"{where}.tokens", whole=True) if "tokens" in table else None
            out.append(Budget(scope, name, usd, tokens, warn))
    return out


@dataclass
class Config:
    prices: dict[str, dict[str, float]]  # the user's ($CAO_HOME/prices.toml): before the built-in ones
    budgets: list[Budget]
    stamp: tuple[object, ...] = ()

    def price(self, model: str) -> dict[str, float] | None:
        """The model's prices: the user's table first, then the built-in one; in each, an exact
        name before a pattern, and the most specific pattern (most fixed characters) first."""
        if not model:
            return None
        for table in (self.prices, BUILTIN_PRICES):
            hits = [p for p in table if fnmatch.fnmatchcase(model, p)]
            if hits:
                return table[max(hits, key=lambda p: (p == model, len(p.replace("*", ""))))]
        return None


def _stamp(home: Path) -> tuple[object, ...]:
    out: list[object] = []
    for name in (PRICES_FILE, BUDGETS_FILE):
        try:
            st = (home / name).stat()
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


def load_config(home: Path) -> Config:
    """Both files, checked (raises ``UsageConfigError`` naming the file and the key)."""
    stamp = _stamp(home)
    user = parse_prices(_read_toml(home / PRICES_FILE), str(home / PRICES_FILE))
    budgets = parse_budgets(_read_toml(home / BUDGETS_FILE), str(home / BUDGETS_FILE))
    return Config(user, budgets, stamp)


# -- sums ------------------------------------------------------------------------------------------
@dataclass
class Totals:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    responses: int = 0
    cost_usd: float = 0.0
    unpriced: set[str] = field(default_factory=set)  # models with tokens and no price

    @property
    def tokens(self) -> int:
        """Every token the model handled: input, output, cache reads and writes."""
        return self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_write_tokens

    @property
    def cost(self) -> float | None:
        return None if self.unpriced else round(self.cost_usd, 6)

    @property
    def known_cost(self) -> float:
        """What the priced responses cost: all of it, or at least this when a model has no price."""
        return round(self.cost_usd, 6)

    def add(self, row: UsageRow, price: dict[str, float] | None) -> None:
        self.input_tokens += row.input_tokens
        self.output_tokens += row.output_tokens
        self.cache_read_tokens += row.cache_read_tokens
        self.cache_write_tokens += row.cache_write_tokens
        self.responses += row.responses
        if price is None:
            self.unpriced.add(row.model or "(no model named)")
            return
        self.cost_usd += (
            row.input_tokens * price["input"]
            + row.output_tokens * price["output"]
            + row.cache_read_tokens * price["cache_read"]
            + row.cache_write_tokens * price["cache_write"]
        ) / 1e6

    def as_dict(self) -> dict[str, object]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "tokens": self.tokens,
            "responses": self.responses,
            # unknown, never 0, when a model has no price (tokens are still counted)
            "cost_usd": self.cost,
            "unpriced_models": sorted(self.unpriced),
        }


def attribute(
    terminal_id: str, entries: Iterable[UsageEntry], windows: Sequence[tuple[str, float]]
) -> list[UsageRow]:
    """Sum a terminal's responses per (task attempt, model): a response belongs to the newest
    attempt that began before it ("" before the first); a response the CLI recorded twice
    (the same ``key``) counts once."""
    seen: set[str] = set()
    starts = sorted(windows, key=lambda w: w[1])
    sums: dict[tuple[str, str], list[Any]] = {}
    for e in entries:
        if e.key:
            if e.key in seen:
                continue
            seen.add(e.key)
        task = ""
        for task_id, at in starts:
            if at <= e.at:
                task = task_id
            else:
                break
        s = sums.setdefault((task, e.model), [0, 0, 0, 0, 0, None, None])
        for i, n in enumerate((e.input_tokens, e.output_tokens, e.cache_read_tokens, e.cache_write_tokens)):
            s[i] += min(max(0, n), MAX_PER_RESPONSE)
        s[4] += 1
        s[5] = e.at if s[5] is None else min(s[5], e.at)
        s[6] = e.at if s[6] is None else max(s[6], e.at)
    return [UsageRow(terminal_id, t, m, *v) for (t, m), v in sorted(sums.items())]


def _less(rows: Sequence[UsageRow], stored: Sequence[UsageRow]) -> bool:
    """Whether a reading has fewer responses or tokens than what is stored (its records shrank)."""

    def sums(rs: Sequence[UsageRow]) -> tuple[int, int]:
        tokens = sum(
            r.input_tokens + r.output_tokens + r.cache_read_tokens + r.cache_write_tokens for r in rs
        )
        return sum(r.responses for r in rs), tokens

    (n, t), (n0, t0) = sums(rows), sums(stored)
    return n < n0 or t < t0


# -- the book --------------------------------------------------------------------------------------
class UsageBook:
    """Reads every terminal's usage, keeps the totals in the store, applies the budgets."""

    def __init__(
        self,
        home: Path,
        store: Store,
        *,
        events: EventBus | None = None,
        clock: Callable[[], float],
        wake: Callable[[str], None] | None = None,
        skew: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.home = home
        self.store = store
        self.events = events
        self.clock = clock
        # the store's time minus this machine's wall clock (hosts sharing a store follow the
        # database's): the CLIs stamp their records with the wall clock, task windows are stored
        # in the store's time; a record's time is moved into the store's when first read
        self.skew = skew
        self.wake = wake  # a hold lifted: deliver its tasks now
        self.config = load_config(home)  # a broken file stops cao-server at start
        self._lock = threading.Lock()
        self._last = 0.0
        self._stored: dict[str, list[UsageRow] | None] = {}  # what this process last wrote per terminal
        self._seen: dict[str, dict[str, UsageEntry]] = {}  # every response read per terminal, by key

    def terminal_home(self, terminal_id: str) -> Path:
        return self.home / "terminals" / terminal_id  # LaunchContext.terminal_home (cao/launch.py)

    def _reload(self) -> None:
        if _stamp(self.home) == self.config.stamp:
            return
        try:
            self.config = load_config(self.home)
            logger.info("prices and budgets read again")
        except Exception as exc:  # keep the ones in effect; say why the edit didn't take
            self.config.stamp = _stamp(self.home)
            if not isinstance(exc, UsageConfigError):  # a check missed: still refused, with its trace
                logger.exception("prices/budgets not changed: %s unreadable", self.home)
            logger.error("prices/budgets not changed: %s", exc)
            if self.events is not None:
                self.events.publish("usage.config_error", error=str(exc))

    def read(self, terminal: Terminal) -> None:
        """Read one terminal's records again and store its totals."""
        try:
            provider = providers.get(terminal.provider)
        except Exception:
            return
        try:
            entries = provider.usage(self.terminal_home(terminal.id))
        except Exception:  # a reader's bug must not stop housekeeping: unknown, logged
            logger.exception("usage reader failed", extra={"terminal_id": terminal.id})
            entries = None
        seen = self._seen.setdefault(terminal.id, {})
        shift = self.skew()
        if entries is not None:  # money spent stays spent: a response read once counts even when
            for e in entries:  # its record is gone (the agent owns its HOME; a CLI prunes)
                key = e.key or repr(e)
                # its latest version (a reply rewritten with final counts), in the store's time as
                # when it was first read: a later step of the wall clock moves no counted response
                first = seen.get(key)
                seen[key] = e._replace(at=first.at if first is not None else e.at + shift)
            entries = list(seen.values())
        elif seen:
            entries = list(seen.values())
        if entries is None and terminal.usage_known == 1:
            return  # its records went (its HOME removed): keep what was read before
        rows = (
            None if entries is None else attribute(terminal.id, entries, self.store.task_windows(terminal.id))
        )
        if terminal.id in self._stored and self._stored[terminal.id] == rows:
            return  # nothing new: no write (every live terminal is read every 15 s)
        if (
            terminal.id not in self._stored
            and rows is not None
            and _less(rows, self.store.usage_rows([terminal.id]))
        ):
            return  # first read since cao-server started, and records were removed while it was down
        self.store.put_usage(terminal.id, rows)
        self._stored[terminal.id] = rows

    def refresh(self, terminal_ids: Sequence[str] | None = None) -> None:
        """Read the given terminals (default: every live one) and apply the budgets."""
        with self._lock:
            self._reload()
            # only this host's: their CLIs' records are on this machine
            rows = self.store.list_terminals(include_deleted=True, local=True)
            live = [t for t in rows if t.state == TerminalState.LIVE]
            for t in live:
                if terminal_ids is None or t.id in terminal_ids:
                    self.read(t)
            self._last = self.clock()
            self._apply_budgets([t for t in self.store.list_terminals(include_deleted=True)])

    def tick(self) -> None:
        if self.clock() - self._last >= REFRESH_EVERY:
            self.refresh()

    # -- views -------------------------------------------------------------------------------
    def totals(self, terminals: Sequence[Terminal]) -> tuple[Totals, int]:
        """Sum over terminals: (totals, how many of them have unknown usage)."""
        total = Totals()
        for row in self.store.usage_rows([t.id for t in terminals]):
            total.add(row, self.config.price(row.model))
        return total, sum(1 for t in terminals if t.usage_known == 0)

    def view(self, terminal: Terminal) -> dict[str, object]:
        """A terminal's usage for the API: totals, per task, per model, its budgets."""
        if terminal.usage_known == 0:
            return {"known": False, "why": f"{terminal.provider} records no token usage cao can read"}
        if terminal.usage_known is None:
            return {"known": False, "why": "not read yet"}
        rows = self.store.usage_rows([terminal.id])
        total, by_task, by_model = Totals(), dict[str, Totals](), dict[str, Totals]()
        for row in rows:
            price = self.config.price(row.model)
            for t in (
                total,
                by_task.setdefault(row.task_id, Totals()),
                by_model.setdefault(row.model, Totals()),
            ):
                t.add(row, price)
        return {
            "known": True,
            **total.as_dict(),
            "by_task": [{"task_id": k or None, **v.as_dict()} for k, v in by_task.items()],
            "by_model": [{"model": k or None, **v.as_dict()} for k, v in by_model.items()],
            "budget_hold": terminal.budget_hold,
        }

    def brief(self, terminal: Terminal) -> dict[str, object]:
        """What `cao status` shows per terminal: tokens and cost, or unknown."""
        if terminal.usage_known != 1:
            return {"tokens": None, "cost_usd": None, "budget_hold": terminal.budget_hold}
        total, _ = self.totals([terminal])
        return {"tokens": total.tokens, "cost_usd": total.cost, "budget_hold": terminal.budget_hold}

    def budgets_view(self) -> list[dict[str, object]]:
        terms = self.store.list_terminals(include_deleted=True)
        out: list[dict[str, object]] = []
        for b in self.config.budgets:
            for label, members in self._groups(b, terms):
                spent, unknown = self.totals(members)
                out.append(
                    {
                        "scope": b.scope,
                        "name": b.name,
                        "applies_to": label,
                        "usd": b.usd,
                        "tokens": b.tokens,
                        "warn_at": b.warn_at,
                        "spent_usd": spent.cost,
                        "spent_usd_known": spent.known_cost,  # at least this when a model has no price
                        "spent_tokens": spent.tokens,
                        "agents_unknown": unknown,
                        "state": self._state(b, spent)[0],
                    }
                )
        return out

    # -- budgets -----------------------------------------------------------------------------
    @staticmethod
    def _groups(b: Budget, terms: Sequence[Terminal]) -> list[tuple[str, list[Terminal]]]:
        if b.scope == "session":
            members = [t for t in terms if t.session_name == session_name_for(b.name)]
            return [(f"session {b.name}", members)] if members else []
        # a profile's budget is each agent's own
        return [(t.id, [t]) for t in terms if t.agent_profile == b.name]

    @staticmethod
    def _state(b: Budget, spent: Totals) -> tuple[str, str]:
        """("ok" | "warning" | "reached", the words for it)."""
        parts = []
        reached = warned = False
        if b.usd is not None:
            # a model with no price: what is known counts (it can only be more); unknown warns
            known = spent.known_cost
            if spent.unpriced:
                models = ", ".join(sorted(spent.unpriced))
                parts.append(f"at least ${known:.2f} of ${b.usd:.2f} (no price for {models})")
                warned = True
            else:
                parts.append(f"${known:.2f} of ${b.usd:.2f}")
            reached |= known >= b.usd
            warned |= known >= b.usd * b.warn_at
        if b.tokens is not None:
            parts.append(f"{spent.tokens:,} of {int(b.tokens):,} tokens")
            reached |= spent.tokens >= b.tokens
            warned |= spent.tokens >= b.tokens * b.warn_at
        words = f"{b.label} budget: {', '.join(parts)}"
        return ("reached" if reached else "warning" if warned else "ok"), words

    def _apply_budgets(self, terms: Sequence[Terminal]) -> None:
        holds: dict[str, str] = {}
        warns: dict[str, set[str]] = {}
        for b in self.config.budgets:
            for _label, members in self._groups(b, terms):
                spent, _ = self.totals(members)
                state, words = self._state(b, spent)
                for t in members:
                    if t.state != TerminalState.LIVE:
                        continue  # its spending counts; only a live agent is held or told
                    if state == "reached":
                        holds.setdefault(
                            t.id,
                            f"{words} reached: new tasks wait; raise it in {self.home / BUDGETS_FILE} "
                            "(read again within 15 s) or cancel them",
                        )
                    if state in ("reached", "warning"):  # told once per budget and state
                        key = f"{b.label}: {state}"
                        warns.setdefault(t.id, set()).add(key)
                        if key not in (t.budget_warned or "").split("\n"):
                            self._warn(t, words, state)
        for t in terms:
            if t.state != TerminalState.LIVE:
                continue
            hold = holds.get(t.id)
            warned = "\n".join(sorted(warns.get(t.id, set()))) or None
            if hold == t.budget_hold and warned == t.budget_warned:
                continue
            changed = self.store.set_budget_state(t.id, hold=hold, warned=warned)
            if changed and hold is None and self.wake is not None:
                self.wake(t.id)  # its held tasks may go now
            elif changed and hold is not None:
                self.store.hold_tasks(t.id, hold)

    def _warn(self, t: Terminal, words: str, state: str) -> None:
        logger.warning("budget %s: %s", state, words, extra={"terminal_id": t.id})
        if self.events is not None:
            self.events.publish(
                f"budget.{'reached' if state == 'reached' else 'warning'}", terminal_id=t.id, reason=words
            )
