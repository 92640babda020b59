"""The advice as report blocks (harness/report/doc.py), made once and rendered twice: advice.md
(doc.markdown) and advice.html (harness/report/html.py: one self-contained page, the figure
embedded), so the two say the same thing.

What the page says: the model by name, the recommended point, the figure (what is not drawn
on it, said under it), why the recommended point's bubble is what it is (bubble.py), the
compute the costs come from (advice.json's `compute`, when the search recorded one), the top
points, what came close, the commands, the assumptions and what the search left out. Point
fields another part of the search may or may not record (`tflops_per_device`, `mfu`) get
columns only when some point has them."""

from __future__ import annotations

from typing import Callable

from harness.config import ModelConfig
from harness.model.built import BuiltModel
from harness.report.doc import Block, Code, Heading, Image, Items, Table, Text

from .bubble import Explained
from .figure import Frame
from .problem import key_of
from .search import GIB, Prediction, Problem, Ranking

FAMILIES = {"gpt2": "GPT-2", "llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}  # model=hf's arch
KINDS = {"mlp": "MLP", "gpt": "GPT", "custom": "Custom model"}


def count(n: float) -> str:
    """70553706496 -> 70.6B, 124439808 -> 124M."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:g}"


def model_title(c: ModelConfig, model: BuiltModel) -> str:
    """`Llama (model=hf arch=llama), 80 blocks, 70.6B parameters`: the family where the config
    names one, the keys that chose it, its depth and its parameters (counted on the meta
    device, as the memory theory counts them)."""
    arch = getattr(c, "arch", None)
    target = getattr(c, "target", None)
    name = FAMILIES.get(arch, str(arch)) if c.name == "hf" and arch else KINDS.get(c.name, c.name)
    keys = f"model={c.name}" + (f" arch={arch}" if arch else "") + (f" target={target}" if target else "")
    # token models count their blocks (the embedding and head are layers of their own)
    depth = f"{c.layers} blocks" if hasattr(c, "seq") else f"{model.num_layers} layers"
    params = model.total_params
    return f"{name} ({keys}), {depth}" + (f", {count(params)} parameters" if params else "")


def _fmt_s(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def _best_per_schedule(fit: list[Prediction]) -> list[Prediction]:
    seen: dict[str, Prediction] = {}
    for x in fit:
        seen.setdefault(x.point.schedule, x)
    return sorted(seen.values(), key=lambda x: x.rank or 0)


def _has(points: list[dict], key: str) -> bool:
    return any(d.get(key) is not None for d in points)


def _pct(v: float | None) -> str | None:
    return None if v is None else f"{v:.1%}"


def _tflops(v: float | None) -> str | None:
    if v is None:
        return None
    return f"{v:.1f}" if v >= 1 else f"{v:.2g}"  # a toy model's too: 0.0012, not 0.0


class _Rows:
    """The point table's head and rows; the compute columns only where some point has them."""

    def __init__(self, p: Problem, r: Ranking, points: list[dict]):
        self.p, self.best = p, r.fitting[0]
        self.of = {id(x): d for x, d in zip(r.predictions, points)}  # a prediction's advice.json entry
        self.flops, self.mfu = _has(points, "tflops_per_device"), _has(points, "mfu")
        unit = "tokens/s" if p.tokens_per_sample else "samples/s"
        self.head = (["rank", "point", "step", unit, "of best", "peak GiB/GPU", "params / optimizer / activations GiB",
                      "bubble"] + ["TFLOP/s/GPU"] * self.flops + ["MFU"] * self.mfu + ["Pareto"])

    def row(self, x: Prediction) -> list[object]:
        m, k, d = x.memory, self.p.tokens_per_sample or 1, self.of.get(id(x), {})
        out: list[object] = [x.rank if x.rank else "-", x.point.label(), _fmt_s(x.step_time_s),
                             f"{x.throughput_samples_s * k:,.0f}",
                             f"{x.throughput_samples_s / self.best.throughput_samples_s:.1%}", f"{m.peak / GIB:.1f}",
                             f"{m.params / GIB:.1f} / {m.optimizer / GIB:.1f} / "
                             f"{(m.peak - m.params - m.grads - m.optimizer) / GIB:.1f}", f"{x.bubble:.3f}"]
        out += [_tflops(d.get("tflops_per_device"))] * self.flops + [_pct(d.get("mfu"))] * self.mfu
        return out + ["yes" if x.pareto else ""]

    def table(self, xs: list[Prediction]) -> Table:
        return Table(list(self.head), [self.row(x) for x in xs])


def _recommended(p: Problem, r: Ranking, best: dict) -> Text:
    x, k = r.fitting[0], p.tokens_per_sample or 1
    unit = "tokens/s" if p.tokens_per_sample else "samples/s"
    flops = best.get("tflops_per_device")
    mfu = best.get("mfu")
    compute = (f", {_tflops(flops)} TFLOP/s per GPU" if flops is not None else "") + (
        f" (MFU {mfu:.1%})" if mfu is not None else "")
    return Text(f"**Recommended:** `{x.point.label()}`: predicted step {_fmt_s(x.step_time_s)}, "
                f"{x.throughput_samples_s * k:,.0f} {unit}{compute}, {x.memory.peak / GIB:.1f} GiB on the fullest GPU "
                f"(of {p.cluster.usable_bytes / GIB:.1f} usable), bubble {x.bubble:.1%}.")


def bubble_blocks(e: Explained) -> list[Block]:
    said = (f" harness/planning/theory.py's bubble for the schedule on equal stages in these costs: {e.theory:.2%}."
            if e.theory is not None else "")
    return [Heading(f"Why the recommended point's bubble is {e.bubble:.1%}"), Text(e.line()),
            Items([f"**{q.bubble:.2%} {q.name}**: {q.why}" for q in e.parts]),
            Text("Each part is the simulator on a variant of the point's own priced costs, the step from one to the "
                 "next: equal stages on free links (the schedule alone), the point's stages on free links, with the "
                 "point-to-point messages, with the data-parallel all-reduce (the point itself); so the parts add "
                 "up to its bubble (mean over ranks of idle / step window)." + said)]


def profile_command(p: Problem, sizes: list[int]) -> str:
    """The one-block measurement that replaces derived compute costs: the model's keys on a GPU."""
    model = [o for o in p.overrides if key_of(o).split(".")[0] in ("model", "dtype")]
    return (f"python -m harness.profile {' '.join(model)} device=cuda --blocks 1 --microbatch-sizes "
            f"{' '.join(map(str, sizes))} --out profile.json")


def compute_blocks(p: Problem, r: Ranking, compute: dict | None, top: int) -> list[Block]:
    """advice.json's `compute`: where the compute costs come from; derived ones said as the fallback."""
    if not compute:
        return []
    source, profile = compute.get("source"), compute.get("profile")
    where = f" (profile `{profile}`)" if profile else ""
    out: list[Block] = [Heading("Compute")]
    if source == "derived":
        sizes = sorted({x.point.microbatch_size for x in r.fitting[:top]})
        out.append(Text(f"The compute costs are **derived**{where}, not measured: the fallback where no measurement "
                        "of this model on this device exists. To replace them by a one-block measurement, run on one "
                        f"GPU `{profile_command(p, sizes)}` and this advice again with `profile=profile.json`."
                        + (f" That measures tp=1; the recommended point's tp={compute['tp']} is priced on a TP rank's "
                           "profile (--tp-profiles), which harness.profile does not measure yet."
                           if compute.get("tp", 1) > 1 else "")))
    else:
        out.append(Text(f"The compute costs are {source or 'of unstated source'}{where}."))
    if note := compute.get("note"):
        out.append(Text(str(note)))
    eff = compute.get("efficiency") or {}
    if eff:
        out.append(Text(f"Each layer kind is priced at this share of the {compute.get('device')}'s dense peak "
                        f"(FLOPs / (seconds x peak), at B={compute.get('microbatch_size')}):"))
        out.append(Table(["layer kind", "forward", "backward"],
                         [[kind, f"{v['fwd']:.1%}", f"{v['bwd']:.1%}"] for kind, v in eff.items()]))
    elif why := compute.get("efficiency_note"):
        out.append(Text(str(why)))
    if fit := compute.get("fit"):
        out.append(Text(f"Large GEMMs approach {fit['sustained']:.0%} of peak: {fit['sustained_source']}."))
    if ops := compute.get("operations"):
        out.append(Text(f"A block priced per operation (harness/planning/op_costs.py), at B={ops[0]['microbatch_size']}; "
                        "\"derived\" marks a price that is not a measurement on this device:"))
        out.append(Table(["operation class", "forward", "backward", "priced at", "measured or derived", "source"],
                         [[o["class"], _fmt_s(o["fwd_s"]), _fmt_s(o["bwd_s"]), o["priced_at"],
                           "derived" if o["derived"] else "measured", o["source"]] for o in ops]))
    if conv := compute.get("flops_convention"):
        out.append(Text(f"MFU counts model FLOPs in the {conv} convention (Megatron-LM, PaLM appendix B, torchtitan): "
                        "causal attention's whole s^2 term, recompute excluded (HFU includes it)."))
    return out


def blocks(p: Problem, r: Ranking, top: int, doc: dict, figure: str | None, frame: Frame | None,
           explained: Explained | None, commands: Callable[[Prediction], dict[str, str]],
           assumptions: list[str]) -> list[Block]:
    """The advice page. `doc` is advice.json's content (its points in r.predictions' order)."""
    fit = r.fitting
    best = fit[0]
    rows = _Rows(p, r, doc["points"])
    c = p.config
    out: list[Block] = [
        Heading(f"Advice: {model_title(c.model, p.model)} ({p.num_layers} layers, {c.dtype}, {c.optimizer.name}) "
                f"on {p.cluster.name}, global batch {p.global_batch}", 1),
        _recommended(p, r, rows.of.get(id(best), {})),
        Text(f"Searched {len(r.predictions):,} points in {r.seconds:.1f} s "
             f"({len(r.predictions) / max(r.seconds, 1e-9):,.0f} points/s); {len(fit):,} fit."),
    ]
    if figure:
        out.append(Image(figure, "throughput against peak memory per GPU"))
        if frame is not None and frame.left_out:
            out.append(Text(f"The figure's axes are the fitting points'; {frame.left_out}."))
    if explained is not None:
        out += bubble_blocks(explained)
    out += compute_blocks(p, r, doc.get("compute"), top)
    out += [Heading(f"The top {min(top, len(fit))}"), rows.table(fit[:top])]
    close = [x for x in fit[top:] if x.throughput_samples_s >= 0.9 * best.throughput_samples_s][:5]
    out.append(Heading("What else came close"))
    if close:
        out += [Text("Within 10% of the best, beyond the top:"), rows.table(close)]
    out += [Text("The best point of each schedule:"), rows.table(_best_per_schedule(fit))]
    smallest = min(fit, key=lambda x: x.memory.peak)
    out.append(Text(f"The smallest fitting point: {smallest.point.label()} at {smallest.memory.peak / GIB:.1f} GiB, "
                    f"{smallest.throughput_samples_s / best.throughput_samples_s:.0%} of the best's throughput."))
    out += [Heading("Run them"),
            Text("Each point's `predicted` command is the same keys on the simulator: it prints the step and memory "
                 "above (python -m harness executor=sim is what the search ran on every point). To train a point "
                 "with torchtitan or Megatron-LM instead: `python -m harness.export --to torchtitan|megatron "
                 "advice.json#<rank>` writes that tool's arguments for it, and says what it cannot express.")]
    for x in fit[:top]:
        out.append(Heading(f"{x.rank}. {x.point.label()}", 3))
        for where, cmd in commands(x).items():
            out += [Text(f"{where}:"), Code(cmd)]
    out += [Heading("Assumptions"), Items(assumptions)]
    if r.dropped:
        out += [Heading("Left out of the search"),
                Items([f"{n} x {why} (e.g. {r.examples[why]})"
                       for why, n in sorted(r.dropped.items(), key=lambda kv: -kv[1])])]
    return out
