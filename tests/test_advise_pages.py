"""The advice as people read it: advice.md and a self-contained advice.html from one set of
blocks, the model named, the figure's axes the fitting points', the recommended point's
bubble split into parts that add up to it, and the compute fields rendered when present."""

from __future__ import annotations

import functools
import json
import re
from html import escape

import pytest

from harness.advise.bubble import explain
from harness.advise.figure import figure, frame
from harness.advise.page import count, model_title
from harness.advise.report import page_blocks, to_json, write
from harness.advise.search import GIB, Problem, Ranking, Space, search
from harness.config import set_keys
from harness.model.built import BuiltModel
from harness.report.doc import markdown
from tests.test_advise import _problem, cluster, config

SPACE = Space(schedules=("gpipe", "1f1b", "interleaved_1f1b"), pp=(2, 4), microbatch_sizes=(2, 8),
              virtual_stages=(2,), checkpointing=(False,), zero=(0,))


def _searched(memory_gib: float) -> tuple[Problem, Ranking]:
    """10 layers on 8 GPUs (stages of unequal layer counts), slow links (hops and all-reduces
    that show), `memory_gib` per GPU."""
    c = config(**{"model.layers": 10, "model.hidden": 256})
    cl = cluster(memory_per_gpu_gib=memory_gib, intra={"latency_s": 2e-4, "bandwidth_Bps": 1e9})
    p = _problem(c, cl, 64)
    return p, search(p, SPACE, workers=1)


