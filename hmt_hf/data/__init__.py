"""Long-document data for HMT: documents -> tokens -> training windows / document samples -> padded batches.

- `windows`: `tokenize_documents`, `group_into_windows` (the paper's depth x L windows, stride L),
  `document_windows`, `HMTDataCollator`.
"""

from .windows import HMTDataCollator, document_windows, group_into_windows, tokenize_documents, window_starts

__all__ = [
    "HMTDataCollator",
    "document_windows",
    "group_into_windows",
    "tokenize_documents",
    "window_starts",
]
