"""Sources: tables fed each epoch by a connector (``CREATE TABLE ... WITH
(connector = ...)``): ``datagen`` (with ``mode = 'nexmark'``), ``cdc_files``
and ``delta_cdf``.

Invariant: a source's input reaches its table exactly once — each batch is
staged as DML together with the source's new offset in one meta-store
transaction, once per epoch, and applied by that epoch (see ``manager.py``).
"""

from .manager import CONNECTORS, DEAD_LETTER_SUFFIX, SourceDefinition, SourceManager

__all__ = ["SourceManager", "SourceDefinition", "CONNECTORS", "DEAD_LETTER_SUFFIX"]
