"""What a stateful pipeline's transform keeps in state, read from its SQL without a JVM.

A stateful pipeline (a watermark, deduplication or an output mode: see
`jobs.spec.model.Transform`) runs its transform over the stream, so Spark keeps every open
group of an aggregation in its state store across batches. Spark analyses such a query only
when it starts, and refuses some shapes then (an aggregation in append mode without a
watermark); others it runs with state that grows without bound (a running count per key that
no watermark can ever finish). Both are reported here when the pipeline is saved, from the
SQL's shape (sqlglot, after `jobs.spec.sql.check_transform_sql` has accepted it):

* on a stream, no window functions (`... OVER (...)`), no ORDER BY, LIMIT, joins,
  `SELECT DISTINCT`, `UNION` without ALL, INTERSECT or EXCEPT: Spark refuses them or keeps
  every row they have seen (deduplication goes through `source.deduplicate`, bounded by
  the watermark);
* an aggregation must group by event time: the watermark column, or `window()` /
  `session_window()` over it, so that the watermark finishes its groups and drops their
  state.

It is conservative like the column check of `jobs.spec.sql`: where it cannot tell (grouping by
a column of a subquery or CTE), it accepts and leaves the verdict to Spark's analyzer, whose
refusal at start is a definition error (no restart loop).

`group_key` also tells which output columns are the group key (for an upsert in update mode),
when the query is one plain SELECT ... FROM source GROUP BY ...
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot import exp

from .functions import ALLOWED_BY_GROUP
from .sql import SQLError, call_name, parse_query

AGGREGATES = frozenset(ALLOWED_BY_GROUP["agg_funcs"].split())
_PARTITIONING_HINT = re.compile(r"\b(COALESCE|REPARTITION\w*|REBALANCE)\b", re.I)
TIME_WINDOWS = frozenset({"window", "session_window"})


@dataclass(frozen=True)
class Shape:
    """The stateful facts of a transform."""

    # Whether some SELECT aggregates (GROUP BY, or an aggregate function).
    aggregates: bool
    # Whether every aggregation groups by event time; None where it cannot be told.
    time_grouped: bool | None
    # The GROUP BY items of the outermost SELECT, as written (empty when it has none).
    group_items: tuple[str, ...] = ()
    # Output column (lower case) -> the GROUP BY item it is: only when the query is one
    # plain SELECT ... FROM source GROUP BY ..., else None.
    key_columns: dict[str, int] | None = None
    # Whether some aggregation groups by session_window() (append output only, in Spark).
    session_windows: bool = False


def stream_shape(sql: str, watermark: str | None, source_view: str = "source") -> Shape:
    """The transform's stateful shape; raises SQLError for what cannot run on a stream."""
    statement = parse_query(sql)
    for node in statement.walk():
        _refuse_unsupported(node)
    verdicts = [
        _time_grouped(select, watermark, source_view)
        for select in statement.find_all(exp.Select)
        if _aggregates(select)
    ]
    time_grouped: bool | None = True
    if False in verdicts:
        time_grouped = False
    elif None in verdicts:
        time_grouped = None
    items: tuple[str, ...] = ()
    keys = None
    if isinstance(statement, exp.Select) and statement.args.get("group"):
        group = _group_items(statement)
        items = tuple(g.sql(dialect="spark", normalize_functions="lower") for g in group)
        if _reads_view(statement, source_view):
            keys = _key_columns(statement, group, source_view)
    sessions = any(
        call_name(node) == "session_window"
        for select in statement.find_all(exp.Select)
        if select.args.get("group")
        for item in _group_items(select)
        for node in item.walk()
    )
    return Shape(bool(verdicts), time_grouped if verdicts else None, items, keys, sessions)


def _group_items(select: exp.Select) -> list[exp.Expr]:
    """The GROUP BY items, ordinals (GROUP BY 1, 2: Spark's default) read as the select
    list's expressions they point at."""
    projections = select.expressions
    group = select.args["group"]
    if group.args.get("all"):
        # GROUP BY ALL: every item of the select list that does not aggregate.
        return [
            p.this if isinstance(p, exp.Alias) else p for p in projections if not _has_aggregate(p)
        ]
    items = []
    for item in group.expressions:
        if isinstance(item, exp.Literal) and not item.is_string and item.this.isdigit():
            n = int(item.this)
            if 1 <= n <= len(projections):
                projection = projections[n - 1]
                item = projection.this if isinstance(projection, exp.Alias) else projection
        items.append(item)
    return items


