"""Dataset loaders and sampling: every source becomes one `Example` shape.

HotpotQA and TriviaQA come in several layouts (the official JSON releases, the Hugging Face hub rows, the
JSONL exports of either, a generic question/answer layout), detected per row by `rows_to_examples`,
which the hub loader also uses: tests run the hub code path on local files, as the hub is unreachable here.
A dataset of one's own is a local file in the generic layout: JSON/JSONL read here line by line (errors name
`file:line`), CSV and Parquet read by the `datasets` library; a source's `columns` renames its columns to the
fields the layouts read, and its `metric` says how its answers are scored (`distill.core.metrics`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import re
import tempfile
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_serializer
from pydantic.dataclasses import dataclass

from distill.core import traces
from distill.core.config import Strict
from distill.core.errors import DistillError, clip
from distill.core.metrics import DATASET_RULES, Metric, metric_for
from distill.core.secrets import url_refusal
from distill.core.store import describe, iter_jsonl, refuse_lone_surrogates

# A question longer than this is refused unless the source sets its own `max_question_chars`: HotpotQA and
# TriviaQA questions are well under 1,000 characters, and every character of one is paid for on every call.
DEFAULT_MAX_QUESTION_CHARS = 4000


# The fields a `columns` mapping may fill: what the row layouts read.
Column = Literal["question", "answer", "answers", "aliases", "id", "context", "supporting_facts", "type", "level"]
ColumnName = Annotated[str, Field(min_length=1, max_length=256)]
LOCAL_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet")
_TABLE_BUILDERS = {".csv": "csv", ".parquet": "parquet"}  # read by the `datasets` library's packaged builders


class DatasetSource(Strict):
    """Where questions come from: `hub:<name>[:<config>]` or a local .json/.jsonl/.csv/.parquet file; which of
    its columns hold what distill reads (`columns`) and the rules its answers are scored by (`metric`)."""

    name: Literal["hotpotqa", "triviaqa"] | str
    """hotpotqa, triviaqa or a name of your own (which then needs a metric)"""
    source: str
    """hub:<name>[:<config>] or a local .json, .jsonl, .csv or .parquet file"""
    split: str = "train"
    """the hub split to read"""
    n: int | None = Field(default=None, ge=1)
    """distinct questions to draw; null: all (with leak_policy exclude, all but the eval questions)"""
    max_question_chars: int = Field(default=DEFAULT_MAX_QUESTION_CHARS, ge=1)
    """a longer question is refused when loaded"""
    columns: dict[Column, ColumnName] | None = None
    """distill's field -> the file's column, e.g. {question: prompt, answer: target, id: qid}"""
    metric: Metric | None = Field(default=None, validate_default=True)
    """scoring rules: hotpotqa, triviaqa or em_f1; null: the rules of the name (hotpotqa, triviaqa), refused for any
    other name"""

    @field_validator("metric")
    @classmethod
    def _scored(cls, metric: str | None, info: ValidationInfo) -> str | None:
        if "name" in info.data:  # else the name itself was refused
            try:
                metric_for(info.data["name"], metric)
            except DistillError as exc:
                raise ValueError(str(exc)) from None
        return metric

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        """Settings fingerprints (distill.core.run) hash this dump: `columns` and `metric` are left out when unset,
        so a run made before they existed is still recognised as made with these settings."""
        data = handler(self)
        for key in ("columns", "metric"):
            if key in data and data[key] is None:
                del data[key]
        return data


EXPECTED_LAYOUTS = ("rows with `question` plus `answer`/`answers` (generic), HotpotQA rows (`_id`, `context`, "
                    "`supporting_facts` as lists or hub dicts) or TriviaQA rows (`Question`/`Answer` official, "
                    "`answer` dict hub, or `answer` + `aliases` JSONL)")


def _bad_characters(text: str) -> list[str]:
    """C0 control characters other than tab and line breaks, DEL, and lone surrogates (which no file can
    hold). C1 controls pass: real TriviaQA questions hold them where cp1252 quotes were mis-decoded."""
    return [ch for ch in text if (ch < " " and ch not in "\t\n\r") or ch == "\x7f" or "\ud800" <= ch <= "\udfff"]


@dataclass(config=ConfigDict(strict=True))
class Example:
    """One question with every accepted answer, whatever source it came from: the dataset row after layout
    detection, the one shape generation and evaluation read. A row a model should never be sent (an empty
    question, one with control characters, one with no usable gold answer) fails here, at load time."""

    id: Annotated[str, Field(min_length=1)]
    dataset: str
    split: str
    question: str
    answers: list[str]
    context: list[tuple[str, list[str]]] | None = None
    supporting_facts: list[tuple[str, int]] | None = None
    type: str | None = None
    level: str | None = None
    metric: Metric | None = None  # scoring rules (distill.core.metrics); a hotpotqa/triviaqa dataset's by default

    def __post_init__(self) -> None:
        if self.metric is None and self.dataset in DATASET_RULES:
            self.metric = self.dataset

    @field_validator("question")
    @classmethod
    def _askable(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the question is empty")
        if bad := _bad_characters(value):
            raise ValueError(f"the question holds the control character U+{ord(bad[0]):04X}")
        return value

    @field_validator("answers")
    @classmethod
    def _usable(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("no usable gold answer (every answer is blank or missing)")
        if any(not a.strip() for a in value):
            raise ValueError("a gold answer is blank")
        if any(_bad_characters(a) for a in value):
            raise ValueError("a gold answer holds a control character")
        return value


# Question normalisation, dedup and the leak guard


def normalize_question(question: str) -> str:
    """Key for dedup and leak checks: case, punctuation, unicode width and spacing differences don't count.
    Idempotent, so already-normalised sets can be passed back in."""
    text = unicodedata.normalize("NFKC", question).casefold()
    text = re.sub(r"[^\w\s]|_", " ", text)
    return " ".join(text.split())


def dedup_examples(examples: Iterable[Example]) -> list[Example]:
    """Keep the first example of each normalised question, so repeated questions don't weigh double."""
    first: dict[str, Example] = {}
    for ex in examples:
        first.setdefault(normalize_question(ex.question), ex)
    return list(first.values())


