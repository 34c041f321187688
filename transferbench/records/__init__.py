"""Records of finished cells: the store (atomic, locked, resumable), selection of the reported setting
(aggregate) and the statistics of the tables (stats). Below the engine, which writes records, and reporting,
which reads them."""

from .store import FINISHED, RecordStore, Timeout, load_records

__all__ = ["FINISHED", "RecordStore", "Timeout", "load_records"]