def _refuse_unsupported(node: exp.Expr) -> None:
    if isinstance(node, exp.Window):
        raise SQLError(
            "window functions (... OVER (...)) do not run on a stream: aggregate by event "
            "time with GROUP BY window(<time column>, '5 minutes') instead"
        )
    if isinstance(node, exp.Order) and not isinstance(node.parent, exp.Window | exp.WithinGroup):
        raise SQLError(
            "ORDER BY does not run on a stream (Spark sorts a stream only in complete mode, "
            "which rewrites every group each batch): sort where the sink is read"
        )
    if isinstance(node, exp.Limit | exp.Fetch):
        raise SQLError(
            "LIMIT does not run on a stateful stream: once reached, the pipeline would never "
            "write again"
        )
    if isinstance(node, exp.Join):
        raise SQLError(
            "joins are not supported in a stateful pipeline (the stream joined with itself "
            "keeps both sides in state)"
        )
    if isinstance(node, exp.Rollup | exp.Cube | exp.GroupingSets):
        raise SQLError(
            "ROLLUP, CUBE and GROUPING SETS do not run on a stream: write one aggregation "
            "per pipeline"
        )
    if isinstance(node, exp.TableSample) or (
        isinstance(node, exp.Hint) and _PARTITIONING_HINT.search(node.sql(dialect="spark"))
    ):
        raise SQLError(
            "sampling and COALESCE / REPARTITION hints are refused in a stateful pipeline: "
            "a replayed batch could be cut differently, and its output written twice or lost"
        )
    if isinstance(node, exp.Intersect | exp.Except):
        raise SQLError(f"{node.key.upper()} does not run on a stream")
    if isinstance(node, exp.Union) and node.args.get("distinct"):
        raise SQLError(
            "UNION (without ALL) keeps every distinct row in state forever: use UNION ALL, "
            "and source.deduplicate to drop duplicates within the watermark"
        )
    if isinstance(node, exp.Distinct) and isinstance(node.parent, exp.Func):
        raise SQLError(
            "distinct aggregates (count(DISTINCT ...)) do not run on a stream: use "
            "approx_count_distinct(...), a HyperLogLog count with a small fixed state"
        )
    if isinstance(node, exp.Select) and node.args.get("distinct"):
        raise SQLError(
            "SELECT DISTINCT keeps every distinct row in state forever: use "
            "source.deduplicate (bounded by the watermark), or GROUP BY a window"
        )


def _own_nodes(select: exp.Select):
    """The nodes of a SELECT, not those of the queries nested in it."""
    return select.walk(prune=lambda n: n is not select and isinstance(n, exp.Query))


def _has_aggregate(node: exp.Expr) -> bool:
    return any(
        isinstance(n, exp.AggFunc) or (call_name(n) or "") in AGGREGATES
        for n in node.walk()
        if isinstance(n, exp.Func)
    )


def _aggregates(select: exp.Select) -> bool:
    if select.args.get("group"):
        return True
    for node in _own_nodes(select):
        if node is select or not isinstance(node, exp.Func):
            continue
        if isinstance(node, exp.AggFunc) or (call_name(node) or "") in AGGREGATES:
            return True
    return False


def _reads_view(select: exp.Select, source_view: str) -> bool:
    """Whether the SELECT reads the source view directly (FROM source [alias])."""
    source = select.args.get("from_") or select.args.get("from")
    table = source.this if source is not None else None
    return (
        isinstance(table, exp.Table)
        and not table.args.get("db")
        and table.name.lower() == source_view.lower()
        and not select.args.get("joins")
        and not select.args.get("laterals")
    )