def question_set(items: Iterable[Example] | Iterable[str]) -> set[str]:
    """Normalised questions, the unit the leak guard and `sample_mix(exclude_questions=...)` compare."""
    return {normalize_question(x if isinstance(x, str) else x.question) for x in items}


def check_no_leak(train: Iterable[Example], eval_examples: Iterable[Example] | set[str]) -> None:
    """Refuse a training set that shares questions with the evaluation set: scores would be inflated."""
    eval_keys = question_set(eval_examples)
    leaked = [ex.question for ex in train if normalize_question(ex.question) in eval_keys]
    if leaked:
        shown = "; ".join(repr(q) for q in leaked[:3])
        raise DistillError(f"{len(leaked)} training question(s) also appear in the evaluation set, e.g. {shown}")


def sample_mix(pools: list[tuple[list[Example], int | None]], seed: int,
               exclude_questions: Iterable[str] = ()) -> list[Example]:
    """Draw `n` examples from each pool (None: every question not excluded or drawn already), never repeating a
    question across pools or using an excluded one. Each pool gets its own RNG from (seed, pool index), so
    resizing one pool leaves the earlier pools' draws unchanged; the final order is shuffled so datasets
    interleave in training. Asking for more than a pool can give is an error rather than a silently smaller
    experiment."""
    taken = question_set(exclude_questions)
    mix: list[Example] = []
    for index, (pool, n) in enumerate(pools):
        candidates = dedup_examples(pool)  # distinct within the pool, so only earlier pools can collide
        random.Random(f"{seed}:{index}").shuffle(candidates)
        fresh = (ex for ex in candidates if normalize_question(ex.question) not in taken)
        picked = list(itertools.islice(fresh, n))
        taken |= question_set(picked)
        if n is None and not picked:
            name = pool[0].dataset if pool else "empty"
            raise DistillError(f"pool {index} ({name}): every question is excluded or already drawn")
        if n is not None and len(picked) < n:
            name = pool[0].dataset if pool else "empty"
            raise DistillError(f"pool {index} ({name}) has only {len(picked)} unused distinct questions, {n} requested")
        mix.extend(picked)
    random.Random(f"{seed}:mix").shuffle(mix)
    return mix


