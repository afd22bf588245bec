"""The reference pages are written from the code (scripts/gen_reference.py): every config field has a description
to print, every error message is listed, and the committed pages are what the code says now."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts" / "gen_reference.py")
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)


@pytest.mark.parametrize("heading,cls,used", gen.config_classes(), ids=lambda v: getattr(v, "__name__", None))
def test_every_config_field_has_a_description(heading, cls, used):
    missing = [name for name, field in cls.model_fields.items() if not (field.description or "").strip()]
    assert not missing, f"{cls.__name__}: {missing} have no description (a string under the field)"


def test_every_strict_config_class_is_in_the_reference():
    """A new config class (a Strict model a user writes keys for) cannot be left out of the page."""
    import distill.pipeline  # noqa: F401  (imports every stage's config class)
    import distill.improve  # noqa: F401
    from distill.core.config import Strict

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    listed = {cls for _, cls, _ in gen.config_classes()}
    covered = listed | {sub for sub in subclasses(Strict) if any(issubclass(sub, c) for c in listed)}
    assert {c.__name__ for c in subclasses(Strict) if c.__module__.startswith("distill")} <= \
        {c.__name__ for c in covered}


@pytest.mark.parametrize("page", ["config", "cli", "errors"])
def test_the_committed_reference_is_current(page):
    path = gen.PAGES[page]
    assert path.read_text() == gen.render()[path], \
        f"{path.relative_to(ROOT)} is out of date: run python scripts/gen_reference.py"


def test_a_field_without_a_description_stops_the_generator():
    from pydantic import Field

    from distill.core.config import Strict

    class Bare(Strict):
        x: int = Field(default=1)

    gen_classes = gen.config_classes
    try:
        gen.config_classes = lambda: [("Bare", Bare, "a test")]
        with pytest.raises(SystemExit, match="Bare.x has no description"):
            gen.config_page()
    finally:
        gen.config_classes = gen_classes


def test_the_error_page_lists_a_message_as_it_reads():
    messages = [m for ms in gen.error_messages().values() for m in ms]
    assert "--set expects key=value, got <pair>" in messages
    assert any(m.startswith("<url>: the scheme must be http or https") for m in messages)
    assert "--set <dotted>: the value is too large for a setting" in messages