def _is_event_time(node: exp.Expr, watermark: str) -> bool:
    """The watermark column, or window()/session_window() over it."""
    if isinstance(node, exp.Column):
        return node.name.lower() == watermark.lower()
    if (call_name(node) or "") in TIME_WINDOWS:
        args = node.expressions if isinstance(node, exp.Anonymous) else [node.this]
        return bool(args) and _is_event_time(args[0], watermark)
    return False


def _time_grouped(select: exp.Select, watermark: str | None, source_view: str) -> bool | None:
    if not _reads_view(select, source_view):
        return None  # its columns come from a subquery or CTE: Spark will tell
    if watermark is None:
        return False
    group = select.args.get("group")
    if group is None:
        return False  # a global aggregate: one group, never finished
    aliases = {p.alias.lower(): p.this for p in select.expressions if isinstance(p, exp.Alias)}
    # A name that is the event-time column is that column, not a select alias of it (Spark
    # resolves GROUP BY names against the input's columns first).
    aliases.pop(watermark.lower(), None)
    items = [_resolve(item, aliases) for item in _group_items(select)]
    if len(items) == 1 and call_name(items[0]) == "session_window":
        raise SQLError(
            "a session window needs other grouping keys beside it (Spark does not run a "
            "global aggregation by session window on a stream): GROUP BY "
            "session_window(...), user_id"
        )
    return any(_is_event_time(item, watermark) for item in items)


def _resolve(item: exp.Expr, aliases: dict[str, exp.Expr]) -> exp.Expr:
    """A GROUP BY item that names an output alias, as the alias's expression."""
    if isinstance(item, exp.Column) and not item.table and item.name.lower() in aliases:
        return aliases[item.name.lower()]
    return item


def _key_columns(select: exp.Select, group: list[exp.Expr], source_view: str) -> dict[str, int]:
    """Output column (lower case) -> the index of the GROUP BY item it is."""
    qualifiers = {source_view.lower()}
    table = (select.args.get("from_") or select.args.get("from")).this
    if table.alias:
        qualifiers.add(table.alias.lower())
    items = [_canonical(item, qualifiers) for item in group]
    out: dict[str, int] = {}
    for projection in select.expressions:
        name = projection.alias_or_name.lower()
        value = projection.this if isinstance(projection, exp.Alias) else projection
        # A window's start (or end) stands for its window: window(at, '1 hour').start AS hour
        # keys the group as the window itself does (a sink that cannot hold a struct).
        bound = _window_bound(value)
        for i, item in enumerate(group):
            if (
                _canonical(value, qualifiers) == items[i]
                or _same_group_item(value, item, projection)
                or (bound is not None and _canonical(bound, qualifiers) == items[i])
            ):
                out[name] = i
                break
    return out


def _window_bound(node: exp.Expr) -> exp.Expr | None:
    """The window() (or session_window()) call whose `.start` or `.end` `node` is, if any."""
    if (
        isinstance(node, exp.Dot)
        and node.name.lower() in ("start", "end")
        and call_name(node.this) in ("window", "session_window")
    ):
        return node.this
    return None


def _canonical(node: exp.Expr, qualifiers: set[str]) -> str:
    """An expression's SQL with its column names as Spark resolves them: case-insensitive,
    back-quoted or not, qualified by the source view (or its alias) or not."""
    node = node.copy()
    for column in list(node.find_all(exp.Column)):
        if column.table and column.table.lower() in qualifiers:
            column.set("table", None)
        column.set("this", exp.to_identifier(column.name.lower()))
    return node.sql(dialect="spark", normalize_functions="lower")


def _same_group_item(value: exp.Expr, item: exp.Expr, projection: exp.Expr) -> bool:
    if (
        isinstance(item, exp.Column)
        and not item.table
        and isinstance(projection, exp.Alias)
        and item.name.lower() == projection.alias.lower()
    ):
        return True  # GROUP BY an output alias
    window = call_name(item)
    if window in TIME_WINDOWS and isinstance(value, exp.Column):
        # `window`, `window.start`, `window.end`: the window's column and its bounds.
        if not value.table:
            return value.name.lower() == window
        return value.table.lower() == window and value.name.lower() in {"start", "end"}
    if isinstance(item, exp.Column) and isinstance(value, exp.Column):
        return value.name.lower() == item.name.lower() and not (value.table and item.table)
    return False
