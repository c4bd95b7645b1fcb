"""The pages generated when the site is built (mkdocs-gen-files runs this): every
configuration key from the pydantic config models (its type, default and description),
every command's arguments from its argparse parser, and the index of the decision records
from their files. Nothing here is written by hand, so no page can fall behind what it
lists."""

from __future__ import annotations

import html
import json
import os
import types
import typing
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import mkdocs_gen_files
from prometheus_client.core import Metric
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from ops.cli import command_parsers
from ops.exporter import DEFAULT_PORT, every_family
from streaming.builder_metrics import SNAPSHOT_SECONDS, builder_metrics, example_snapshot
from streamrec.config import PipelineConfig, load_config
from streamrec.metric_families import Families


def _type_name(annotation: Any) -> str:
    """An annotation as a reader writes it in YAML terms: ``int``, ``"a" | "b"``, ..."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is not None:
        inner = ", ".join(_type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    """The config models an annotation holds (a section, a list of them, optional ones)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _models_in(arg)


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    factory = field.default_factory
    value = factory() if factory is not None else field.default  # type: ignore[call-arg]
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        return "(its keys below)"
    return f"`{json.dumps(_plain(value))}`"


def _plain(value: Any) -> Any:
    """A default as YAML would spell it: a model as its keys that differ from theirs."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, Path):
        return str(value)
    return value


def _cell(text: str) -> str:
    """``text`` as one table cell, shown as written (``<name>`` is no HTML tag)."""
    return html.escape(" ".join(text.split()), quote=False).replace("|", "\\|")


def _config_rows(model: type[BaseModel], prefix: str, seen: set[type]) -> Iterator[str]:
    """One table row per key of ``model`` and of the sections it holds, depth first."""
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        kind = _type_name(field.annotation)
        about = field.description or ""
        yield f"| `{key}` | `{_cell(kind)}` | {_default(field)} | {_cell(about)} |"
        for sub in _models_in(field.annotation):
            if sub not in seen:
                item = "[]" if typing.get_origin(field.annotation) in (list, tuple) else ""
                nested.append((f"{key}{item}.", sub))
    for sub_prefix, sub in nested:
        yield from _config_rows(sub, sub_prefix, seen | {sub})


def config_reference() -> str:
    """The configuration reference: a table per top-level section of ``PipelineConfig``."""
    lines = [
        "# Configuration reference",
        "",
        "Every key of a pipeline YAML, generated from the pydantic models that load it",
        "(`streamrec/config/`). A config is checked when it is loaded: a wrong key or value",
        "stops every command with exit 2, naming the key and the fix.",
        "",
    ]
    top: list[str] = []
    for name, field in PipelineConfig.model_fields.items():
        key = field.alias or name
        sections = list(_models_in(field.annotation))
        if not sections:
            top.append(
                f"| `{key}` | `{_cell(_type_name(field.annotation))}` | {_default(field)} "
                f"| {_cell(field.description or '')} |"
            )
            continue
        lines += [f"## `{key}`", "", _cell(field.description or ""), ""]
        lines += ["| key | type | default | description |", "| --- | --- | --- | --- |"]
        for section in sections:
            lines += _config_rows(section, f"{key}.", {section})
        lines.append("")
    lines += ["## Top-level keys", "", "| key | type | default | description |"]
    lines += ["| --- | --- | --- | --- |", *top, ""]
    return "\n".join(lines)


def cli_reference() -> str:
    """The CLI reference: every command's help, as its parser prints it."""
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: the same page anywhere
    lines = [
        "# CLI reference",
        "",
        "Every `streamrec` command's arguments, generated from its parser. Exit codes: 0",
        "ok; 1 failed; 2 bad configuration or arguments; 3 a service (Kafka, Redis, the",
        "cluster) cannot be reached; 4 data breaks its contract; 5 `status`: a complete pass",
        "is left untrained; 130 stopped by Ctrl-C or SIGTERM.",
        "",
    ]
    for name, parser in command_parsers().items():
        title = name if name == "streamrec" else f"streamrec {name}"
        lines += [f"## `{title}`", "", "```text", parser.format_help().rstrip(), "```", ""]
    return "\n".join(lines)


def _metric_rows(families: Iterable[Metric]) -> list[str]:
    """A table row per family: its series name (a counter's with ``_total``), its labels
    besides ``pipeline``, its help."""
    lines = ["| metric | labels | what it is |", "| --- | --- | --- |"]
    for family in sorted(families, key=lambda f: f.name):
        name = f"{family.name}_total" if family.type == "counter" else family.name
        labels = sorted({k for s in family.samples for k in s.labels} - {"pipeline"})
        shown = ", ".join(f"`{k}`" for k in labels)
        lines.append(f"| `{name}` | {shown} | {_cell(family.documentation)} |")
    return lines


def metrics_reference() -> str:
    """Every series ``streamrec exporter`` and the pass builder serve, with their labels and
    help, as their own mappings write them where every figure is known."""
    shipped = load_config(Path(__file__).parents[1] / "configs" / "pipeline.yaml")
    builder = Families("example")
    builder_metrics(builder, example_snapshot())
    lines = [
        "# Metrics reference",
        "",
        "Every series carries the pipeline's name as `pipeline`. `streamrec serve` serves its",
        "own on its port (`/metrics`).",
        "",
        "## `streamrec exporter`",
        "",
        f"`streamrec exporter --config C` serves these on `/metrics` (port {DEFAULT_PORT} by",
        "default), read from the pipeline's Redis and pass manifests at each scrape, as",
        "`streamrec status` reads them.",
        "",
        *_metric_rows(every_family(shipped)),
        "",
        "## `streamrec build-passes`",
        "",
        "`streamrec build-passes --config C --metrics-port P` serves these on `/metrics`: what",
        "only the process reading Kafka knows, per partition it owns, refreshed by its polling",
        f"loop every {SNAPSHOT_SECONDS:g} s.",
        "",
        *_metric_rows(builder),
    ]
    return "\n".join(lines) + "\n"


def decisions_index(folder: Path) -> str:
    """The decision records in ``folder`` (``NNNN-slug.md``), newest last: each one's number,
    title (its first heading) and where it comes from (its first italic line)."""
    lines = [
        "# Decisions",
        "",
        "One record per decision made while building streamrec: its context, the decision,",
        "its consequences and what was measured. The architecture as built is in",
        "[Architecture](../ARCHITECTURE.md); these say why it is so.",
        "",
        "| # | decision | from |",
        "| --- | --- | --- |",
    ]
    for record in sorted(folder.glob("[0-9][0-9][0-9][0-9]-*.md")):
        text = record.read_text().splitlines()
        title = next(line[2:] for line in text if line.startswith("# "))
        source = next((line.strip("*") for line in text if line.startswith("*")), "")
        number = record.name[:4]
        lines.append(f"| {number} | [{_cell(title)}]({record.name}) | {_cell(source)} |")
    return "\n".join(lines) + "\n"


with mkdocs_gen_files.open("decisions/index.md", "w") as page:
    page.write(decisions_index(Path(__file__).parent / "decisions"))
with mkdocs_gen_files.open("reference/config.md", "w") as page:
    page.write(config_reference())
with mkdocs_gen_files.open("reference/metrics.md", "w") as page:
    page.write(metrics_reference())
with mkdocs_gen_files.open("reference/cli.md", "w") as page:
    page.write(cli_reference())
