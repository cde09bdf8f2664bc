"""Long-document data for HMT: documents -> tokens -> training windows / document samples -> padded batches.

- `documents`: `load_documents` (Hub names such as "wikitext" / "emozilla/pg19" / "pile-arxiv", local files and
  folders, `prepare-data` output) -> `DatasetDict` with column "text", one row per whole document;
  `reassemble_wikitext_articles`, `split_by_document`.
- `windows`: `tokenize_documents`, `group_into_windows` (the paper's depth x L windows, stride L, over concatenated
  documents), `document_windows`, `HMTDataCollator`.
- `corpora`: `prepare_data("books"|"wiki"|"arxiv", output_dir)`, the offline corpora (`hmt-hf prepare-data`).
- `loaders`: `LongDocumentDataset` (alias `WikiTextDataset`), `LongContextDataLoader`, `create_dataloaders`.
"""

from .corpora import MissingCorpusSource, prepare_data
from .documents import load_documents, reassemble_wikitext_articles, split_by_document
from .loaders import LongContextDataLoader, LongDocumentDataset, WikiTextDataset, create_dataloaders
from .windows import HMTDataCollator, document_windows, group_into_windows, tokenize_documents, window_starts

__all__ = [
    "HMTDataCollator",
    "LongContextDataLoader",
    "MissingCorpusSource",
    "LongDocumentDataset",
    "WikiTextDataset",
    "create_dataloaders",
    "document_windows",
    "group_into_windows",
    "load_documents",
    "prepare_data",
    "reassemble_wikitext_articles",
    "split_by_document",
    "tokenize_documents",
    "window_starts",
]