# Row layouts


def detect_layout(row: Mapping[str, Any]) -> str | None:
    """Name the layout of one row, or None. Missing keys and None values (Arrow fill-ins) count alike."""
    if row.get("Question") is not None:
        return "triviaqa-official"
    if not isinstance(row.get("question"), str):
        return None
    context, facts, answer = row.get("context"), row.get("supporting_facts"), row.get("answer")
    if isinstance(context, Mapping) or isinstance(facts, Mapping):
        return "hotpotqa-hub"
    if isinstance(answer, Mapping):
        return "triviaqa-hub"
    if isinstance(answer, str) and isinstance(row.get("aliases"), list):
        return "triviaqa-jsonl"
    if row.get("_id") is not None or isinstance(context, list) or isinstance(facts, list):
        return "hotpotqa-official"
    if answer is not None or row.get("answers") is not None:
        return "generic"
    return None


def check_unique_ids(examples: Iterable[Example], origin: str = "the datasets") -> None:
    """Ids key the records (a resumed run skips an id it holds), so two questions under one id would run both
    and keep one: refused, whichever stage loads them."""
    if twice := [i for i, count in Counter(ex.id for ex in examples).items() if count > 1]:
        raise DistillError(f"example id {twice[0]!r} occurs twice across {origin}; ids key the records")


def rows_to_examples(rows: Iterable[Mapping[str, Any]], dataset: str | None, split: str,
                     origin: str = "<rows>", max_question_chars: int = DEFAULT_MAX_QUESTION_CHARS,
                     lines: Iterable[int] | None = None, columns: Mapping[str, str] | None = None,
                     metric: str | None = None) -> list[Example]:
    """Rows of any supported layout to Examples, deduplicated by normalised question. `dataset=None` takes the
    dataset from each row's layout; a HotpotQA/TriviaQA label that contradicts a row's layout is an error,
    because scoring rules follow the label. `columns` (field -> column) renames each row's columns first;
    `metric` is the examples' scoring rules. `origin` names the source in errors, `lines` (a JSONL file's line
    numbers) the row as `origin:line`. Every row is checked before any is returned: a bad one is one error."""
    numbers = iter(lines) if lines is not None else None
    examples, where_of, first_of = [], {}, {}
    for index, row in enumerate(rows):
        where = f"{origin}:{next(numbers)}" if numbers is not None else f"{origin}: row {index + 1}"
        if columns and isinstance(row, Mapping):
            row = _renamed(row, columns, where)
        layout = detect_layout(row) if isinstance(row, Mapping) else None
        if layout is None:
            keys = sorted(row) if isinstance(row, Mapping) else type(row).__name__
            raise DistillError(clip(f"{where} has an unknown layout (keys: {keys}); expected {EXPECTED_LAYOUTS}", 800))
        implied = layout.partition("-")[0]  # each layout is named after its dataset, or "generic"
        if implied != "generic" and dataset in ("hotpotqa", "triviaqa") and dataset != implied:
            raise DistillError(f"{where} is in the {layout} layout but the dataset is {dataset!r}")
        question = row.get("Question") if layout == "triviaqa-official" else row.get("question")
        if isinstance(question, str) and len(question) > max_question_chars:
            raise DistillError(f"{where}: field `question`: {len(question)} characters, more than "
                               f"max_question_chars ({max_question_chars})")
        try:
            example = _to_example(layout, row, implied if dataset is None else dataset, split, metric)
        except ValidationError as exc:
            raise DistillError(clip(f"{where}: {describe(exc.errors(include_url=False))}", 500)) from None
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
            raise DistillError(clip(f"{where} looks like the {layout} layout but is malformed "
                                    f"({type(exc).__name__}: {exc})", 500)) from None
        key = normalize_question(example.question)
        if key in first_of:
            continue  # a repeated question: the first is kept, so repeats don't weigh double
        if example.id in where_of:
            raise DistillError(f"{where}: id {example.id!r} is also the id of another question, at "
                               f"{where_of[example.id]}; ids key the records")
        first_of[key], where_of[example.id] = example, where
        examples.append(example)
    return examples


