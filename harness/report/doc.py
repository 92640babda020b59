"""The report as a list of blocks, rendered to Markdown here and to HTML in html.py, so both
say the same thing. Text may hold `code` spans and **bold** spans."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Heading:
    text: str
    level: int = 2


@dataclass
class Text:
    text: str


@dataclass
class Image:
    path: str  # relative to the report directory
    alt: str


@dataclass
class Table:
    head: list[str]
    rows: list[list[object]]


@dataclass
class Items:
    items: list[str]


@dataclass
class Code:
    text: str  # shown as it is: a command to copy
    language: str = "bash"


Block = Heading | Text | Image | Table | Items | Code


def fmt(v: object) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def markdown(blocks: list[Block]) -> str:
    lines: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            lines += ["#" * b.level + " " + b.text, ""]
        elif isinstance(b, Text):
            lines += [b.text, ""]
        elif isinstance(b, Image):
            lines += [f"![{b.alt}]({b.path})", ""]
        elif isinstance(b, Items):
            lines += [f"- {i}" for i in b.items] + [""]
        elif isinstance(b, Code):
            lines += [f"```{b.language}", b.text, "```", ""]
        else:
            lines += ["| " + " | ".join(b.head) + " |", "|" + "---|" * len(b.head)]
            lines += ["| " + " | ".join(fmt(c).replace("|", "\\|") for c in row) + " |" for row in b.rows] + [""]
    return "\n".join(lines)
