"""SQL: from statement text to MV plans.

``frontend`` (statements), ``rewrite`` (query rewrites of the same meaning: derived
tables, CTEs, UNION, comma joins, TUMBLE/HOP), ``subqueries`` (subqueries as joins
with derived tables), ``sql_tree`` (questions about a query tree), ``planner`` (an
MV's plan: leaves, join, row stage, aggregate, window, keys and state tables),
``links`` (an MV's internal links: join chains, derived tables, a top-N's input).
"""