def _renamed(row: Mapping[str, Any], columns: Mapping[str, str], where: str) -> dict[str, Any]:
    """The row with each mapped column under the field it fills (over a column of that name, if any)."""
    for field, column in columns.items():
        if column not in row:
            raise DistillError(clip(f"{where}: no column {column!r}, which columns.{field} names "
                                    f"(columns here: {', '.join(map(str, row))})", 500))
    mapped = set(columns.values())
    return {k: v for k, v in row.items() if k not in mapped} | {f: row[c] for f, c in columns.items()}


def _answers(*groups: Any) -> list[str]:
    """Flatten answer strings and lists, gold first, dropping blanks and exact repeats."""
    out: list[str] = []
    for group in groups:
        for item in group if isinstance(group, list) else ([] if group is None else [group]):
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                raise TypeError(f"an answer must be text or a number, not {type(item).__name__}")
            text = item.strip() if isinstance(item, str) else str(item)
            if text and text not in out:
                out.append(text)
    return out


def _to_example(layout: str, row: Mapping[str, Any], dataset: str, split: str, metric: str | None = None) -> Example:
    """Where each layout keeps the id, answers and evidence; `context` and `facts` end as (title, sentences)
    and (title, index) pairs."""
    context = facts = None
    match layout:
        case "hotpotqa-official":  # list pairs: context [[title, [sents]]], supporting_facts [[title, index]]
            id_keys, answers = ("_id", "id"), _answers(row.get("answer"), row.get("answers"))
            context, facts = row.get("context"), row.get("supporting_facts")
        case "hotpotqa-hub":  # dicts of columns: context {title, sentences}, supporting_facts {title, sent_id}
            id_keys, answers = ("id", "_id"), _answers(row.get("answer"))
            if (columns := row.get("context")) is not None:
                context = zip(columns["title"], columns["sentences"])
            if (columns := row.get("supporting_facts")) is not None:
                facts = zip(columns["title"], columns["sent_id"])
        case "triviaqa-official":  # Data[]: Question, QuestionId, Answer{Value, Aliases}
            answer = row.get("Answer") or {}
            id_keys, answers = ("QuestionId",), _answers(answer.get("Value"), answer.get("Aliases"))
        case "triviaqa-hub":  # question_id, question, answer{value, aliases, normalized_aliases}
            id_keys, answers = ("question_id", "id"), _answers(row["answer"].get("value"), row["answer"].get("aliases"))
        case "triviaqa-jsonl":  # id, question, answer, aliases, normalized_aliases
            id_keys, answers = ("id", "question_id"), _answers(row["answer"], row.get("aliases"))
        case _:  # generic: question plus answer (str) or answers (list)
            id_keys, answers = ("id", "_id", "question_id"), _answers(row.get("answer"), row.get("answers"))
    question = row["Question"] if layout == "triviaqa-official" else row["question"]
    hotpot = not layout.startswith("triviaqa")
    ids = [str(row[key]) for key in id_keys if row.get(key) is not None and str(row[key])]
    digest = hashlib.sha1(normalize_question(question).encode()).hexdigest()[:16]
    return Example(
        id=ids[0] if ids else f"{dataset}-{digest}",  # without the source's id, a hash: reruns give the same id
        dataset=dataset,
        split=split,
        question=question,
        answers=answers,
        context=None if context is None else [(str(t), [str(s) for s in sents]) for t, sents in context],
        supporting_facts=None if facts is None else [(str(t), int(i)) for t, i in facts],
        type=row.get("type") if hotpot else None,
        level=row.get("level") if hotpot else None,
        metric=metric,
    )