@functools.cache
def searched() -> tuple[Problem, Ranking]:
    """The search with a budget that about half its points fit: the median point's peak."""
    _, everything = _searched(1000.0)
    peaks = sorted(x.memory.peak for x in everything.predictions)
    return _searched(peaks[len(peaks) // 2] / GIB)


def test_some_points_fit_and_some_do_not():
    _, r = searched()
    assert 0 < len(r.fitting) < len(r.predictions)


def test_advice_html_is_written_self_contained_and_says_what_advice_md_says(tmp_path):
    p, r = searched()
    paths = write(p, r, tmp_path, 3)
    assert set(paths) == {"json", "md", "html", "png"} and all(f.exists() for f in paths.values())
    html, md = paths["html"].read_text(), paths["md"].read_text()
    srcs = re.findall(r'\bsrc="([^"]*)"', html)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert not re.search(r"<link\b|<script\b|url\(|https?://", html)
    assert all(h.startswith("#") for h in re.findall(r'\bhref="([^"]*)"', html))
    # the same page: every heading and every table row's point in both
    for heading in re.findall(r"^#+ (.+)$", md, re.M):
        assert escape(heading) in html, heading
    for label in re.findall(r"^\| \d+ \| ([^|]+) \|", md, re.M):
        assert escape(label.strip()) in html
    assert "advice.png" in md and "Why the recommended point's bubble is" in md
    assert f"{len(r.predictions) - len(r.fitting):,} points over the" in md  # the figure's note, said under it


def test_the_model_is_named_in_the_page_the_figure_title_and_the_json(tmp_path):
    p, r = searched()
    title = model_title(p.config.model, p.model)
    assert title == f"MLP (model=mlp), 10 layers, {count(p.model.total_params)} parameters"
    assert count(10 * (256 * 256 + 256)) == "658K" and count(70_553_706_496) == "70.6B"
    paths = write(p, r, tmp_path, 3)
    assert paths["md"].read_text().startswith(f"# Advice: {title} (10 layers,")
    assert title in paths["html"].read_text()
    assert json.loads(paths["json"].read_text())["model"]["title"] == title


def test_a_hugging_face_model_is_named_by_its_family():
    c = set_keys(config(), **{"model.name": "hf", "model.arch": "llama", "model.layers": 2, "model.hidden": 32,
                              "model.heads": 2, "model.seq": 8, "model.vocab": 64})
    built = BuiltModel(c.model)
    params = count(built.total_params)
    assert model_title(c.model, built) == f"Llama (model=hf arch=llama), 2 blocks, {params} parameters"


def test_the_figure_is_scaled_to_the_points_that_fit(tmp_path):
    p, r = searched()
    drawn = figure(p, r, tmp_path / "advice.png", "t")
    assert drawn == frame(p, r)  # what the axes were drawn with is what frame() says
    k = p.tokens_per_sample or 1
    usable = p.cluster.usable_bytes / GIB
    fit_mem = [x.memory.peak / GIB for x in r.fitting]
    fit_tput = [x.throughput_samples_s * k for x in r.fitting]
    over = [x for x in r.predictions if not x.fits]
    (x0, x1), (y0, y1) = drawn.xlim, drawn.ylim
    # every fitting point and the budget line inside, with a margin no wider than 10% of the span
    assert x0 < min(fit_mem) and max(fit_mem) <= usable < x1 <= usable + 0.1 * (usable - min(fit_mem))
    assert y0 < min(fit_tput) and max(fit_tput) < y1 <= max(fit_tput) + 0.1 * (max(fit_tput) - min(fit_tput))
    # what does not fit is summed up, not drawn: the axes would otherwise reach its largest
    top = max(x.memory.peak for x in over) / GIB
    assert top > x1
    assert drawn.left_out == (f"{len(over):,} points over the {usable:.1f} GiB budget (up to {top:.1f} GiB) "
                              "not drawn")


def test_the_bubble_parts_add_up_to_each_points_bubble():
    """For every fitting point (equal and unequal stages, interleaved or not, dp 2 and 4):
    schedule ideal + uneven stages + hops + all-reduce is its predicted bubble exactly, the
    ideal is theory.py's, and each part the slow links and the 10 layers make is there."""
    p, r = searched()
    seen = set()
    for x in r.fitting:
        e = explain(p, x)
        assert e.bubble == x.bubble
        assert sum(q.bubble for q in e.parts) == pytest.approx(x.bubble, abs=1e-12)
        assert [q.name for q in e.parts] == ["schedule ideal", "uneven stages", "point-to-point hops", "dp all-reduce"]
        ideal, uneven, hops, sync = (q.bubble for q in e.parts)
        assert ideal == pytest.approx(e.theory, abs=1e-9)
        assert hops > 0 and sync > 0
        if len(set(x.layers_per_stage)) > 1:
            # it may idle less (1f1b pp=4 M=4 on 3,3,2,2 layers: heavy early stages fill sooner): not zero
            assert abs(uneven) > 1e-3 and f"{sum(x.layers_per_stage)} layers over" in e.parts[1].why
            seen.add("uneven" if uneven > 0 else "uneven, less idle")
        else:
            assert uneven == pytest.approx(0, abs=1e-9)
            seen.add("even")
    assert seen == {"uneven", "uneven, less idle", "even"}
    assert e.line().startswith(f"bubble {e.bubble:.1%} = ")


def test_the_page_explains_the_recommended_points_bubble(tmp_path):
    p, r = searched()
    write(p, r, tmp_path, 3)
    md = (tmp_path / "advice.md").read_text()
    e = explain(p, r.fitting[0])
    assert e.line() in md and all(q.why in md for q in e.parts)
    assert json.loads((tmp_path / "advice.json").read_text())["recommended_bubble"] == e.as_dict()


def test_compute_fields_are_rendered_when_present_and_tolerated_when_absent():
    p, r = searched()
    doc = to_json(p, r, 3)
    for d in doc["points"]:  # as a search that records no compute writes them
        for key in ("tflops_per_device", "mfu", "hfu"):
            d.pop(key, None)
    doc.pop("compute", None)
    plain = markdown(page_blocks(p, r, 3, doc))
    assert "TFLOP/s/GPU" not in plain and "MFU" not in plain and "## Compute" not in plain
    for i, d in enumerate(doc["points"]):
        d["tflops_per_device"], d["mfu"], d["hfu"] = 100.0 + i, 0.25, None
    doc["compute"] = {"source": "derived", "profile": "data/x.json", "note": "rates from GPT-2's blocks",
                      "efficiency": {"block": {"fwd": 0.41, "bwd": 0.38}}}
    md = markdown(page_blocks(p, r, 3, doc))
    head = next(line for line in md.splitlines() if line.startswith("| rank |"))
    assert "| TFLOP/s/GPU | MFU |" in head
    assert "| 100.0 | 25.0% |" in md  # the best point's
    assert "## Compute" in md and "**derived**" in md and "the fallback" in md and "--blocks 1" in md
    assert "rates from GPT-2's blocks" in md and "| block | 41.0% | 38.0% |" in md
    doc["compute"]["source"] = "measured"
    measured = markdown(page_blocks(p, r, 3, doc))
    assert "measured (profile `data/x.json`)" in measured and "the fallback" not in measured