# Sources


def load_source(ds: DatasetSource, limit: int | None = None) -> list[Example]:
    """The examples of one configured dataset entry: every stage loads its `datasets` through here."""
    return load_examples(ds.source, ds.name, ds.split, limit=limit, max_question_chars=ds.max_question_chars,
                         columns=ds.columns, metric=ds.metric)


def load_examples(source: str | os.PathLike, dataset: str | None, split: str, limit: int | None = None,
                  data_files: str | list[str] | None = None,
                  max_question_chars: int = DEFAULT_MAX_QUESTION_CHARS,
                  columns: Mapping[str, str] | None = None, metric: str | None = None) -> list[Example]:
    """The first `limit` distinct questions of `hub:<name>[:<config>]` or a local .json/.jsonl/.csv/.parquet
    file (by its extension), or a served agent's traces folder (`distill.core.traces`: its questions with feedback that
    gives a right answer). `data_files` goes to `datasets.load_dataset`, so a packaged builder such as
    `hub:json` or `hub:parquet` reads local files through exactly the code path used for the hub."""
    source = os.fspath(source)
    rules = {"max_question_chars": max_question_chars, "columns": columns, "metric": metric}
    if source.startswith("hub:"):
        return _some(_load_hub(source, dataset, split, data_files, **rules), source)[:limit]
    if data_files is not None:
        raise DistillError(f"data_files only applies to hub:<name> sources, not {source!r}")
    path = Path(source)
    expected = "/".join(LOCAL_SUFFIXES)
    if path.is_dir():
        if not traces.is_traces_folder(path):
            raise DistillError(f"{path} is a folder without trace files (traces-NNNNNN.jsonl); a dataset source is "
                               f"a {expected} file, a served agent's traces folder, or hub:<name>[:<config>]")
        numbered = list(traces.training_rows(path))
        if not numbered:
            raise DistillError(f"{path}: no served question has feedback with a right answer yet (POST /v1/feedback "
                               "with {id, correct: true} or {id, answer}), so there is nothing to learn from")
        examples = rows_to_examples([row for _, row in numbered], dataset, split, origin=str(path), **rules)
        return _some(examples, str(path))[:limit]
    if not path.is_file():
        raise DistillError(f"data file not found: {path} (expected a {expected} file, or hub:<name>[:<config>])")
    suffix = path.suffix.lower()
    if suffix not in LOCAL_SUFFIXES:
        raise DistillError(f"{path}: unknown file type {path.suffix!r}; expected {expected}")
    if suffix in _TABLE_BUILDERS:
        examples = rows_to_examples(_read_table(path, _TABLE_BUILDERS[suffix], columns), dataset, split,
                                    origin=str(path), **rules)
    elif suffix == ".jsonl":
        numbered = list(iter_jsonl(path))
        examples = rows_to_examples([row for _, row in numbered], dataset, split, origin=str(path),
                                    lines=[n for n, _ in numbered], **rules)
    else:
        examples = rows_to_examples(_read_json(path), dataset, split, origin=str(path), **rules)
    return _some(examples, str(path))[:limit]


def _some(examples: list[Example], origin: str) -> list[Example]:
    if not examples:
        raise DistillError(f"{origin}: no questions in it")
    return examples


def _load_hub(source: str, dataset: str | None, split: str, data_files: str | list[str] | None,
              **rules: Any) -> list[Example]:
    name, _, config = source[len("hub:") :].partition(":")
    if not name:
        raise DistillError(f"bad source {source!r}: expected hub:<name>[:<config>]")

    if refusal := url_refusal("HF_ENDPOINT", os.environ.get("HF_ENDPOINT"), "the environment variable HF_TOKEN"):
        raise DistillError(refusal)  # the datasets library would send its user:password and quote it in errors
    import datasets

    try:
        rows = datasets.load_dataset(name, config or None, split=split, data_files=data_files)
    except (OSError, ValueError) as exc:
        raise DistillError(f"cannot load {source} split {split!r} with the datasets library "
                           f"({type(exc).__name__}: {exc}); use a local .json/.jsonl file instead") from exc
    _check_columns(rows.column_names, rules.get("columns"), source)
    return rows_to_examples(rows, dataset, split, origin=source, **rules)


def _read_table(path: Path, builder: str, columns: Mapping[str, str] | None) -> list[dict[str, Any]]:
    """The rows of a CSV or Parquet file, read by the `datasets` library. A CSV cell is the text it holds:
    "007" stays "007" and "NA" or "None" stays text, rather than pandas reading numbers and missing values in.
    The library's cache is a folder of its own, removed once the rows are read, and its log and progress bars
    are off meanwhile: a file it cannot read is one line, said here."""
    import datasets

    names, empty = _table_head(path, builder)
    _check_columns(names, columns, str(path))
    if empty:
        return []
    options: dict[str, Any] = {}
    if builder == "csv":
        options = {"features": datasets.Features({name: datasets.Value("string") for name in names}),
                   "na_filter": False}
    verbosity, bars = datasets.logging.get_verbosity(), datasets.is_progress_bar_enabled()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    datasets.disable_progress_bars()
    try:
        with tempfile.TemporaryDirectory(prefix="distill-data-") as cache:
            table = datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=cache,
                                          keep_in_memory=True, **options)
            return list(table)
    except (OSError, ValueError, datasets.exceptions.DatasetGenerationError) as exc:
        raise DistillError(clip(f"{path}: not a readable {builder.upper()} file ({_cause(exc)})", 500)) from None
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars:
            datasets.enable_progress_bars()


def _table_head(path: Path, builder: str) -> tuple[list[str], bool]:
    """A CSV or Parquet file's column names, as the `datasets` builders read them, and whether it has no rows."""
    try:
        if builder == "csv":
            import pandas

            head = pandas.read_csv(path, nrows=1, dtype=str, na_filter=False)
            return [str(name) for name in head.columns], head.empty
        import pyarrow.parquet

        meta = pyarrow.parquet.read_metadata(path)
        return list(meta.schema.to_arrow_schema().names), meta.num_rows == 0
    except (OSError, ValueError) as exc:  # pandas' parser, decoding and Arrow's errors are ValueErrors
        raise DistillError(clip(f"{path}: not a readable {builder.upper()} file ({_cause(exc)})", 500)) from None


def _cause(exc: BaseException) -> str:
    """The innermost cause of a library error (the `datasets` library wraps the parser's), as `Type: message`."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__
    return f"{type(exc).__name__}: {exc}"


def _check_columns(names: Iterable[str], columns: Mapping[str, str] | None, origin: str) -> None:
    """Every column a `columns` mapping names is one of the table's: else one line naming the column."""
    names = list(names)
    for field, column in (columns or {}).items():
        if column not in names:
            raise DistillError(clip(f"{origin}: no column {column!r}, which columns.{field} names "
                                    f"(its columns: {', '.join(names)})", 500))


def _read_json(path: Path) -> list[Any]:
    """The official releases: HotpotQA is a top-level list, TriviaQA a dict with `Data`."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DistillError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        text = raw.removeprefix(b"\xef\xbb\xbf").decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DistillError(f"{path}:{line}: not UTF-8 text ({exc.reason} at byte {exc.start + 1})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DistillError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise DistillError(f"{path}: JSON nested too deeply to read") from None
    refuse_lone_surrogates(text, data, str(path))
    if isinstance(data, dict):
        data = next((data[key] for key in ("Data", "data") if isinstance(data.get(key), list)), None)
    if isinstance(data, list):
        return data
    raise DistillError(f"{path}: expected a JSON list of records or an object with a `Data` list")
